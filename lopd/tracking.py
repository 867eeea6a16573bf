"""MLflow tracking: one run tree per pipeline experiment, never holding a run's files hostage.

Every stage writes its results as files first (``result.json``, ``history.csv``); MLflow mirrors
them for browsing, through :class:`mlflow.MlflowClient`, in the experiment ``tracking.experiment``::

    experiment-<params hash>-<commit>   tag lopd.experiment_key; the whole params as run params;
    │                                   artifacts: reports/*.md, reports/figures/*.png, metrics.json
    ├── base, cold_start, probe, <arm>-<seed> (final runs), sensitivity runs, eval-<arm>-<seed>
    └── hpo (or hpo-worker)
        └── trial runs

The experiment parent is identified by :func:`experiment_key` (the hash of every params section
but ``tracking`` + the git commit). The first :class:`Tracker` of an experiment creates it; a file
lock (next to the SQLite db, or in the temp directory for other URIs: same host only) makes the
look-up-or-create atomic, so concurrent stages end with one parent. Every run without an explicit
parent is nested under it (tag ``mlflow.parentRunId``). :func:`log_report_artifacts` attaches the
report to it and marks it FINISHED.

Metrics are buffered and sent with ``log_batch`` (one store write per flush, not per value);
with ``tracking.async_logging`` MLflow's own background queue writes them (``synchronous=False``)
and their outcome is collected at the next flush and at :meth:`Tracker.end`.

A worker that forks one process per stage calls :func:`preload` once: the children then skip
importing MLflow's store code, opening the store and finding the parent. Forking is safe at any
time: before a fork this process's MLflow writer threads are drained and stopped and its pooled
SQLite connections closed (SQLite connections must not cross a fork).

If the tracking URI is unreachable: with ``tracking.on_failure: warn`` (default) the run goes on,
prints one clear warning and records ``"tracking": "failed: <cause>"`` in its ``result.json``;
with ``fail`` the stage stops with exit status 2 (``BadInput``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lopd.errors import BadInput

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# one background writer per process: batches land in order and do not contend with each other for SQLite
os.environ.setdefault("MLFLOW_ASYNC_LOGGING_THREADPOOL_SIZE", "1")
# every background write's outcome is checked (and retried or reported) by Tracker itself
logging.getLogger("mlflow.utils.async_logging.async_logging_queue").setLevel(logging.CRITICAL)

EXPERIMENT_KEY_TAG = "lopd.experiment_key"
_COMMIT: dict[str, str] = {}  # cwd -> commit (cleared in a forked child)
_EXPERIMENT_IDS: dict[tuple[str, str], str] = {}  # (uri, experiment name) -> id
_PARENTS: dict[tuple[str, str, str], str] = {}  # (uri, experiment name, key) -> parent run id
_USED_URIS: set[str] = set()  # stores this process opened (quiesced before a fork)
HOST_TAG, PID_TAG = "lopd.host", "lopd.pid"
_SWEPT: set[tuple[int, str, str]] = set()  # (pid, uri, experiment id) already swept for stale runs


def git_commit() -> str:
    cwd = os.getcwd()
    if cwd not in _COMMIT:
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5).stdout
        except Exception:  # noqa: BLE001 - provenance only
            out = ""
        _COMMIT[cwd] = out.strip() or "unknown"
    return _COMMIT[cwd]


def experiment_key(params) -> str:
    """``<hash of every params section but tracking>-<git commit, 12 hex>``: what results depend on."""
    sections = [n for n in type(params).model_fields if n != "tracking"]
    return f"{params.section_hash(*sections)}-{git_commit()[:12]}"


def _before_fork() -> None:
    """Fork with no MLflow writer thread running and no pooled SQLite connection open (SQLite must
    not carry a connection across fork; a thread inside SQLite at fork time deadlocks the child)."""
    if not _USED_URIS or "mlflow" not in sys.modules:
        return
    from mlflow.tracking._tracking_service.utils import _get_store

    for uri in _USED_URIS:
        store = _get_store(uri)
        store.shut_down_async_logging()  # drains the queue and joins its threads; restarts on next use
        if getattr(store, "engine", None) is not None:
            store.engine.dispose()


def _after_fork_in_child() -> None:
    # the store object stays (its queue idle, its pool empty, its compiled queries cached): a forked
    # stage skips re-opening it; the commit is read again (a worker may outlive a commit)
    _COMMIT.clear()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def preload(params) -> None:
    """Import MLflow's store code, open the store and find (or create) the experiment's parent run,
    in this process: for a worker that forks one process per stage, so that each stage skips that
    start-up (``bench/mlflow_overhead.py`` measures it).

    Safe to fork afterwards (see ``_before_fork``). A store that cannot be reached is left to the
    stages' own trackers, which report it under ``tracking.on_failure``.
    """
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - the slow import, once

    try:
        experiment_parent_id(params)
    except Exception:  # noqa: BLE001 - reported by each stage's Tracker (warn or fail)
        pass


def _lock_contention(e: BaseException) -> bool:
    return "locked" in str(e).lower()


def _retry(fn, *args, budget_s: float = 60.0, **kw):
    """Call ``fn``, retrying SQLite lock contention (concurrent writers) with jittered back-off.

    SQLite answers "database is locked" at once, without waiting, when two transactions would
    deadlock; MLflow does not retry that on SQLite.
    """
    deadline, delay = time.monotonic() + budget_s, 0.05
    while True:
        try:
            return fn(*args, **kw)
        except Exception as e:  # noqa: BLE001
            if not _lock_contention(e) or time.monotonic() > deadline:
                raise
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 1.0)


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


@contextmanager
def _creation_lock(uri: str):
    """An exclusive file lock serialising experiment/parent creation among this host's processes."""
    db = _sqlite_path(uri)
    path = db.with_name(db.name + ".lock") if db else \
        Path(tempfile.gettempdir()) / f"lopd-mlflow-{hashlib.sha256(uri.encode()).hexdigest()[:12]}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _client(uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)  # opens the store
    _USED_URIS.add(uri)
    return client


def _experiment_id(client, uri: str, name: str) -> str:
    """The experiment's id, creating it (artifacts in ``mlartifacts/`` beside a SQLite db)."""
    if (uri, name) not in _EXPERIMENT_IDS:
        exp = _retry(client.get_experiment_by_name, name)
        if exp is None:
            with _creation_lock(uri):  # two first stages must not both create it
                exp = _retry(client.get_experiment_by_name, name)
                if exp is None:
                    db = _sqlite_path(uri)
                    where = (db.resolve().parent / "mlartifacts" / name).as_uri() if db else None
                    exp = _retry(client.get_experiment, _retry(client.create_experiment, name, artifact_location=where))
        _EXPERIMENT_IDS[(uri, name)] = exp.experiment_id
    return _EXPERIMENT_IDS[(uri, name)]


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def experiment_parent_id(params, client=None) -> str:
    """The run id of this experiment's parent run, created (with the params as run params) if absent.

    Look-up and creation happen under :func:`_creation_lock`, so two processes starting the same
    experiment at once find one parent. Should the store hold several (e.g. written from two hosts
    through a server), the earliest (start time, then run id) is the parent, for every caller.
    """
    from mlflow.entities import Param
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    tp, key = params.tracking, experiment_key(params)
    if (tp.uri, tp.experiment, key) not in _PARENTS:
        client = client or _client(tp.uri)
        exp_id = _experiment_id(client, tp.uri, tp.experiment)
        with _creation_lock(tp.uri):
            found = _retry(client.search_runs, [exp_id], filter_string=f"tags.`{EXPERIMENT_KEY_TAG}` = '{key}'")
            if found:
                run_id = min(found, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
            else:
                tags = {EXPERIMENT_KEY_TAG: key, "stage": "experiment", "git_commit": git_commit(),
                        "params_hash": key.split("-")[0]}
                run_id = _retry(client.create_run, exp_id, run_name=f"experiment-{key}", tags=tags).info.run_id
                flat = [Param(k, str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in _flat(params.model_dump()).items()]
                for i in range(0, len(flat), 100):  # MLflow's limit per log_batch
                    _retry(client.log_batch, run_id, params=flat[i:i + 100], synchronous=True)
        _PARENTS[(tp.uri, tp.experiment, key)] = run_id
    return _PARENTS[(tp.uri, tp.experiment, key)]


def _end_run(uri: str, run_id: str, status: str) -> None:
    """Set a run's status and end time. Not ``MlflowClient.set_terminated``: that also shuts down the
    process's whole async-logging queue, whose thread join costs up to 1 s per run (measured); the
    caller has already waited for its own writes."""
    from mlflow.entities import RunStatus
    from mlflow.tracking._tracking_service.utils import _get_store

    _retry(_get_store(uri).update_run_info, run_id, run_status=RunStatus.from_string(status),
           end_time=int(time.time() * 1000), run_name=None)


def _message(e: BaseException) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def _handle_failure(tp, msg: str, first: bool) -> None:
    if tp.on_failure == "fail":
        raise BadInput(f"MLflow tracking at {tp.uri!r} failed ({msg}); set tracking.on_failure: warn to run without it")
    if first:
        print(f"WARNING: MLflow tracking at {tp.uri!r} failed ({msg}); results are still written to files",
              file=sys.stderr)


class Tracker:
    """One MLflow run, nested under ``parent_run_id`` or else under the experiment parent.

    ``params`` is the whole validated :class:`lopd.config.Params` (``params.tracking`` says where
    and how; the other sections identify the experiment).
    """

    def __init__(self, params, run_name: str, tags: dict[str, Any], parent_run_id: str | None = None,
                 flush_every: int = 50, enabled: bool = True):
        self.tp = params.tracking
        self.run_id: str | None = None
        self.error: str | None = None
        self.flush_every = flush_every
        self._buf: list = []
        self._pending: list = []  # async log_batch operations not yet checked
        if not enabled:
            self.error = "disabled (not rank 0)"
            return
        try:
            self.client = _client(self.tp.uri)
            exp_id = _experiment_id(self.client, self.tp.uri, self.tp.experiment)
            parent = parent_run_id or experiment_parent_id(params, self.client)
            sweep_dead_runs(self.client, self.tp.uri, exp_id)
            all_tags = {"git_commit": git_commit(), **{k: str(v) for k, v in tags.items()},
                        "mlflow.parentRunId": parent, HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
            self.run_id = _retry(self.client.create_run, exp_id, run_name=run_name, tags=all_tags).info.run_id
        except Exception as e:  # noqa: BLE001 - any tracking failure is reported, never hidden
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        msg = _message(e)
        _handle_failure(self.tp, msg, first=self.error is None)
        self.error = msg
        self.run_id = None

    @property
    def ok(self) -> bool:
        return self.run_id is not None

    @property
    def status(self) -> str:
        return "ok" if self.ok else f"failed: {self.error}"

    def _log_batch(self, metrics=(), params=()) -> None:
        """One ``log_batch``. An asynchronous one is checked at the next call (done by then) and
        at :meth:`end`; one that met SQLite lock contention is sent again, synchronously."""
        self._check_pending()
        if self.tp.async_logging:
            op = self.client.log_batch(self.run_id, metrics=metrics, params=params, synchronous=False)
            self._pending.append((op, metrics, params))
        else:
            _retry(self.client.log_batch, self.run_id, metrics=metrics, params=params, synchronous=True)

    def _check_pending(self) -> None:
        pending, self._pending = self._pending, []
        for op, metrics, params in pending:
            try:
                op.wait()  # re-raises the background write's exception
            except Exception as e:  # noqa: BLE001
                if not _lock_contention(e):
                    raise
                # rolled back whole; MLflow skips rows it already holds, so sending again is safe
                _retry(self.client.log_batch, self.run_id, metrics=metrics, params=params, synchronous=True)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        if not self.ok:
            return
        items = [Param(k, str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in params.items()]
        try:
            for i in range(0, len(items), 100):
                self._log_batch(params=items[i:i + 100])
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Buffer one step's metrics (NaN and None are skipped: they would poison MLflow's charts;
        the files keep them); sent every ``flush_every`` values and at :meth:`flush`."""
        if not self.ok:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            if v is None or float(v) != float(v):
                continue
            self._buf.append(Metric(k, float(v), ts, int(step)))
        if len(self._buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        buf, self._buf = self._buf, []
        if not self.ok or not buf:
            return
        try:
            for i in range(0, len(buf), 900):  # under MLflow's 1000 metrics per log_batch
                self._log_batch(metrics=buf[i:i + 900])
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def _guarded(self, call) -> None:
        if self.ok:
            try:
                _retry(call)
            except Exception as e:  # noqa: BLE001
                self._fail(e)

    def set_tag(self, key: str, value: Any) -> None:
        self._guarded(lambda: self.client.set_tag(self.run_id, key, str(value)))

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self._guarded(lambda: self.client.log_artifact(self.run_id, str(path), artifact_path))

    def end(self, status: str = "FINISHED") -> None:
        """Flush, wait for every asynchronous write (reporting its failure), and end the run."""
        self.flush()
        if self.ok:
            try:
                self._check_pending()
                _end_run(self.tp.uri, self.run_id, status)
            except Exception as e:  # noqa: BLE001
                self._fail(e)


def log_report_artifacts(params, paths, root: str | Path | None = None) -> str:
    """Attach the report files to the experiment parent and mark it FINISHED (the report is the last stage).

    A path keeps its directory inside the run's artifacts (``reports/figures/x.png``): relative to
    ``root`` if given, else as written (an absolute path without ``root`` lands at the top).
    Returns ``"ok"`` or ``"failed: <cause>"`` (``tracking.on_failure: fail`` raises ``BadInput``).
    """
    tp = params.tracking
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise BadInput(f"report artifacts missing: {', '.join(missing)}")
    try:
        client = _client(tp.uri)
        parent = experiment_parent_id(params, client)
        # the last stage: no run of a killed earlier attempt may stay RUNNING under a finished parent
        sweep_dead_runs(client, tp.uri, _experiment_id(client, tp.uri, tp.experiment))
        for p in map(Path, paths):
            rel = p.relative_to(root) if root is not None else p
            where = str(rel.parent) if not rel.is_absolute() and str(rel.parent) != "." else None
            _retry(client.log_artifact, parent, str(p), where)
        _end_run(tp.uri, parent, "FINISHED")
    except Exception as e:  # noqa: BLE001 - reported, never hidden
        msg = _message(e)
        _handle_failure(tp, msg, first=True)
        return f"failed: {msg}"
    return "ok"


def sweep_dead_runs(client, uri: str, exp_id: str) -> list[str]:
    """Mark KILLED every RUNNING run of experiment ``exp_id`` that this host started from a process
    that no longer exists (a stage killed before it could end its run); once per process and store.
    Runs of other hosts are left alone (their liveness cannot be judged from here), and so are runs
    of live processes (a concurrent stage); a pid reused by a process started after the run is dead
    (:func:`lopd.utils.pid_started_before`). Returns the run ids it marked."""
    from lopd.utils import pid_started_before

    if (os.getpid(), uri, exp_id) in _SWEPT:
        return []
    _SWEPT.add((os.getpid(), uri, exp_id))
    host = socket.gethostname()
    found = _retry(client.search_runs, [exp_id], filter_string=(
        f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'"), max_results=1000)
    marked = []
    for run in found:
        pid = run.data.tags.get(PID_TAG, "")
        if pid.isdigit() and int(pid) != os.getpid() and not pid_started_before(int(pid), run.info.start_time / 1000):
            # re-read after the process is known dead: it may have ended its run between the search and
            # now (a finished process waiting to be reaped is a zombie); a dead process changes nothing more
            if _retry(client.get_run, run.info.run_id).info.status != "RUNNING":
                continue
            _end_run(uri, run.info.run_id, "KILLED")
            marked.append(run.info.run_id)
    return marked


def mark_stale_run(tp, run_id: str) -> bool:
    """Mark a run left RUNNING by a killed process as KILLED. Returns True if it was."""
    try:
        client = _client(tp.uri)
        if client.get_run(run_id).info.status == "RUNNING":
            _end_run(tp.uri, run_id, "KILLED")
            return True
        return False
    except Exception:  # noqa: BLE001 - best effort; the new run still links to it by tag
        return False
