"""Every read of an MLflow internal (a private module, a store's attribute), in one place.

:mod:`lopd.tracking` goes through :class:`mlflow.MlflowClient` for everything the public API offers,
and through this module for the three things it does not:

* the process-wide store object of a tracking URI (to quiesce it before a fork, and to end a run
  without :meth:`MlflowClient.set_terminated`, which also shuts down the whole async-logging queue);
* the longest parameter value a store accepts;
* the experiment tag that marks an experiment as model training for MLflow's UI;
* the names of the modules whose import or logging lopd manages.

:data:`INTERNALS` lists each internal with the MLflow version it was last checked against;
``tests/unit/test_compat_mlflow.py`` fails with the name of whichever has moved.
"""

from __future__ import annotations

import time

CHECKED_VERSION = "3.17.2"
STORE_REGISTRY = "mlflow.tracking._tracking_service.utils"  # module with _get_store(uri)
SQL_STORE_MODULE = "mlflow.store.tracking.sqlalchemy_store"  # the slow import a warm worker preloads
ASYNC_QUEUE_LOGGER = "mlflow.utils.async_logging.async_logging_queue"
VALIDATION_MODULE = "mlflow.utils.validation"  # holds MAX_PARAM_VAL_LENGTH
# the experiment tag by which MLflow's UI (3.x) tells a model-training experiment from a GenAI one
# (values as in the UI's bundle, 3.17)
EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"

# (module, attribute) pairs read below; an attribute of a store instance is checked on a SQLite store
INTERNALS = [(STORE_REGISTRY, "_get_store"), (VALIDATION_MODULE, "MAX_PARAM_VAL_LENGTH"),
             (SQL_STORE_MODULE, "SqlAlchemyStore"), (ASYNC_QUEUE_LOGGER, "AsyncLoggingQueue")]
STORE_METHODS = ["update_run_info", "shut_down_async_logging", "engine"]


def store(uri: str):
    """The store object MLflow caches for ``uri`` (the one every ``MlflowClient(uri)`` shares)."""
    from mlflow.tracking._tracking_service.utils import _get_store

    return _get_store(uri)


def max_param_length() -> int:
    """The longest parameter value MLflow stores (longer ones are refused, so callers cut them)."""
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    return MAX_PARAM_VAL_LENGTH


def quiesce(uri: str) -> None:
    """Drain and stop the store's async-logging threads and close its pooled SQLite connections
    (before a fork: SQLite connections must not cross it; the queue restarts on next use)."""
    s = store(uri)
    s.shut_down_async_logging()
    if getattr(s, "engine", None) is not None:  # a SQL store; a REST store has no pool
        s.engine.dispose()


def end_run(uri: str, run_id: str, status: str) -> None:
    """Set a run's status and end time through the store: unlike ``MlflowClient.set_terminated``,
    it leaves the process's async-logging queue running (shutting it down costs up to 1 s per run)."""
    from mlflow.entities import RunStatus

    store(uri).update_run_info(run_id, run_status=RunStatus.from_string(status),
                               end_time=int(time.time() * 1000), run_name=None)


def missing_internals() -> list[str]:
    """The internals above that this MLflow no longer has, as ``module.attribute`` (empty if all are
    there). Opens a throw-away SQLite store to check a store's methods."""
    import importlib
    import tempfile

    missing = []
    for module, attr in INTERNALS:
        try:
            if not hasattr(importlib.import_module(module), attr):
                missing.append(f"{module}.{attr}")
        except ImportError:
            missing.append(f"{module} (module)")
    if not missing:
        with tempfile.TemporaryDirectory() as d:
            s = store(f"sqlite:///{d}/probe.db")
            missing += [f"{type(s).__name__}.{m}" for m in STORE_METHODS if not hasattr(s, m)]
            s.engine.dispose()
    return missing
