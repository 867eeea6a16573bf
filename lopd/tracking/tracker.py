"""One MLflow run (:class:`Tracker`), the report on the experiment parent, and the clean-up of runs
whose process died (see the package docstring)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lopd.compat import mlflow as mlflow_compat
from lopd.errors import BadInput
from lopd.faults import kill_point
from lopd.tracking.store import (HOST_TAG, PID_TAG, end_run, error_message, experiment_id, experiment_parent_id,
                                 handle_failure, lock_contention, open_client, provenance_tags, retry)

if TYPE_CHECKING:
    from lopd.config import Params


SWEPT: set[tuple[int, str, str]] = set()  # (pid, uri, experiment id) already swept for stale runs


class Tracker:
    """One MLflow run, nested under ``parent_run_id`` or else under the experiment parent.

    ``params`` is the whole validated :class:`lopd.config.Params` (``params.tracking`` says where
    and how; the other sections identify the experiment).
    """

    def __init__(self, params: Params, run_name: str, tags: dict[str, Any], parent_run_id: str | None = None,
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
            self.client = open_client(self.tp.uri)
            exp_id = experiment_id(self.client, self.tp.uri, self.tp.experiment)
            parent = parent_run_id or experiment_parent_id(params, self.client)
            sweep_dead_runs(self.client, self.tp.uri, exp_id)
            all_tags = {**provenance_tags(), **{k: str(v) for k, v in tags.items()},
                        "mlflow.parentRunId": parent, HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
            self.run_id = retry(self.client.create_run, exp_id, run_name=run_name, tags=all_tags).info.run_id
        except Exception as e:  # noqa: BLE001 - any tracking failure is reported, never hidden
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        msg = error_message(e)
        handle_failure(self.tp, msg, first=self.error is None)
        self.error = msg
        self.run_id = None

    @property
    def ok(self) -> bool:
        return self.run_id is not None

    @property
    def status(self) -> str:
        return "ok" if self.ok else f"failed: {self.error}"

    def _log_batch(self, metrics=(), params: Params=()) -> None:
        """One ``log_batch``. An asynchronous one is checked at the next call (done by then) and
        at :meth:`end`; one that met SQLite lock contention is sent again, synchronously."""
        self._check_pending()
        if self.tp.async_logging:
            op = self.client.log_batch(self.run_id, metrics=metrics, params=params, synchronous=False)
            self._pending.append((op, metrics, params))
        else:
            retry(self.client.log_batch, self.run_id, metrics=metrics, params=params, synchronous=True)

    def _check_pending(self) -> None:
        pending, self._pending = self._pending, []
        for op, metrics, params in pending:
            try:
                op.wait()  # re-raises the background write's exception
            except Exception as e:  # noqa: BLE001
                if not lock_contention(e):
                    raise
                # rolled back whole; MLflow skips rows it already holds, so sending again is safe
                retry(self.client.log_batch, self.run_id, metrics=metrics, params=params, synchronous=True)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        if not self.ok:
            return
        cut = mlflow_compat.max_param_length()
        try:
            self._log_batch(params=[Param(k, str(v)[:cut]) for k, v in params.items()])
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
            self._log_batch(metrics=buf)  # MlflowClient.log_batch splits it into batches MLflow accepts
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def _guarded(self, call) -> None:
        if self.ok:
            try:
                retry(call)
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
                kill_point("mlflow_close", detail=self.run_id)  # fault injection: the run stays RUNNING
                end_run(self.tp.uri, self.run_id, status)
            except Exception as e:  # noqa: BLE001
                self._fail(e)


def log_report_artifacts(params: Params, paths, root: str | Path | None = None) -> str:
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
        client = open_client(tp.uri)
        parent = experiment_parent_id(params, client)
        # the last stage: no run of a killed earlier attempt may stay RUNNING under a finished parent
        sweep_dead_runs(client, tp.uri, experiment_id(client, tp.uri, tp.experiment))
        for p in map(Path, paths):
            rel = p.relative_to(root) if root is not None else p
            where = str(rel.parent) if not rel.is_absolute() and str(rel.parent) != "." else None
            retry(client.log_artifact, parent, str(p), where)
        kill_point("mlflow_close", detail=parent)  # fault injection: the parent stays RUNNING
        end_run(tp.uri, parent, "FINISHED")
    except Exception as e:  # noqa: BLE001 - reported, never hidden
        msg = error_message(e)
        handle_failure(tp, msg, first=True)
        return f"failed: {msg}"
    return "ok"


def report_files(reports: str | Path) -> list[Path]:
    """The report files the experiment parent carries: ``reports/*.md``, ``*.json``, the figures and
    the metrics files."""
    out = Path(reports)
    return sorted([*out.glob("*.md"), *out.glob("*.json"), *(out / "figures").glob("*.png"),
                   *(out / "metrics").rglob("*.json")])


def close_experiment(params: Params, root: str | Path) -> str:
    """The experiment parent FINISHED with the report under ``root/reports`` attached, whoever ran the
    report: after a repro in which DVC skipped the report stage (nothing it reads changed), the
    stages that did run left the parent RUNNING. A parent already FINISHED is left alone.

    Returns ``"ok"``, ``"already finished"``, ``"no report"`` (nothing under ``reports/`` to attach:
    the parent is left as it is) or ``"failed: <cause>"`` (as :func:`log_report_artifacts`)."""
    files = report_files(Path(root) / "reports")
    if not files:
        return "no report"
    tp = params.tracking
    try:
        client = open_client(tp.uri)
        if retry(client.get_run, experiment_parent_id(params, client)).info.status == "FINISHED":
            return "already finished"
    except Exception as e:  # noqa: BLE001 - reported, never hidden
        msg = error_message(e)
        handle_failure(tp, msg, first=True)
        return f"failed: {msg}"
    return log_report_artifacts(params, files, root=root)


def sweep_dead_runs(client, uri: str, exp_id: str) -> list[str]:
    """Mark KILLED every RUNNING run of experiment ``exp_id`` that this host started from a process
    that no longer exists (a stage killed before it could end its run); once per process and store.
    Runs of other hosts are left alone (their liveness cannot be judged from here), and so are runs
    of live processes (a concurrent stage); a pid reused by a process started after the run is dead
    (:func:`lopd.utils.pid_started_before`). Returns the run ids it marked."""
    from lopd.utils import pid_started_before

    if (os.getpid(), uri, exp_id) in SWEPT:
        return []
    SWEPT.add((os.getpid(), uri, exp_id))
    host = socket.gethostname()
    found = retry(client.search_runs, [exp_id], filter_string=(
        f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'"), max_results=1000)
    marked = []
    for run in found:
        pid = run.data.tags.get(PID_TAG, "")
        if pid.isdigit() and int(pid) != os.getpid() and not pid_started_before(int(pid), run.info.start_time / 1000):
            # re-read after the process is known dead: it may have ended its run between the search and
            # now (a finished process waiting to be reaped is a zombie); a dead process changes nothing more
            if retry(client.get_run, run.info.run_id).info.status != "RUNNING":
                continue
            end_run(uri, run.info.run_id, "KILLED")
            marked.append(run.info.run_id)
    return marked


def mark_stale_run(tp, run_id: str) -> bool:
    """Mark a run left RUNNING by a killed process as KILLED. Returns True if it was."""
    try:
        client = open_client(tp.uri)
        if client.get_run(run_id).info.status == "RUNNING":
            end_run(tp.uri, run_id, "KILLED")
            return True
        return False
    except Exception:  # noqa: BLE001 - best effort; the new run still links to it by tag
        return False


def log_to_training_run(params: Params, arm: str, seed: int, metrics: dict[str, float]) -> str:
    """Log ``metrics`` (step 0) on the training run of ``arm``/``seed`` in this experiment (the newest
    FINISHED run with tags stage=train, arm, seed under the experiment parent), so that the runs
    table shows a run's test reward beside its training signals.

    Returns ``"ok"`` or ``"failed: <cause>"`` (no such run is a failure: ``tracking.on_failure:
    fail`` raises ``BadInput``, ``warn`` prints it once).
    """
    from mlflow.entities import Metric

    tp = params.tracking
    try:
        client = open_client(tp.uri)
        parent = experiment_parent_id(params, client)
        found = retry(client.search_runs, [experiment_id(client, tp.uri, tp.experiment)], filter_string=(
            f"tags.`mlflow.parentRunId` = '{parent}' and tags.stage = 'train' and tags.arm = '{arm}' and "
            f"tags.seed = '{seed}' and attributes.status = 'FINISHED'"), order_by=["attributes.start_time DESC"],
            max_results=1)
        if not found:
            raise LookupError(f"no finished MLflow training run of {arm} seed {seed} under parent {parent}")
        ts = int(time.time() * 1000)
        values = [Metric(k, float(v), ts, 0) for k, v in metrics.items() if v is not None and float(v) == float(v)]
        retry(client.log_batch, found[0].info.run_id, metrics=values, synchronous=True)
    except Exception as e:  # noqa: BLE001 - reported, never hidden
        msg = error_message(e)
        handle_failure(tp, msg, first=True)
        return f"failed: {msg}"
    return "ok"
