"""Stage ``confirm_evaluate``: the ONLY stage that reads the confirmatory split. It refuses to run without a
valid ``registration.json`` whose hash every slot's runs were trained under, checks the split is the one
registered, then evaluates each trained student alone (as ``evaluate`` does) on every confirmatory task:
``confirm/eval/<point>/<arm>/seed-<s>``; base (trained once, slot 0) and the efficiency baseline under
``confirm/eval/shared/<arm>``; the registered efficiency checkpoints under ``.../seed-<s>/snapshots/step-<t>``."""

from __future__ import annotations

from lopd.config import Params
from lopd.errors import BadInput
from lopd.paths import NOT_RUN, REGISTRATION_MARKER, Paths
from lopd.utils import read_json, write_json


def run(params: Params, paths: Paths) -> dict:
    from lopd.confirmation import registration as regmod
    from lopd.confirmation.split import ROLE, ConfirmReader
    from lopd.engine.evaluation import make_envs
    from lopd.utils import sha256_file

    reg = regmod.load(paths.registration)  # before anything is read: no registration, no confirmatory read
    todo = []
    for slot in params.confirm.slots:
        runs = paths.confirm_runs(slot)
        rec = runs / REGISTRATION_MARKER
        if not rec.exists() or read_json(rec).get("sha256") != reg["sha256"]:
            raise BadInput(f"{runs} was not trained under the current registration (sha256 {reg['sha256'][:16]}…): "
                           f"rerun confirm_train@{slot}")
        if (runs / NOT_RUN).exists():
            continue
        point = reg["points"][slot]
        baseline = (reg.get("efficiency") or {}).get("baseline")
        for arm in regmod.trained_at(reg, slot):  # a shared run is evaluated once, where it was trained
            where = "shared" if arm in reg["arms"]["shared"] or arm == baseline else point["name"]  # not point-dependent
            steps = regmod.snapshot_steps(reg, point["name"], arm)
            for s in reg["seeds"]:
                run_dir = runs / arm / f"seed-{s}"
                if not (run_dir / "result.json").exists():
                    raise BadInput(f"no finished run at {run_dir} (rerun confirm_train@{slot})")
                todo.append((where, arm, s, run_dir, None))
                for t in steps:  # the registered efficiency checkpoints: the student after step t
                    snap = run_dir / "snapshots" / f"step-{t}"
                    if not (snap / "student.safetensors").exists():
                        raise BadInput(f"no snapshot at {snap} (the registration's efficiency step {t}): rerun "
                                       f"confirm_train@{slot}")
                    todo.append((where, arm, s, snap, t))
    msha = sha256_file(paths.confirm_split / "manifest.json") if (paths.confirm_split / "manifest.json").exists() else None
    if msha != reg["confirm_split"]["manifest_sha256"]:
        raise BadInput(f"{paths.confirm_split / 'manifest.json'} is not the confirmatory split registered in "
                       f"{paths.registration} (rerun register)")
    tasks = ConfirmReader(paths.confirm_split, role=ROLE).load()
    envs = make_envs(params)
    out = {}
    for where, arm, s, run_dir, step in todo:
        out[(where, arm, s, step)] = _evaluate_one(params, paths, where, arm, s, run_dir, tasks, envs, reg["sha256"],
                                                   step)
    write_json(paths.confirm_eval / REGISTRATION_MARKER, {"sha256": reg["sha256"]})
    return out


def _evaluate_one(params: Params, paths: Paths, where: str, arm: str, seed: int, run_dir, tasks, envs, reg_sha: str,
                  step: int | None = None) -> dict:
    """One student on every confirmatory task; ``step``: an efficiency snapshot (``run_dir`` is its folder),
    written under ``.../seed-<s>/snapshots/step-<t>`` with the rollouts it had used."""
    from lopd.compat.kernels import seed_everything
    from lopd.model.merged import load_student_policy
    from lopd.stages.common import splits_read
    from lopd.stages.evaluate import _evaluate
    from lopd.training.checkpoint import load_tensors_verified

    seed_everything(0, params.model.torch_threads)
    model, fmt = load_student_policy(params, paths.base, load_tensors_verified(run_dir / "student.safetensors"))
    at = "" if step is None else f" step {step}"
    res = _evaluate(params, model, fmt, envs, tasks, seed, f"confirm {where} {arm} seed {seed}{at}")
    out = paths.confirm_eval / where / arm / f"seed-{seed}"
    out = out if step is None else out / "snapshots" / f"step-{step}"
    write_json(out / "per_task.json", res["per_task"])
    result = {"point": where, "arm": arm, "seed": seed, "test_reward": res["mean"], "test_reward_by_domain": res["by_domain"],
              "n_tasks": len(tasks), "samples_per_task": res["samples_per_task"], "registration": reg_sha,
              "splits_read": splits_read()}
    if step is not None:
        result.update(step=step, rollouts_used=read_json(run_dir / "snapshot.json")["rollouts_used"])
    else:
        result.update(rollouts_used=read_json(run_dir / "result.json").get("rollouts_used"))
    write_json(out / "result.json", result)
    print(f"confirm {where} {arm} seed {seed}{at}: {res['mean']:.3f} {res['by_domain']}")
    return result
