"""``lopd doctor``: check and repair what ``lopd repro`` / ``lopd exp run`` guard, for a user who ran
bare ``dvc repro`` or ``dvc exp run`` and was interrupted.

* ``dvc.lock`` torn by a kill during DVC's rewrite: restored from the last complete snapshot
  (``.lopd/dvc.lock.good``, taken as each stage starts), the damaged file kept
  (:func:`lopd.workflow.lockguard.repair_lock`);
* stale DVC locks: ``.dvc/tmp/rwlock`` entries of processes that are gone, or a torn rwlock
  (:func:`lopd.workflow.lockguard.dvc_locks_held`);
* MLflow runs left RUNNING by a killed stage of this host: marked KILLED
  (:func:`lopd.tracking.sweep_dead_runs`; every stage does this too when it opens its run).

Exit status 0 when the repository is usable afterwards, 1 while a live DVC process works in it.
"""

from __future__ import annotations

from pathlib import Path

from lopd.errors import BadInput


def _say(msg: str) -> None:
    print(f"lopd doctor: {msg}", flush=True)


def check_dvc(root: Path) -> int:
    """Repair ``dvc.lock`` and DVC's locks under ``root``, saying what was found and done."""
    from lopd.workflow.lockguard import LOCK_NAME, guard, inspect_lock

    said: list[str] = []

    def collect(msg: str) -> None:
        said.append(msg)
        _say(msg)

    rc = guard(root, collect)
    if rc == 0 and not said:
        state = inspect_lock(root)
        _say(f"{LOCK_NAME}: {'complete' if state.current is not None else 'absent (nothing run yet)'}; "
             "no stale DVC locks")
    return rc


def sweep_mlflow(params_file: Path) -> None:
    """Mark KILLED the MLflow runs of this host whose process is gone (the tracking section of ``params_file``)."""
    from lopd.config import load_params

    tp = load_params(params_file).tracking
    db = Path(tp.uri[len("sqlite:///"):]) if tp.uri.startswith("sqlite:///") else None
    if db is not None and not db.exists():  # opening the store would create it
        _say(f"MLflow: no store at {db} yet")
        return
    from mlflow.tracking import MlflowClient

    from lopd.tracking import sweep_dead_runs

    client = MlflowClient(tracking_uri=tp.uri)
    exp = client.get_experiment_by_name(tp.experiment)
    if exp is None:
        _say(f"MLflow: no experiment {tp.experiment!r} in {tp.uri} yet")
        return
    marked = sweep_dead_runs(client, tp.uri, exp.experiment_id)
    _say(f"MLflow: marked {len(marked)} run(s) of dead processes KILLED" + (f": {', '.join(marked)}" if marked
                                                                            else " (none was left RUNNING)"))


def doctor(params_file: str | Path, mlflow: bool = True) -> int:
    """Check and repair the DVC repository around the working directory, then the MLflow store."""
    from lopd.workflow.lockguard import find_root

    root = find_root(Path.cwd())
    if root is None:
        raise BadInput(f"{Path.cwd()} is not in a DVC repository (no .dvc directory above it)")
    rc = check_dvc(root)
    if rc == 0 and mlflow:
        sweep_mlflow(Path(params_file))
    return rc
