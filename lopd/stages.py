"""Stage implementations: each reads params and inputs, calls the library, writes outputs.

``stages/*.py`` are one-line entry points into :func:`lopd.cli.main`; everything a stage does
lives here so it can be tested without DVC. Paths are relative to the repository root
(DVC runs every stage there).
"""

from __future__ import annotations

import time
from pathlib import Path

from lopd import data as data_mod
from lopd.config import Params
from lopd.utils import write_json

SPLITS_DIR = Path("data/splits")
BASE_DIR = Path("models/base")


def stage_prepare(params: Params) -> dict:
    splits = data_mod.generate_splits(params.envs)
    manifest = data_mod.write_splits(SPLITS_DIR, splits)
    counts = {s: manifest["files"][s]["n"] for s in data_mod.SPLITS}
    print(f"wrote splits {counts} to {SPLITS_DIR}")
    return manifest


def stage_base(params: Params) -> dict:
    """Train (tiny model) or fingerprint (real model) the base policy; evaluate it on val."""
    import torch

    from lopd.base_policy import demonstrations, save_base, train_on_messages
    from lopd.evaluate import evaluate_policy, make_envs
    from lopd.model.backbone import build_tiny_model, dir_hash, load_causal_lm, resolve_device, resolve_dtype
    from lopd.model.chat import ChatFormat
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary, load_tokenizer
    from lopd.tracking import Tracker
    from lopd.utils import progress, seed_everything

    bp = params.base
    seed_everything(bp.seed, params.model.torch_threads)
    reader = data_mod.SplitReader(SPLITS_DIR, role="base")
    train, val = reader.load("train"), reader.load("val")
    envs = make_envs(params)
    out_dir = BASE_DIR
    tracker = Tracker(params.tracking, "base", {"stage": "base", "arm": "base", "seed": bp.seed, "split": "train",
                                                "params_hash": params.section_hash("model", "envs", "base"),
                                                "bank_mode": "none"})
    t0 = time.time()
    device = resolve_device(params.model)
    result: dict = {"stage": "base", "seed": bp.seed}
    if params.model.name_or_path:
        src = Path(params.model.name_or_path)
        model = load_causal_lm(src, device, resolve_dtype(params.model, device))
        tok = load_tokenizer(src)
        result.update(model_dir=str(src), model_hash=dir_hash(src), trained=False)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "REAL_MODEL").write_text(str(src) + "\n")
    else:
        tok = build_tokenizer(env_vocabulary(params.envs.domains, params.envs))
        model = build_tiny_model(params.model, tok, seed=bp.seed).to(device)
        fmt = ChatFormat(tok)
        demos = demonstrations(envs, train, bp.demos_per_task, bp.noise, bp.truncate_prob, bp.seed)
        with progress() as prog:
            task = prog.add_task("base policy", total=bp.steps, info="")

            def on_step(step, loss):
                prog.update(task, advance=1, info=f"loss {loss:.3f}")
                tracker.log_metrics({"train_loss": loss}, step)

            losses = train_on_messages(model, fmt, demos, steps=bp.steps, batch_size=bp.batch_size, lr=bp.lr,
                                       seed=bp.seed, on_step=on_step)
        save_base(model, tok, out_dir / "model")
        result.update(trained=True, n_demos=len(demos), final_loss=losses[-1],
                      n_params=sum(p.numel() for p in model.parameters()))
    fmt = ChatFormat(tok)
    ev = params.evaluate
    res = evaluate_policy(model, fmt, envs, val, max_new_tokens=ev.max_new_tokens, max_len=params.model.max_seq_len,
                          batch_size=ev.batch_size, greedy=ev.greedy, temperature=ev.temperature, seed=bp.seed)
    result.update(val_reward=res["mean"], val_reward_by_domain=res["by_domain"], seconds=round(time.time() - t0, 1),
                  splits_read=list(data_mod.ACCESS_LOG), mlflow_run_id=tracker.run_id, tracking=tracker.status)
    tracker.log_metrics({"val_reward": res["mean"], **{f"val_reward_{d}": v for d, v in res["by_domain"].items()}}, 0)
    tracker.end()
    write_json(Path("results/base/val_rewards.json"), res["per_task"])
    write_json(Path("results/base/result.json"), result)
    print(f"base policy val reward {res['mean']:.3f} by domain {res['by_domain']}")
    del torch
    return result


BANK_DIR = Path("models/bank")
COLD_DIR = Path("models/cold_start")
HPO_DIR = Path("hpo")
RUNS_DIR = Path("runs")
CKPT_DIR = Path("checkpoints")
EVAL_DIR = Path("results/eval")


def _load_bb(params):
    from lopd.model.backbone import load_backbone
    from lopd.utils import seed_everything

    seed_everything(0, params.model.torch_threads)
    return load_backbone(params, BASE_DIR)


def _embeddings(params, bb, tasks) -> dict:
    from lopd.bank import embed_tasks

    embs = embed_tasks(params.bank.embedder, bb, tasks)
    return {t.task_id: e for t, e in zip(tasks, embs)}


def stage_bank(params: Params) -> dict:
    """Successful base-policy rollouts on train → the experience bank; retrieval precision on val."""
    import torch

    from lopd.bank import Experience, ExperienceBank, embed_tasks
    from lopd.evaluate import make_envs
    from lopd.rollout import rollout_batch
    from lopd.utils import progress, seed_everything

    bp = params.bank
    bb = _load_bb(params)
    seed_everything(bp.seed, params.model.torch_threads)
    reader = data_mod.SplitReader(SPLITS_DIR, role="bank")
    train, val = reader.load("train"), reader.load("val")
    envs = make_envs(params)
    gen = torch.Generator().manual_seed(bp.seed)
    entries: list[Experience] = []
    bb.mode("student")
    bs = params.evaluate.batch_size
    todo = [t for t in train for _ in range(bp.rollouts_per_task)]
    seen: set[str] = set()
    with progress() as prog:
        task = prog.add_task("bank rollouts", total=len(todo), info="")
        for i in range(0, len(todo), bs):
            for r in rollout_batch(bb.model, bb.fmt, envs, todo[i:i + bs], max_new_tokens=params.evaluate.max_new_tokens,
                                   max_len=params.model.max_seq_len, temperature=params.evaluate.temperature, generator=gen):
                if r.reward >= bp.min_reward and r.finished and r.task.task_id not in seen:
                    seen.add(r.task.task_id)  # one experience per task instance
                    entries.append(Experience(r.task.task_id, r.task.domain, r.task.family, r.task.prompt, r.messages, r.reward))
            prog.update(task, advance=len(todo[i:i + bs]), info=f"{len(entries)} successes")
    if not entries:
        from lopd.errors import RunFailed

        raise RunFailed("the base policy had no successful train rollouts: the experience bank would be empty")
    emb = embed_tasks(bp.embedder, bb, [_experience_task(e) for e in entries])
    bank = ExperienceBank(entries, emb, bp.embedder)
    val_emb = embed_tasks(bp.embedder, bb, val)
    precision = {bp.embedder: bank.precision(val, val_emb, params.train.n_ret)}
    other = "minilm" if bp.embedder == "backbone" else "backbone"
    try:  # measure the alternative embedder too, so the default is chosen on evidence
        bank_o = ExperienceBank(entries, embed_tasks(other, bb, [_experience_task(e) for e in entries]), other)
        precision[other] = bank_o.precision(val, embed_tasks(other, bb, val), params.train.n_ret)
    except Exception as e:  # noqa: BLE001 - optional comparison; say why it is missing
        precision[other] = {"error": f"{type(e).__name__}: {e}"}
    manifest = bank.save(BANK_DIR, {"retrieval_precision_val": precision, "splits_read": list(data_mod.ACCESS_LOG)})
    print(f"bank: {len(bank)} experiences {manifest['by_family']}; val retrieval precision {precision}")
    return manifest


def _experience_task(e):
    """The (prompt-only) task an experience came from, for embedding it."""
    from lopd.envs.base import Task

    return Task(e.task_id, e.domain, e.family, e.prompt)


def stage_cold_start(params: Params) -> dict:
    from lopd.bank import ExperienceBank
    from lopd.checkpoint import save_tensors
    from lopd.cold_start import cold_start
    from lopd.tracking import Tracker
    from lopd.utils import progress

    cp = params.cold_start
    bb = _load_bb(params)
    bank = ExperienceBank.load(BANK_DIR)
    emb = _embeddings(params, bb, [_experience_task(e) for e in bank.entries])
    tracker = Tracker(params.tracking, "cold_start", {"stage": "cold_start", "arm": "lopd", "seed": cp.seed,
                                                      "split": "train", "bank_mode": "relevant",
                                                      "params_hash": params.section_hash("model", "bank", "cold_start")})
    k_choices = sorted(set(params.hpo.k_choices) | {params.train.K})
    with progress() as prog:
        task = prog.add_task("composer cold start", total=cp.steps, info="")

        def on_step(step, row):
            prog.update(task, advance=1, info=f"teacher NLL {row['nll']:.3f}")
            tracker.log_metrics({f"cold_start_{k}": v for k, v in row.items()}, step)

        comp, rows = cold_start(bb, bank, emb, cp, k_choices=k_choices, on_step=on_step)
    save_tensors(COLD_DIR / "phi0.safetensors", comp.state())
    last = rows[-10:]
    result = {"stage": "cold_start", "steps": cp.steps, "k_choices": k_choices, "mlflow_run_id": tracker.run_id,
              "tracking": tracker.status,
              **{f"{k}_first": rows[0][k] for k in rows[0]}, **{f"{k}_last": rows[-1][k] for k in rows[-1]},
              **{f"{k}_last10_mean": sum(r[k] for r in last) / len(last) for k in rows[-1]}}
    tracker.end()
    write_json(COLD_DIR / "result.json", result)
    print(f"cold start: teacher NLL {rows[0]['nll']:.3f} -> {rows[-1]['nll']:.3f}"
          + (f", KL(text || latent) {rows[0]['distill_kl']:.3f} -> {rows[-1]['distill_kl']:.3f}"
             if "distill_kl" in rows[0] else ""))
    return result


def load_resources(params: Params, role: str, need_bank: bool = True):
    """Backbone, bank, φ0 and the train/val tasks shared by every run of a process."""
    from lopd.bank import ExperienceBank
    from lopd.checkpoint import load_tensors_verified
    from lopd.evaluate import make_envs
    from lopd.trainer import Resources

    bb = _load_bb(params)
    reader = data_mod.SplitReader(SPLITS_DIR, role=role)
    train, val = reader.load("train"), reader.load("val")
    bank = ExperienceBank.load(BANK_DIR) if need_bank else None
    phi0 = load_tensors_verified(COLD_DIR / "phi0.safetensors") if need_bank else None
    res = Resources(params=params, bb=bb, bank=bank, train_tasks=train, val_tasks=val, envs=make_envs(params),
                    phi0=phi0, k_max=params.cold_start.k_max)
    if need_bank:
        res.task_emb = _embeddings(params, bb, train + val)
    return res


def selected_hparams(params: Params, arm) -> dict:
    """m, K, n_ret chosen by the validation search (for arms that use them)."""
    import yaml

    if not (arm.use_selected and params.train.use_best_params):
        return {}
    path = HPO_DIR / "best_params.yaml"
    if not path.exists():
        from lopd.errors import BadInput

        raise BadInput(f"{path} not found: run the hpo stage first, or set train.use_best_params: false")
    best = yaml.safe_load(path.read_text()) or {}
    return {k: best[k] for k in ("margin", "K", "n_ret") if k in best}


def run_arm(params: Params, res, arm_name: str, seed: int, out_dir: Path, *, ckpt_dir: Path | None,
            tags: dict | None = None, hp_over: dict | None = None, on_val=None, parent_run_id: str | None = None,
            final_val: bool = True, world=None, use_selected: bool = True) -> dict:
    """Train one arm with one seed; write result.json, history.csv and the weights to ``out_dir``."""
    from lopd.arms import get_arm
    from lopd.checkpoint import save_tensors
    from lopd.tracking import Tracker, mark_stale_run
    from lopd.trainer import HISTORY_COLUMNS, HParams, Trainer
    from lopd.utils import progress, seed_everything, write_csv

    arm = get_arm(arm_name)
    selected = selected_hparams(params, arm) if use_selected else {}
    hp = HParams.from_params(params, **{**selected, **(hp_over or {})})
    seed_everything(seed, params.model.torch_threads)
    is_main = world is None or world.is_main
    stale = None
    # the MLflow run id lives beside the checkpoint (a checkpoint directory is replaced whole)
    rid = ckpt_dir.with_name(ckpt_dir.name + ".mlflow_run_id") if ckpt_dir is not None else None
    if ckpt_dir is not None:
        ckpt_dir.parent.mkdir(parents=True, exist_ok=True)
        if rid.exists() and is_main:
            stale = rid.read_text().strip()
            mark_stale_run(params.tracking, stale)
    all_tags = {"stage": "train", "arm": arm_name, "seed": seed, "bank_mode": arm.bank_mode, "split": "train+val",
                "params_hash": params.section_hash("model", "envs", "base", "bank", "cold_start", "train"),
                **(tags or {})}
    if stale:
        all_tags["resumed_from_run"] = stale
    tracker = Tracker(params.tracking, f"{arm_name}-{seed}", all_tags, parent_run_id=parent_run_id, enabled=is_main)
    if rid is not None and tracker.run_id and is_main:
        rid.write_text(tracker.run_id)
    tracker.log_params({"arm": arm_name, "seed": seed, **hp.__dict__})
    t0 = time.time()
    with progress() as prog:
        bar = prog.add_task(f"train {arm_name} seed {seed}", total=hp.steps if arm.trains else 1, info="")

        def on_progress(step, row):
            prog.update(bar, completed=step, info=f"reward {row.get('reward') or 0:.2f} β {row.get('beta') or 0:.2f}")

        trainer = Trainer(res, arm, hp, seed, tracker=tracker, ckpt_dir=ckpt_dir, on_val=on_val,
                          progress=on_progress, world=world)
        if world is not None:
            from lopd.distributed import broadcast_trainer

            broadcast_trainer(world, trainer)  # every rank starts from rank 0's θ and φ
        try:
            info = trainer.fit()
        except BaseException:
            tracker.end("FAILED")
            raise
    final = trainer.validate(res.val_tasks) if final_val else trainer.last_val
    result = {"arm": arm_name, "seed": seed, "hparams": hp.__dict__, "arm_switches": arm.to_dict(),
              "val_reward": final, "final_train_reward": next((r["reward"] for r in reversed(trainer.history)
                                                               if r.get("reward") is not None), None),
              "steps": trainer.step, "rollouts_used": trainer.rollouts_used, "beta_final": trainer.beta,
              "infeasible_margin": trainer.infeasible, "params_hash": all_tags["params_hash"],
              "mlflow_run_id": tracker.run_id, "tracking": "ok" if tracker.ok else f"failed: {tracker.error}",
              "resumed_from_step": info["resumed_from_step"]}
    # result.json must be identical whether or not the run was resumed: timings and run ids go to meta.json
    meta = {"mlflow_run_id": tracker.run_id, "tracking": result.pop("tracking"), "seconds": round(time.time() - t0, 1),
            "resumed_from_step": result.pop("resumed_from_step"), "resumed_from_run": stale}
    result.pop("mlflow_run_id")
    if is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_tensors(out_dir / "student.safetensors", res.bb.adapter_state("student"))
        if trainer.composer is not None:
            save_tensors(out_dir / "composer.safetensors", trainer.composer.state())
        hist = [{k: (v if k != "seconds" else None) for k, v in r.items()} for r in trainer.history]
        write_csv(out_dir / "history.csv", hist, [c for c in HISTORY_COLUMNS if c != "seconds"])
        write_json(out_dir / "meta.json", meta)
        write_json(out_dir / "result.json", result)
    tracker.log_metrics({"final_val_reward": final}, trainer.step)
    tracker.set_tag("infeasible_margin", str(trainer.infeasible).lower())
    tracker.end()
    if ckpt_dir is not None and is_main:
        import shutil

        shutil.rmtree(ckpt_dir, ignore_errors=True)  # the run is complete: its outputs replace the checkpoint
        rid.unlink(missing_ok=True)
    return {**result, **meta}


def stage_train(params: Params, arm: str, seed: int, out: str | None = None) -> dict:
    from lopd.arms import get_arm

    spec = get_arm(arm)
    if seed not in params.train.seeds and out is None:
        from lopd.errors import BadInput

        raise BadInput(f"seed {seed} is not in train.seeds {params.train.seeds}")
    from lopd.distributed import World

    world = World.from_env(params.model.device)  # None unless launched by torchrun with >1 process
    res = load_resources(params, role="train", need_bank=spec.context != "none")
    out_dir = Path(out) if out else RUNS_DIR / f"{arm}-{seed}"
    r = run_arm(params, res, arm, seed, out_dir, ckpt_dir=CKPT_DIR / f"{arm}-{seed}", world=world)
    print(f"{arm} seed {seed}: val reward {r['val_reward']:.3f} in {r['seconds']} s")
    return r


def stage_evaluate(params: Params, arm: str, seed: int) -> dict:
    """The only stage that reads the test split: the trained student alone, no retrieval.

    It writes files only (no MLflow import: this stage runs once per arm × seed and the
    import costs seconds each); the report stage mirrors every test result into MLflow in one
    batch, tagged ``stage=evaluate``."""
    from lopd.arms import get_arm
    from lopd.checkpoint import load_tensors_verified
    from lopd.evaluate import evaluate_policy, make_envs

    get_arm(arm)
    run_dir = RUNS_DIR / f"{arm}-{seed}"
    if not (run_dir / "result.json").exists():
        from lopd.errors import BadInput

        raise BadInput(f"no finished run at {run_dir} (train {arm} seed {seed} first)")
    from lopd.model.backbone import load_student_policy
    from lopd.utils import seed_everything

    seed_everything(0, params.model.torch_threads)
    model, fmt = load_student_policy(params, BASE_DIR, load_tensors_verified(run_dir / "student.safetensors"))
    test = data_mod.SplitReader(SPLITS_DIR, role="evaluate").load("test")
    ev = params.evaluate
    res = evaluate_policy(model, fmt, make_envs(params), test, max_new_tokens=ev.max_new_tokens,
                          max_len=params.model.max_seq_len, batch_size=ev.batch_size, greedy=ev.greedy,
                          temperature=ev.temperature, seed=20_000 + seed)
    benchmarks = {}
    for dom in params.envs.eval_domains:  # real benchmark data, evaluation only
        from lopd.envs import make_env

        env = make_env(dom, params.envs)
        tasks = env.generate(params.envs.seed, params.envs.n_test)
        b = evaluate_policy(model, fmt, {dom: env}, tasks, max_new_tokens=ev.max_new_tokens,
                            max_len=params.model.max_seq_len, batch_size=ev.batch_size, greedy=ev.greedy,
                            temperature=ev.temperature, seed=20_000 + seed)
        benchmarks[dom] = b["mean"]
        res["per_task"] += b["per_task"]
    out = EVAL_DIR / f"{arm}-{seed}"
    write_json(out / "per_task.json", res["per_task"])
    result = {"arm": arm, "seed": seed, "test_reward": res["mean"], "test_reward_by_domain": res["by_domain"],
              "benchmarks": benchmarks, "n_tasks": len(test), "splits_read": list(data_mod.ACCESS_LOG)}
    write_json(out / "result.json", result)
    print(f"test {arm} seed {seed}: {res['mean']:.3f} {res['by_domain']}")
    return result


def stage_probe(params: Params) -> dict:
    """The premise gate (lopd.premise) on val at the selected K and n_ret, with φ0."""
    from lopd.arms import get_arm
    from lopd.checkpoint import load_tensors_verified
    from lopd.cold_start import privilege_probe
    from lopd.model.composer import Composer
    from lopd.utils import progress

    selected = selected_hparams(params, get_arm("lopd"))
    K, n_ret = selected.get("K", params.train.K), selected.get("n_ret", params.train.n_ret)
    res = load_resources(params, role="probe")
    comp = Composer(res.bb, res.k_max)
    comp.load_state(load_tensors_verified(COLD_DIR / "phi0.safetensors"))
    bs, pp = params.evaluate.batch_size, params.probe
    with progress() as prog:
        bar = prog.add_task("premise gate", total=pp.samples_per_task * -(-len(res.val_tasks) // bs), info="")
        out = privilege_probe(res.bb, comp, res.bank, res.val_tasks, res.envs, res.task_emb, K=K, n_ret=n_ret, pp=pp,
                              ev=params.evaluate, max_len=params.model.max_seq_len,
                              progress=lambda: prog.update(bar, advance=1))
    out["K_n_ret_from"] = str(HPO_DIR / "best_params.yaml") if selected else "train.K, train.n_ret"
    out["splits_read"] = list(data_mod.ACCESS_LOG)
    write_json(Path("results/probe/result.json"), out)
    r, d = out["reward"]["by_condition"], out["delta"]["by_condition"]
    print(f"premise gate (K={K}, n_ret={n_ret}): premise_holds={out['premise_holds']}; val reward "
          + ", ".join(f"{c} {v['mean']:.3f}" for c, v in r.items()) + "; mean delta "
          + ", ".join(f"{c} {v['mean']:+.4f}" for c, v in d.items()))
    return out


def stage_hpo(params: Params, worker: bool = False, storage: str | None = None, n_trials: int | None = None) -> dict:
    from lopd.hpo import run_search, write_outputs, write_result
    from lopd.tracking import Tracker

    res = load_resources(params, role="hpo")
    storage = storage or str(HPO_DIR / "journal.log")
    tracker = Tracker(params.tracking, "hpo" + ("-worker" if worker else ""),
                      {"stage": "hpo", "arm": "lopd", "seed": params.hpo.seed, "split": "val", "bank_mode": "relevant",
                       "params_hash": params.section_hash("model", "envs", "base", "bank", "cold_start", "train", "hpo")})
    try:
        study = run_search(params, res, storage=storage, n_trials=n_trials, worker=worker, parent_tracker=tracker)
    except BaseException:
        tracker.end("FAILED")
        raise
    if worker:
        tracker.end()
        return {}
    sel = write_outputs(study, HPO_DIR)
    tracker.log_params({f"best_{k}": v for k, v in sel.items()})
    tracker.end()
    write_result(HPO_DIR, sel, study, list(data_mod.ACCESS_LOG), tracker)
    print(f"selected on val: m={sel['margin']} K={sel['K']} n_ret={sel['n_ret']} (val reward {sel['value']:.3f})")
    return sel


def stage_sensitivity(params: Params) -> dict:
    """One-at-a-time validation grid around the selected point (m, then K, then n_ret)."""
    import shutil
    import tempfile

    import yaml

    from lopd.utils import write_csv

    sel = yaml.safe_load((HPO_DIR / "best_params.yaml").read_text())
    sp = params.sensitivity
    res = load_resources(params, role="sensitivity")
    grid = ([("margin", {"margin": m}) for m in sp.margins] + [("K", {"K": k}) for k in sp.ks]
            + [("n_ret", {"n_ret": n}) for n in sp.n_rets])
    rows = []
    for axis, over in grid:
        point = {"margin": sel["margin"], "K": sel["K"], "n_ret": sel["n_ret"], **over}
        for seed in sp.seeds:
            tmp = Path(tempfile.mkdtemp(prefix="sens-"))
            try:
                r = run_arm(params, res, "lopd", 2000 + seed, tmp, ckpt_dir=None,
                            tags={"stage": "sensitivity", "axis": axis, "split": "val"},
                            hp_over={**point, "steps": sp.steps, "val_every": sp.steps}, use_selected=False)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            rows.append({"axis": axis, **point, "seed": seed, "val_reward": r["val_reward"]})
    write_csv(Path("results/sensitivity/grid.csv"), rows, ["axis", "margin", "K", "n_ret", "seed", "val_reward"])
    write_json(Path("results/sensitivity/result.json"), {"n_runs": len(rows), "selected": sel,
                                                         "splits_read": list(data_mod.ACCESS_LOG)})
    return {"n_runs": len(rows)}


def stage_report(params: Params) -> dict:
    from lopd.report import build_report

    summary = build_report(params, Path("."))
    mirror_test_results(params)
    print("report written to reports/")
    return summary


def mirror_test_results(params: Params) -> int:
    """Log every ``results/eval/*/result.json`` to MLflow as a run tagged stage=evaluate."""
    import json

    from lopd.tracking import Tracker

    n = 0
    for path in sorted(EVAL_DIR.glob("*/result.json")):
        r = json.loads(path.read_text())
        tr = Tracker(params.tracking, f"eval-{r['arm']}-{r['seed']}",
                     {"stage": "evaluate", "arm": r["arm"], "seed": r["seed"], "split": "test", "bank_mode": "none",
                      "params_hash": params.section_hash()})
        if not tr.ok:
            break  # tracking unreachable: said once by the tracker; the files are the record
        tr.log_metrics({"test_reward": r["test_reward"],
                        **{f"test_reward_{d}": v for d, v in r["test_reward_by_domain"].items()}}, 0)
        tr.end()
        n += 1
    return n
