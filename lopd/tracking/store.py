"""The MLflow store side of :mod:`lopd.tracking`: the experiment, its parent run, retries on SQLite
lock contention, and fork safety (see the package docstring)."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lopd.compat import mlflow as mlflow_compat
from lopd.errors import BadInput
from lopd.tracking import names

if TYPE_CHECKING:
    from lopd.config import Params


os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# one background writer per process: batches land in order and do not contend with each other for SQLite
os.environ.setdefault("MLFLOW_ASYNC_LOGGING_THREADPOOL_SIZE", "1")
# every background write's outcome is checked (and retried or reported) by Tracker itself
logging.getLogger(mlflow_compat.ASYNC_QUEUE_LOGGER).setLevel(logging.CRITICAL)

EXPERIMENT_KEY_TAG = "lopd.experiment_key"
_COMMIT: dict[str, str] = {}  # cwd -> commit (cleared in a forked child)
EXPERIMENT_IDS: dict[tuple[str, str], str] = {}  # (uri, experiment name) -> id
PARENTS: dict[tuple[str, str, str], str] = {}  # (uri, experiment name, key) -> parent run id
_USED_URIS: set[str] = set()  # stores this process opened (quiesced before a fork)
HOST_TAG, PID_TAG = "lopd.host", "lopd.pid"


def git_commit() -> str:
    cwd = os.getcwd()
    if cwd not in _COMMIT:
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5).stdout
        except Exception:  # noqa: BLE001 - provenance only
            out = ""
        _COMMIT[cwd] = out.strip() or "unknown"
    return _COMMIT[cwd]


def experiment_key(params: Params) -> str:
    """``<hash of every params section but tracking>-<git commit, 12 hex>``: what results depend on."""
    sections = [n for n in type(params).model_fields if n != "tracking"]
    return f"{params.section_hash(*sections)}-{git_commit()[:12]}"


def _before_fork() -> None:
    """Fork with no MLflow writer thread running and no pooled SQLite connection open (SQLite must
    not carry a connection across fork; a thread inside SQLite at fork time deadlocks the child)."""
    if not _USED_URIS or "mlflow" not in sys.modules:
        return
    for uri in _USED_URIS:
        mlflow_compat.quiesce(uri)


def _after_fork_in_child() -> None:
    # the store object stays (its queue idle, its pool empty, its compiled queries cached): a forked
    # stage skips re-opening it; the commit is read again (a worker may outlive a commit)
    _COMMIT.clear()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def preload(params: Params) -> None:
    """Import MLflow's store code, open the store and find (or create) the experiment's parent run,
    in this process: for a worker that forks one process per stage, so that each stage skips that
    start-up (``bench/mlflow_overhead.py`` measures it).

    Safe to fork afterwards (see ``_before_fork``). A store that cannot be reached is left to the
    stages' own trackers, which report it under ``tracking.on_failure``.
    """
    import importlib

    importlib.import_module(mlflow_compat.SQL_STORE_MODULE)  # the slow import, once

    try:
        experiment_parent_id(params)
    except Exception:  # noqa: BLE001 - reported by each stage's Tracker (warn or fail)
        pass


def lock_contention(e: BaseException) -> bool:
    return "locked" in str(e).lower()


def retry(fn, *args, budget_s: float = 60.0, **kw):
    """Call ``fn``, retrying SQLite lock contention (concurrent writers) with jittered back-off.

    SQLite answers "database is locked" at once, without waiting, when two transactions would
    deadlock; MLflow does not retry that on SQLite.
    """
    deadline, delay = time.monotonic() + budget_s, 0.05
    while True:
        try:
            return fn(*args, **kw)
        except Exception as e:  # noqa: BLE001
            if not lock_contention(e) or time.monotonic() > deadline:
                raise
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 1.0)


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


@contextmanager
def _creation_lock(uri: str):
    """An exclusive file lock serialising experiment/parent creation among this host's processes: waits
    as long as another holds it. ``<db>.lock`` beside a SQLite store (git-ignored), else one in the
    temporary directory per URI."""
    from filelock import FileLock

    db = _sqlite_path(uri)
    path = db.with_name(db.name + ".lock") if db else \
        Path(tempfile.gettempdir()) / f"lopd-mlflow-{hashlib.sha256(uri.encode()).hexdigest()[:12]}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path):
        yield


def open_client(uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)  # opens the store
    _USED_URIS.add(uri)
    return client


def experiment_id(client, uri: str, name: str) -> str:
    """The experiment's id, creating it (artifacts in ``mlartifacts/`` beside a SQLite db). It is tagged
    a model-training experiment for MLflow's UI (whose 3.x default is the GenAI kind)."""
    kind_tag, kind = mlflow_compat.EXPERIMENT_KIND_TAG, mlflow_compat.TRAINING_EXPERIMENT_KIND
    if (uri, name) not in EXPERIMENT_IDS:
        exp = retry(client.get_experiment_by_name, name)
        if exp is None:
            with _creation_lock(uri):  # two first stages must not both create it
                exp = retry(client.get_experiment_by_name, name)
                if exp is None:
                    db = _sqlite_path(uri)
                    where = (db.resolve().parent / "mlartifacts" / name).as_uri() if db else None
                    exp = retry(client.get_experiment, retry(client.create_experiment, name, artifact_location=where,
                                                               tags={kind_tag: kind}))
        if kind_tag not in exp.tags:  # an experiment created before lopd set it
            retry(client.set_experiment_tag, exp.experiment_id, kind_tag, kind)
        EXPERIMENT_IDS[(uri, name)] = exp.experiment_id
    return EXPERIMENT_IDS[(uri, name)]


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def experiment_parent_id(params: Params, client=None) -> str:
    """The run id of this experiment's parent run, created (with the params as run params) if absent.

    Look-up and creation happen under :func:`_creation_lock`, so two processes starting the same
    experiment at once find one parent. Should the store hold several (e.g. written from two hosts
    through a server), the earliest (start time, then run id) is the parent, for every caller.
    """
    tp, key = params.tracking, experiment_key(params)
    if (tp.uri, tp.experiment, key) not in PARENTS:
        client = client or open_client(tp.uri)
        exp_id = experiment_id(client, tp.uri, tp.experiment)
        with _creation_lock(tp.uri):
            found = retry(client.search_runs, [exp_id], filter_string=f"tags.`{EXPERIMENT_KEY_TAG}` = '{key}'")
            if found:
                run_id = min(found, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
            else:
                run_id = _create_parent(client, exp_id, params, key)
        PARENTS[(tp.uri, tp.experiment, key)] = run_id
    return PARENTS[(tp.uri, tp.experiment, key)]


def provenance_tags() -> dict[str, str]:
    """The git commit and the DVC experiment (name, revision) of this process: on every run."""
    return {"git_commit": git_commit(), **names.dvc_experiment(git_commit())}


# the run's description in the MLflow UI: why it may still be RUNNING, and what closes it
PARENT_NOTE = ("The report stage closes this run (FINISHED, the report attached). When DVC skips that stage "
               "because nothing it reads changed, `lopd repro` (`make repro`) closes it after the repro; a bare "
               "`dvc repro` leaves it RUNNING until `lopd repro` runs.")


def _create_parent(client, exp_id: str, params: Params, key: str) -> str:
    """The experiment parent, named after the DVC experiment and commit that created it, with the
    whole params as run params (``MlflowClient.log_batch`` splits them into batches MLflow accepts)."""
    from mlflow.entities import Param

    tags = {EXPERIMENT_KEY_TAG: key, "stage": "experiment", "params_hash": key.split("-")[0], **provenance_tags(),
            "mlflow.note.content": PARENT_NOTE}
    name = names.parent_run(tags[names.DVC_EXP_TAG], git_commit(), tags["params_hash"])
    run_id = retry(client.create_run, exp_id, run_name=name, tags=tags).info.run_id
    cut = mlflow_compat.max_param_length()
    flat = [Param(k, str(v)[:cut]) for k, v in _flat(params.model_dump()).items()]
    retry(client.log_batch, run_id, params=flat, synchronous=True)
    return run_id


def end_run(uri: str, run_id: str, status: str) -> None:
    """Set a run's status and end time (:func:`lopd.compat.mlflow.end_run`: the caller has already
    waited for its own writes, and the process's async-logging queue stays up)."""
    retry(mlflow_compat.end_run, uri, run_id, status)


def error_message(e: BaseException) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def handle_failure(tp, msg: str, first: bool) -> None:
    if tp.on_failure == "fail":
        raise BadInput(f"MLflow tracking at {tp.uri!r} failed ({msg}); set tracking.on_failure: warn to run without it")
    if first:
        print(f"WARNING: MLflow tracking at {tp.uri!r} failed ({msg}); results are still written to files",
              file=sys.stderr)


