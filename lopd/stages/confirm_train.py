"""Stage ``confirm_train@{slot}``: at point ``slot`` of S (``registration.json``), every trained arm of the
rule on every confirmation seed, one population per arm (:mod:`lopd.population`), to
``confirm/runs/p<slot>/<arm>/seed-<s>``. Seed s reads its own draw (``confirm_draw@s``), the same at every
point. The point's m, K, n_ret and lr apply to every arm, except lopd_frozen's lr: its own, tuned on val.
Slot 0 also trains the registered efficiency baseline (GRPO, at its own values tuned on val), and lopd there and
the baseline keep their students at the registered efficiency checkpoints (``snapshots/step-<t>``). A slot
beyond S's size writes ``not_run.json`` saying so. ``base`` does not train: slot 0 holds its
students (shared by every point). At H2's point (the binding one) H2's controls train too. A run that an earlier
point already trains (``registration.json``'s ``shared_runs``: it reads nothing that differs between the points)
is not trained again. The registration's hash is written beside the runs once they are all
done (``confirm_evaluate`` refuses runs without it, or under another), and keys their checkpoints."""

from __future__ import annotations

from lopd.config import Params
from lopd.paths import NOT_RUN, Paths, REGISTRATION_MARKER as MARKER
from lopd.utils import write_json


def run(params: Params, paths: Paths, slot: int) -> dict:
    from lopd.arms import get_arm
    from lopd.confirmation import registration as regmod
    from lopd.errors import BadInput
    from lopd.population.jobs import Job, run_jobs
    from lopd.stages.common import load_resources, with_draw, write_side
    from lopd.training.run import job_hparams

    if slot not in params.confirm.slots:
        raise BadInput(f"slot {slot} is not a slot of S (confirm.slots {params.confirm.slots})")
    reg = regmod.load(paths.registration)
    out = paths.confirm_runs(slot)
    out.mkdir(parents=True, exist_ok=True)
    (out / NOT_RUN).unlink(missing_ok=True)  # a slot S filled since: its runs replace the old record
    (out / MARKER).unlink(missing_ok=True)  # written last: partial runs never carry a registration's hash
    if slot >= len(reg["points"]):
        why = f"S has {len(reg['points'])} point(s): slot {slot} is empty"
        write_json(out / NOT_RUN, {"slot": slot, "reason": why})
        write_json(out / MARKER, {"sha256": reg["sha256"]})
        print(f"confirm slot {slot}: not run: {why}")
        return {}
    point, seeds = reg["points"][slot], reg["seeds"]
    arms = regmod.trained_at(reg, slot)  # a run another point already trains is not trained again
    res = load_resources(params, paths, role="train", need_bank=True, draw=seeds[0], dirs=paths.confirm_draw(seeds[0]))
    results = {}
    key = reg["sha256"][:12]  # checkpoints of another registration (other S, seeds or rule) are never resumed
    for arm in arms:
        spec = get_arm(arm)
        hp = job_hparams(params, spec, None, regmod.point_hparams(reg, point, arm))
        tags = {"stage": "confirm_train", "point": point["name"], "trial": str(point["trial"]),
                "registration": reg["sha256"][:16]}
        jobs = [Job(s, hp, out / arm / f"seed-{s}", tags=tags, run_name=f"confirm {point['name']} · {arm} · seed {s}",
                    res=with_draw(paths, res, s, paths.confirm_draw(s)) if i else None,
                    rid_key=paths.checkpoints / f"confirm-{key}-p{slot}-{arm}-seed-{s}") for i, s in enumerate(seeds)]
        done = run_jobs(params, res, arm, jobs, ckpt_dir=paths.checkpoints / f"confirm-{key}-p{slot}-{arm}",
                        label=f"confirm {point['name']} {arm}")
        for s, (result, meta) in zip(seeds, done):
            write_side(paths, f"confirm_train@{slot}-{arm}-{s}", meta)
        results[arm] = {s: r["val_reward"] for s, (r, _) in zip(seeds, done)}
        print(f"confirm {point['name']} {arm}: val reward "
              + " ".join(f"{v:.3f}" for v in results[arm].values()))
    write_json(out / "point.json", point)
    write_json(out / MARKER, {"sha256": reg["sha256"]})
    return results
