"""MLflow tracking that never holds a run's files hostage.

Every stage writes its results as files first (``result.json``, ``history.csv``); MLflow
mirrors them for browsing. Metrics are buffered and sent with ``log_batch`` (one SQLite
write per flush, not per value), with retries on SQLite lock contention so concurrent
search workers do not fail.

If the tracking URI is unreachable: with ``tracking.on_failure: warn`` (default) the run
goes on, prints one clear warning and records ``"tracking": "failed: <cause>"`` in its
``result.json``; with ``fail`` the stage stops with exit status 2 before training.
"""

from __future__ import annotations

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
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=tp.uri)
            exp = _retry(self.client.get_experiment_by_name, tp.experiment)
            exp_id = exp.experiment_id if exp else _retry(self.client.create_experiment, tp.experiment)
            all_tags = {"git_commit": git_commit(), **{k: str(v) for k, v in tags.items()}}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = _retry(self.client.create_run, exp_id, run_name=run_name, tags=all_tags)
            self.run_id = run.info.run_id
        except Exception as e:  # noqa: BLE001 - any tracking failure is reported, never hidden
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
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
        from mlflow.entities import Param

        items = [Param(k, str(v)[:500]) for k, v in params.items()]
        try:
            for i in range(0, len(items), 100):
                _retry(self.client.log_batch, self.run_id, params=items[i:i + 100])
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if not self.ok:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            if v is None:
                continue
            v = float(v)
            if v != v:  # NaN is not logged (it would poison MLflow's charts); files keep it
                continue
            self._buf.append(Metric(k, v, ts, step))
        if len(self._buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self.ok or not self._buf:
            self._buf = []
            return
        try:
            for i in range(0, len(self._buf), 900):
                _retry(self.client.log_batch, self.run_id, metrics=self._buf[i:i + 900])
        except Exception as e:  # noqa: BLE001
            self._fail(e)
        self._buf = []

    def set_tag(self, key: str, value: Any) -> None:
        if self.ok:
            try:
                _retry(self.client.set_tag, self.run_id, key, str(value))
            except Exception as e:  # noqa: BLE001
                self._fail(e)

    def log_artifact(self, path: str) -> None:
        if self.ok:
            try:
                _retry(self.client.log_artifact, self.run_id, path)
            except Exception as e:  # noqa: BLE001
                self._fail(e)

    def end(self, status: str = "FINISHED") -> None:
        self.flush()
        if self.ok:
            try:
                _retry(self.client.set_terminated, self.run_id, status)
            except Exception as e:  # noqa: BLE001
                self._fail(e)


def mark_stale_run(tp, run_id: str) -> bool:
    """Mark a run left RUNNING by a killed process as KILLED. Returns True if it was."""
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tp.uri)
        run = client.get_run(run_id)
        if run.info.status == "RUNNING":
            _retry(client.set_terminated, run_id, "KILLED")
            return True
    except Exception:  # noqa: BLE001 - best effort; the new run still links to it by tag
        return False
    return False
