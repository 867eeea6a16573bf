"""One training job: one arm, one seed → ``result.json``, ``history.csv``, ``splits_read.json`` and
the adapter weights in ``out_dir``. :func:`run_arm` trains one job alone (the train stage);
:func:`open_job` and :func:`close_job` are its start and end, which a population's members share
(:mod:`lopd.population.jobs`: the search, the baselines' tuning, the sensitivity grid).

Run ids and timings go to the returned ``meta`` (the caller writes them to a side file), never
into ``out_dir``: a resumed and an uninterrupted run write byte-identical outputs.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lopd.config import Params
from lopd.config.train import SELECTED_KEYS
from lopd.errors import BadInput
from lopd.utils import atomic_write_text, write_json

if TYPE_CHECKING:
    from lopd.training.trainer import Resources


def selected_hparams(params: Params, best_params_file: Path, arm) -> dict:
    """What the validation search chose for ``arm``: m, K, n_ret, the student learning rate and η_β for the
    arms that use the selected point (``best_params.yaml``); an arm tuned as a baseline
    (``baselines.yaml`` beside it lists it) takes what it was tuned over from there: what its own search
    selected (e.g. lopd_frozen's K, n_ret and learning rate, GRPO's group size), or lopd_fixbeta its held β."""
    import yaml

    if not params.train.use_best_params:
        return {}
    out: dict = {}
    if arm.use_selected:
        if not best_params_file.exists():
            raise BadInput(f"{best_params_file} not found: run the hpo stage first, or set train.use_best_params: false")
        best = yaml.safe_load(best_params_file.read_text()) or {}
        if arm.point == "binding":
            if "binding" not in best:
                raise BadInput(f"{best_params_file} has no 'binding' entry (a search written before lopd_binding "
                               "existed): rerun the hpo stage")
            if best["binding"] is None:
                raise BadInput(f"arm {arm.name} has no point: {best.get('binding_reason', 'no trial binds')}")
            best = best["binding"]
        out = {k: best[k] for k in SELECTED_KEYS if k in best}
    tuned = best_params_file.with_name("baselines.yaml")
    if tuned.exists():
        own = (yaml.safe_load(tuned.read_text()) or {}).get(arm.name)
        if own:  # an arm's own search (knob "search") lists what it searched
            for knob in own.get("knobs") or [own.get("knob", "lr_student")]:
                out[knob] = own[knob]
    return out


def not_run_reason(params: Params, best_params_file: Path, arm) -> str | None:
    """Why ``arm`` cannot run by design, or None: lopd_binding when the search found no trial whose margin
    binds (``best_params.yaml``: ``binding: null`` and ``binding_reason``)."""
    import yaml

    if arm.point != "binding" or not params.train.use_best_params or not best_params_file.exists():
        return None
    best = yaml.safe_load(best_params_file.read_text()) or {}
    if "binding" in best and best["binding"] is None:
        return str(best.get("binding_reason") or "no search trial's margin binds")
    return None


@dataclass
class OpenJob:
    """A training job's MLflow side while it runs: its tracker, the file beside the checkpoint that
    holds the run id (None without a checkpoint), the run a killed attempt left (marked KILLED), the
    params hash it is tagged with, and when it started."""

    tracker: Any
    rid: Path | None
    stale: str | None
    params_hash: str
    t0: float


def run_id_file(ckpt_dir: Path) -> Path:
    """Where a job's MLflow run id is kept while it trains: beside its checkpoint (a checkpoint
    directory is replaced whole)."""
    return ckpt_dir.with_name(ckpt_dir.name + ".mlflow_run_id")


def open_job(params: Params, arm, seed: int, hp, ckpt_dir: Path | None, tags: dict | None,
             parent_run_id: str | None, is_main: bool, run_name: str | None) -> OpenJob:
    """Start the MLflow run of one job (a run alone or a population member) and log its
    hyper-parameters; a run left RUNNING by a killed attempt is marked KILLED and linked."""
    from lopd.tracking import Tracker, mark_stale_run
    from lopd.tracking.names import final_run

    stale = None
    rid = run_id_file(ckpt_dir) if ckpt_dir is not None else None
    if rid is not None:
        ckpt_dir.parent.mkdir(parents=True, exist_ok=True)
        if rid.exists() and is_main:
            stale = rid.read_text().strip()
            mark_stale_run(params.tracking, stale)
    all_tags = {"stage": "train", "arm": arm.name, "seed": seed, "bank_mode": arm.bank_mode, "split": "train+val",
                "params_hash": params.section_hash("model", "envs", "base", "bank", "cold_start", "train"),
                **(tags or {})}
    if stale:
        all_tags["resumed_from_run"] = stale
    tracker = Tracker(params, run_name or final_run(arm.name, seed), all_tags, parent_run_id=parent_run_id,
                      enabled=is_main)
    if rid is not None and tracker.run_id and is_main:
        atomic_write_text(rid, tracker.run_id)
    tracker.log_params({"arm": arm.name, "seed": seed, **hp.__dict__})
    return OpenJob(tracker, rid, stale, all_tags["params_hash"], time.time())


def close_job(job: OpenJob, res: Resources, arm, trainer, info: dict, out_dir: Path, *, final: float | None,
              final_val: bool, is_main: bool = True, ckpt_dir: Path | None = None) -> tuple[dict, dict]:
    """A trained job's ``(result, meta)``: writes its outputs to ``out_dir`` (``res``: the resources
    its trainer ran on, whose backbone maps its ``student`` role to its adapter), logs them and its
    final metrics to its MLflow run and ends that run. ``ckpt_dir``: a run alone's checkpoint, removed
    with its run-id file (a population removes its own once every member is closed)."""
    from lopd import data as data_mod

    tracker = job.tracker
    result = {"arm": arm.name, "seed": trainer.seed, "hparams": trainer.hp.__dict__, "arm_switches": arm.to_dict(),
              "val_reward": final, "final_train_reward": next((r["reward"] for r in reversed(trainer.history)
                                                               if r.get("reward") is not None), None),
              "steps": trainer.step, "rollouts_used": trainer.rollouts_used, "beta_final": trainer.beta,
              "infeasible_margin": trainer.infeasible, "params_hash": job.params_hash,
              "val_per_task": trainer.last_val_per_task if final_val else []}
    meta = {"mlflow_run_id": tracker.run_id, "tracking": "ok" if tracker.ok else f"failed: {tracker.error}",
            "seconds": round(time.time() - job.t0, 1), "resumed_from_step": info["resumed_from_step"],
            "resumed_from_run": job.stale}
    if is_main:
        _write_outputs(out_dir, res, trainer, result, list(data_mod.ACCESS_LOG))
        for name in ("history.csv", "result.json"):  # the run's own files, browsable beside its charts
            tracker.log_artifact(out_dir / name)
    tracker.log_metrics({"final/val_reward": final, "final/beta": trainer.beta}, trainer.step)
    tracker.set_tag("infeasible_margin", str(trainer.infeasible).lower())
    tracker.end()
    if ckpt_dir is not None and is_main:  # the run is complete: its outputs replace the checkpoint
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        if job.rid is not None:
            job.rid.unlink(missing_ok=True)
    return result, meta


def _fit(res: Resources, arm, arm_name, hp, seed, tracker, ckpt_dir, on_val, world):
    from lopd.training.trainer import Trainer
    from lopd.utils import progress

    with progress() as prog:
        bar = prog.add_task(f"train {arm_name} seed {seed}", total=hp.steps if arm.trains else 1, info="")

        def on_progress(step, row):
            prog.update(bar, completed=step, info=f"reward {row.get('reward') or 0:.2f} β {row.get('beta') or 0:.2f}")

        trainer = Trainer(res, arm, hp, seed, tracker=tracker, ckpt_dir=ckpt_dir, on_val=on_val,
                          progress=on_progress, world=world)
        if world is not None:
            from lopd.training.distributed import broadcast_trainer

            broadcast_trainer(world, trainer)  # every rank starts from rank 0's θ and φ
        try:
            info = trainer.fit()
        except BaseException:
            tracker.end("FAILED")
            raise
    return trainer, info


def _write_outputs(out_dir: Path, res: Resources, trainer, result: dict, splits: list) -> None:
    from lopd.training.checkpoint import save_tensors
    from lopd.training.trainer import HISTORY_COLUMNS
    from lopd.utils import write_csv

    out_dir.mkdir(parents=True, exist_ok=True)
    save_tensors(out_dir / "student.safetensors", res.bb.adapter_state("student"))
    for step, (rollouts, snap) in sorted(trainer.snapshots.items()):  # hp.snapshot_steps: the student then
        save_tensors(out_dir / "snapshots" / f"step-{step}" / "student.safetensors", snap)
        write_json(out_dir / "snapshots" / f"step-{step}" / "snapshot.json", {"step": step, "rollouts_used": rollouts})
    if trainer.composer is not None:
        save_tensors(out_dir / "composer.safetensors", trainer.composer.state())
    write_csv(out_dir / "history.csv", trainer.history, [c for c in HISTORY_COLUMNS if c != "seconds"])
    write_json(out_dir / "splits_read.json", splits)
    write_json(out_dir / "result.json", result)


def run_arm(params: Params, res: Resources, arm_name: str, seed: int, out_dir: Path, *, ckpt_dir: Path | None,
            best_params_file: Path | None = None, tags: dict | None = None, hp_over: dict | None = None,
            on_val=None, parent_run_id: str | None = None, final_val: bool = True, world=None,
            run_name: str | None = None) -> tuple[dict, dict]:
    """Train ``arm_name`` with ``seed``; returns ``(result, meta)``. ``best_params_file=None`` uses no
    search selection (the search itself and the sensitivity grid pass their points in ``hp_over``).
    ``run_name`` names its MLflow run (default ``<arm> · seed <seed>``)."""
    from lopd.arms import get_arm
    from lopd.compat.kernels import seed_everything

    arm = get_arm(arm_name)
    hp = job_hparams(params, arm, best_params_file, hp_over)
    seed_everything(seed, params.model.torch_threads)
    is_main = world is None or world.is_main
    job = open_job(params, arm, seed, hp, ckpt_dir, tags, parent_run_id, is_main, run_name)
    trainer, info = _fit(res, arm, arm_name, hp, seed, job.tracker, ckpt_dir, on_val, world)
    final = trainer.validate(res.val_tasks) if final_val else trainer.last_val
    return close_job(job, res, arm, trainer, info, out_dir, final=final, final_val=final_val, is_main=is_main,
                     ckpt_dir=ckpt_dir)


def job_hparams(params: Params, arm, best_params_file: Path | None, hp_over: dict | None):
    """A job's hyper-parameters: ``train``'s, then the search's selection for ``arm`` (when
    ``best_params_file`` is given), then ``hp_over``."""
    from lopd.training.trainer import HParams

    selected = selected_hparams(params, best_params_file, arm) if best_params_file is not None else {}
    return HParams.from_params(params, **{**selected, **(hp_over or {})})
