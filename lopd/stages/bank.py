"""Stage ``bank``: successful base-policy rollouts on train → the experience bank; retrieval
precision on val for the configured embedder and the alternative one."""

from __future__ import annotations

from lopd import data as data_mod
from lopd.config import Params
from lopd.errors import RunFailed
from lopd.paths import Paths
from lopd.stages.common import experience_task, load_backbone, splits_read, upstream_seed


def _successes(params: Params, bb, envs, train, seed: int) -> list:
    import torch

    from lopd.bank import Experience
    from lopd.engine.rollout import rollout_batch
    from lopd.utils import progress

    bp, ev = params.bank, params.evaluate
    gen = torch.Generator().manual_seed(seed)
    todo = [t for t in train for _ in range(bp.rollouts_per_task)]
    entries, seen = [], set()
    bb.mode("student")
    with progress() as prog:
        bar = prog.add_task("bank rollouts", total=len(todo), info="")
        for i in range(0, len(todo), ev.batch_size):
            batch = todo[i:i + ev.batch_size]
            for r in rollout_batch(bb.model, bb.fmt, envs, batch, max_new_tokens=ev.max_new_tokens,
                                   max_len=params.model.max_seq_len, temperature=ev.temperature, generator=gen):
                if r.reward >= bp.min_reward and r.finished and r.task.task_id not in seen:
                    seen.add(r.task.task_id)  # one experience per task instance
                    entries.append(Experience(r.task.task_id, r.task.domain, r.task.family, r.task.prompt,
                                              r.messages, r.reward))
            prog.update(bar, advance=len(batch), info=f"{len(entries)} successes")
    return entries


def _scripted(params: Params, envs, train, have: set) -> tuple[list, int]:
    """Scripted demonstrations (each environment's own solution, played and scored) of the train
    tasks without a policy success: ``bank.scripted_demos``, a path check's bank only. Returns
    them and how many scripted solutions failed (e.g. more actions than ``envs.max_turns``)."""
    from lopd.bank import Experience
    from lopd.envs.tool import run_actions  # plays any domain's actions in a fresh episode

    entries, failed = [], 0
    for t in train:
        if t.task_id in have:
            continue
        env = envs[t.domain]
        msgs, reward = run_actions(env, t, env.solve(t))
        reward = float(reward)
        if reward >= params.bank.min_reward:
            entries.append(Experience(t.task_id, t.domain, t.family, t.prompt, msgs, reward))
        else:
            failed += 1
    return entries, failed


def _precision(params: Params, bb, entries, val, embedder: str) -> dict:
    from lopd.bank import ExperienceBank, embed_tasks

    bank = ExperienceBank(entries, embed_tasks(embedder, bb, [experience_task(e) for e in entries]), embedder)
    return bank, bank.precision(val, embed_tasks(embedder, bb, val), params.train.n_ret)


def run(params: Params, paths: Paths, draw: int | None = None, out_dir=None) -> dict:
    """``draw=None``: the shared bank (``models/bank``, seed ``bank.seed``); else upstream draw ``draw``
    (``models/draws/bank-<draw>``, seed :func:`upstream_seed`). ``out_dir``: write there instead (a
    confirmation seed's draw, :mod:`lopd.stages.confirm_draw`)."""
    from lopd.engine.evaluation import make_envs
    from lopd.compat.kernels import seed_everything

    bp = params.bank
    seed = bp.seed if draw is None else upstream_seed(params, "bank", draw)
    bb = load_backbone(params, paths)
    seed_everything(seed, params.model.torch_threads)
    reader = data_mod.SplitReader(paths.splits, role="bank")
    train, val = reader.load("train"), reader.load("val")
    envs = make_envs(params)
    entries = _successes(params, bb, envs, train, seed)
    n_policy = len(entries)
    scripted = bp.scripted_demos
    if not entries and not scripted:
        raise RunFailed("the base policy had no successful train rollouts: the experience bank would be empty "
                        "(a random-weight model such as the stand-in solves nothing; only a path check may set "
                        "bank.scripted_demos: true to fill the bank with scripted demonstrations)")
    n_failed = 0
    if scripted:
        demos, n_failed = _scripted(params, envs, train, {e.task_id for e in entries})
        entries += demos
        print(f"PATH CHECK, NOT A RESULT: bank.scripted_demos is set: the bank holds {n_policy} policy "
              f"successes and {len(demos)} scripted demonstrations ({n_failed} scripted solutions failed)")
        if not entries:
            raise RunFailed(f"no policy success and every one of the {n_failed} scripted solutions failed "
                            "(envs.max_turns too small for them?): the experience bank would be empty")
    bank, prec = _precision(params, bb, entries, val, bp.embedder)
    precision = {bp.embedder: prec}
    other = "minilm" if bp.embedder == "backbone" else "backbone"
    try:  # measure the alternative embedder too, so the default is chosen on evidence
        precision[other] = _precision(params, bb, entries, val, other)[1]
    except Exception as e:  # noqa: BLE001 - optional comparison; the manifest says why it is missing
        precision[other] = {"error": f"{type(e).__name__}: {e}"}
    extra = {"retrieval_precision_val": precision, "splits_read": splits_read(),
             **({} if draw is None else {"draw": draw, "seed": seed})}
    if scripted:  # the default bank's manifest is unchanged
        extra["path_check"] = {"policy_successes": n_policy, "scripted_demos": len(entries) - n_policy,
                               "scripted_failed": n_failed}
    manifest = bank.save(out_dir or paths.upstream(draw)[0], extra)
    print(f"bank{'' if draw is None else f' draw {draw}'}: {len(bank)} experiences {manifest['by_family']}; "
          f"val retrieval precision {precision}")
    return manifest
