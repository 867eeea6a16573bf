"""Stage ``evaluate@{arm}``: the ONLY stage that reads the test split. Each trained student of the
arm (``runs/{arm}/seed-{s}``) alone (no retrieval, no latents, no composer) on every test task, one
seed after another in one process, to ``results/eval/{arm}/seed-{s}``."""

from __future__ import annotations

from lopd import data as data_mod
from lopd.config import Params
from lopd.errors import BadInput
from lopd.paths import NOT_RUN, Paths
from lopd.stages.common import splits_read, write_side
from lopd.utils import read_json, write_json


def _evaluate(params: Params, model, fmt, envs, tasks, seed: int, label: str) -> dict:
    """``evaluate_policy`` on ``tasks``, with a progress bar over its batches."""
    from lopd.engine.evaluation import evaluate_policy
    from lopd.utils import progress

    ev = params.evaluate
    rollouts = len(tasks) * (1 if ev.greedy else ev.samples_per_task)
    with progress() as prog:
        bar = prog.add_task(label, total=-(-rollouts // ev.batch_size), info=f"{rollouts} rollouts")
        return evaluate_policy(model, fmt, envs, tasks, max_new_tokens=ev.max_new_tokens,
                               max_len=params.model.max_seq_len, batch_size=ev.batch_size, greedy=ev.greedy,
                               temperature=ev.temperature, seed=20_000 + seed, samples_per_task=ev.samples_per_task,
                               progress=lambda: prog.update(bar, advance=1))


def _track(params: Params, paths: Paths, arm: str, seed: int, result: dict) -> None:
    """The evaluation's MLflow run, nested under the experiment's parent, and its test metrics mirrored
    onto the training run it evaluates (the runs table then shows both together); ids go to a side file."""
    from lopd.tracking import Tracker, log_to_training_run
    from lopd.tracking.names import evaluate_run

    metrics = {"test/reward": result["test_reward"],
               **{f"test/reward/{d}": v for d, v in result["test_reward_by_domain"].items()},
               **{f"test/benchmark/{d}": v for d, v in result["benchmarks"].items()}}
    tr = Tracker(params, evaluate_run(arm, seed), {"stage": "evaluate", "arm": arm, "seed": seed, "split": "test",
                                                   "bank_mode": "none", "params_hash": params.section_hash()})
    tr.log_metrics(metrics, 0)
    tr.end()
    mirrored = log_to_training_run(params, arm, seed, metrics) if tr.ok else "skipped: evaluate run not tracked"
    write_side(paths, f"evaluate@{arm}-{seed}", {"mlflow_run_id": tr.run_id, "tracking": tr.status,
                                                 "mirrored_to_training_run": mirrored})


def run(params: Params, paths: Paths, arm: str, seed: int | None = None) -> dict:
    from lopd.arms import get_arm
    from lopd.engine.evaluation import make_envs

    get_arm(arm)
    if paths.not_run(arm).exists():  # train@arm ran no seed by design: nothing to evaluate, no test read
        record = read_json(paths.not_run(arm))
        write_json(paths.arm_evals(arm) / NOT_RUN, record)
        print(f"{arm}: not evaluated: {record.get('reason')}")
        return {}
    seeds = params.train.seeds_of(arm) if seed is None else [seed]
    for s in seeds:
        if not (paths.run_dir(arm, s) / "result.json").exists():
            raise BadInput(f"no finished run at {paths.run_dir(arm, s)} (train {arm} first)")
    test = data_mod.SplitReader(paths.splits, role="evaluate").load("test")
    envs = make_envs(params)
    return {s: _evaluate_seed(params, paths, arm, s, test, envs) for s in seeds}


def _evaluate_seed(params: Params, paths: Paths, arm: str, seed: int, test, envs) -> dict:
    from lopd.envs import make_env
    from lopd.compat.kernels import seed_everything
    from lopd.model.merged import load_student_policy
    from lopd.training.checkpoint import load_tensors_verified

    run_dir = paths.run_dir(arm, seed)
    seed_everything(0, params.model.torch_threads)
    model, fmt = load_student_policy(params, paths.base, load_tensors_verified(run_dir / "student.safetensors"))
    res = _evaluate(params, model, fmt, envs, test, seed, f"evaluate {arm} seed {seed}")
    benchmarks = {}
    for dom in params.envs.eval_domains:  # real benchmark data, evaluation only
        env = make_env(dom, params.envs)
        b = _evaluate(params, model, fmt, {dom: env}, env.generate(params.envs.seed, params.envs.n_test), seed,
                      f"evaluate {arm} seed {seed} on {dom}")
        benchmarks[dom] = b["mean"]
        res["per_task"] += b["per_task"]
    out = paths.eval_dir(arm, seed)
    write_json(out / "per_task.json", res["per_task"])
    result = {"arm": arm, "seed": seed, "test_reward": res["mean"], "test_reward_by_domain": res["by_domain"],
              "benchmarks": benchmarks, "n_tasks": len(test), "samples_per_task": res["samples_per_task"],
              "splits_read": splits_read()}
    write_json(out / "result.json", result)
    _track(params, paths, arm, seed, result)
    print(f"test {arm} seed {seed}: {res['mean']:.3f} {res['by_domain']}")
    return result
