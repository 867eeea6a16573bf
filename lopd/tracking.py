"""MLflow tracking that never holds a run's files hostage.

Every stage writes its results as files first (``result.json``, ``history.csv``); MLflow
mirrors them for browsing. Metrics are buffered and sent with ``log_batch`` (one SQLite
write per flush, not per value), with retries on SQLite lock contention so concurrent
search workers do not fail.

Stages talk to MLflow through a **sidecar process** (:func:`start_sidecar`, started by the CLI
before the stage imports torch): importing MLflow and opening its store costs ~3 s of CPU per
process, which the sidecar spends on the second core while the stage loads its model. Calls
stay synchronous (same order, same errors); code that never starts a sidecar (tests, library
use) gets the same client in-process.

If the tracking URI is unreachable: with ``tracking.on_failure: warn`` (default) the run
goes on, prints one clear warning and records ``"tracking": "failed: <cause>"`` in its
``result.json``; with ``fail`` the stage stops with exit status 2 before training.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from typing import Any

from lopd.errors import BadInput

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001 - provenance only
        return "unknown"


def _retry(fn, *args, tries: int = 8, **kw):
    delay = 0.05
    for i in range(tries):
        try:
            return fn(*args, **kw)
        except Exception as e:  # noqa: BLE001
            if "locked" not in str(e).lower() or i == tries - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class MlflowOps:
    """The few MLflow operations a :class:`Tracker` needs, on plain JSON-able arguments.

    Runs in-process or inside the sidecar (``python -m lopd.tracking_sidecar``); SQLite lock
    contention is retried here, in whichever process touches the store.
    """

    def __init__(self, uri: str):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)

    def start_run(self, experiment: str, run_name: str, tags: dict[str, str]) -> str:
        exp = _retry(self.client.get_experiment_by_name, experiment)
        exp_id = exp.experiment_id if exp else _retry(self.client.create_experiment, experiment)
        return _retry(self.client.create_run, exp_id, run_name=run_name, tags=tags).info.run_id

    def log_batch(self, run_id: str, metrics: list | None = None, params: list | None = None) -> None:
        """``metrics``: ``[key, value, timestamp_ms, step]`` rows; ``params``: ``[key, value]`` rows."""
        from mlflow.entities import Metric, Param

        _retry(self.client.log_batch, run_id, metrics=[Metric(k, v, ts, st) for k, v, ts, st in metrics or []],
               params=[Param(k, v) for k, v in params or []])

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        _retry(self.client.set_tag, run_id, key, value)

    def log_artifact(self, run_id: str, path: str) -> None:
        _retry(self.client.log_artifact, run_id, path)

    def set_terminated(self, run_id: str, status: str) -> None:
        _retry(self.client.set_terminated, run_id, status)

    def mark_stale(self, run_id: str) -> bool:
        run = self.client.get_run(run_id)
        if run.info.status == "RUNNING":
            _retry(self.client.set_terminated, run_id, "KILLED")
            return True
        return False


OPS = ("start_run", "log_batch", "set_tag", "log_artifact", "set_terminated", "mark_stale")


class RemoteError(Exception):
    """An operation failed inside the sidecar; ``str()`` is ``"<ExceptionType>: <message>"``."""


class SidecarOps:
    """Proxy for :class:`MlflowOps` in a child process: one JSON line per call, one reply each.

    The child exits when its stdin closes, so a stage killed with SIGKILL leaves no orphan (its
    run stays RUNNING and the resumed run marks it KILLED, as without a sidecar).
    """

    def __init__(self, uri: str):
        import threading

        self.uri = uri
        self._lock = threading.Lock()
        self._n = 0
        # the child imports this same lopd, wherever the stage runs from
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pkg_parent, os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "lopd.tracking_sidecar", uri], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def __getattr__(self, op: str):
        if op not in OPS:
            raise AttributeError(op)
        return lambda *args, **kwargs: self._call(op, args, kwargs)

    def _call(self, op: str, args, kwargs):
        import json

        with self._lock:
            self._n += 1
            try:
                self.proc.stdin.write(json.dumps({"id": self._n, "op": op, "args": list(args), "kwargs": kwargs}) + "\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if not line:
                code = self.proc.poll()
                raise RemoteError(f"SidecarExited: the MLflow sidecar process ended (exit status {code})")
            reply = json.loads(line)
        if reply.get("id") != self._n:
            raise RemoteError(f"SidecarProtocol: reply {reply.get('id')} to call {self._n}")
        if "error" in reply:
            raise RemoteError(reply["error"])
        return reply.get("result")

    def close(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=timeout)
            except Exception:  # noqa: BLE001 - a sidecar that will not stop is killed
                self.proc.kill()
                self.proc.wait()


_SIDECAR: SidecarOps | None = None


def start_sidecar(tp) -> SidecarOps:
    """Start the MLflow sidecar for ``tp.uri`` (once per process); it imports MLflow meanwhile."""
    global _SIDECAR
    if _SIDECAR is None or _SIDECAR.uri != tp.uri:
        stop_sidecar()
        _SIDECAR = SidecarOps(tp.uri)
    return _SIDECAR


def stop_sidecar() -> None:
    global _SIDECAR
    if _SIDECAR is not None:
        _SIDECAR.close()
        _SIDECAR = None


atexit.register(stop_sidecar)  # a no-op unless a sidecar was started


def _ops_for(uri: str):
    if _SIDECAR is not None and _SIDECAR.uri == uri:
        return _SIDECAR
    return MlflowOps(uri)


class Tracker:
    """One MLflow run (optionally nested under ``parent_run_id``)."""

    def __init__(self, tp, run_name: str, tags: dict[str, Any], parent_run_id: str | None = None,
                 flush_every: int = 50, enabled: bool = True):
        self.tp = tp
        self.run_id: str | None = None
        self.error: str | None = None
        self._buf: list = []
        self.flush_every = flush_every
        if not enabled:
            self.error = "disabled (not rank 0)"
            return
        try:
            self.ops = _ops_for(tp.uri)
            all_tags = {"git_commit": git_commit(), **{k: str(v) for k, v in tags.items()}}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            self.run_id = self.ops.start_run(tp.experiment, run_name, all_tags)
        except Exception as e:  # noqa: BLE001 - any tracking failure is reported, never hidden
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        first = str(e).splitlines()[0] if str(e) else ""
        msg = first if isinstance(e, RemoteError) else f"{type(e).__name__}: {first}"
        if self.tp.on_failure == "fail":
            raise BadInput(f"MLflow tracking at {self.tp.uri!r} failed ({msg}); set tracking.on_failure: warn to run without it")
        if self.error is None:
            print(f"WARNING: MLflow tracking at {self.tp.uri!r} failed ({msg}); results are still written to files",
                  file=sys.stderr)
        self.error = msg
        self.run_id = None

    @property
    def ok(self) -> bool:
        return self.run_id is not None

    @property
    def status(self) -> str:
        return "ok" if self.ok else f"failed: {self.error}"

    def log_params(self, params: dict[str, Any]) -> None:
        if not self.ok:
            return
        items = [[k, str(v)[:500]] for k, v in params.items()]
        try:
            for i in range(0, len(items), 100):
                self.ops.log_batch(self.run_id, params=items[i:i + 100])
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if not self.ok:
            return
        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            if v is None:
                continue
            v = float(v)
            if v != v:  # NaN is not logged (it would poison MLflow's charts); files keep it
                continue
            self._buf.append([k, v, ts, int(step)])
        if len(self._buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self.ok or not self._buf:
            self._buf = []
            return
        try:
            for i in range(0, len(self._buf), 900):
                self.ops.log_batch(self.run_id, metrics=self._buf[i:i + 900])
        except Exception as e:  # noqa: BLE001
            self._fail(e)
        self._buf = []

    def set_tag(self, key: str, value: Any) -> None:
        if self.ok:
            try:
                self.ops.set_tag(self.run_id, key, str(value))
            except Exception as e:  # noqa: BLE001
                self._fail(e)

    def log_artifact(self, path: str) -> None:
        if self.ok:
            try:
                self.ops.log_artifact(self.run_id, str(path))
            except Exception as e:  # noqa: BLE001
                self._fail(e)

    def end(self, status: str = "FINISHED") -> None:
        self.flush()
        if self.ok:
            try:
                self.ops.set_terminated(self.run_id, status)
            except Exception as e:  # noqa: BLE001
                self._fail(e)


def mark_stale_run(tp, run_id: str) -> bool:
    """Mark a run left RUNNING by a killed process as KILLED. Returns True if it was."""
    try:
        return bool(_ops_for(tp.uri).mark_stale(run_id))
    except Exception:  # noqa: BLE001 - best effort; the new run still links to it by tag
        return False
