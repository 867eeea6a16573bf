"""Between-draw spread of the rule's contrasts: several draws of the method's own upstream randomness (the
experience bank, ``bank.seed``, and the cold-started φ0, ``cold_start.seed``) with the base policy fixed.

    python bench/upstream.py [--draws 3] [--seeds 3] [--steps 96] [--profile FILE] [--base-dir DIR]
                             [--best-params FILE] [--workspace DIR] [--json FILE]

Draw d (0 … draws−1) sets ``bank.seed = cold_start.seed = d`` (draws 0, 1, 2 at the default 3) and runs the
pipeline's own stages in a workspace ``<workspace>/draw-<d>`` (``lopd bank``, ``lopd cold-start``, then ``lopd
train`` and ``lopd evaluate`` for lopd, lopd_frozen, lopd_shuffled and lopd_unrelated with training seeds
0 … seeds−1 at ``train.steps = steps``); base is evaluated once per seed (it uses no draw). The base policy is
trained once in the workspace (``lopd base``) or linked from ``--base-dir`` (e.g. ``models/base`` after
``dvc checkout base``; it must match the params). Params: this checkout's ``params.yaml`` with ``--profile``
merged over it (e.g. ``profiles/smoke.yaml`` for a quick run), and ``train.use_best_params: false`` unless
``--best-params`` names a search result (``hpo/best_params.yaml``; its ``baselines.yaml`` beside it is
copied too).

Printed, per contrast lopd − X (X = base, lopd_frozen, lopd_shuffled, lopd_unrelated), from the per-seed
contrasts c_{d,s} = lopd_{d,s} − X_{d,s} (test reward): each draw's mean m_d; the between-draw sd sd_d(m_d);
the seed-level sd s_w = √(mean_d var_s(c_{d,s})) (pooled within draws) and s_w/√seeds, the part of
sd_d(m_d) that the seed noise alone explains; the draw component √max(0, var_d(m_d) − s_w²/seeds); and the
seed-level 95% t-CI half-width of one draw's mean, t_{.975, seeds−1}·s_w/√seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ARMS = ("lopd", "lopd_frozen", "lopd_shuffled", "lopd_unrelated")
CONTROLS = ("base", "lopd_frozen", "lopd_shuffled", "lopd_unrelated")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=3, help="upstream draws (bank.seed = cold_start.seed = 0 … draws-1)")
    p.add_argument("--seeds", type=int, default=3, help="training seeds per draw (0 … seeds-1)")
    p.add_argument("--steps", type=int, default=96, help="train.steps of every run")
    p.add_argument("--profile", type=Path, default=None, help="a profile merged over params.yaml")
    p.add_argument("--base-dir", type=Path, default=None, help="an existing models/base to link (else trained here)")
    p.add_argument("--best-params", type=Path, default=None, help="hpo/best_params.yaml to train with")
    p.add_argument("--workspace", type=Path, default=None, help="kept workspace (default: a temporary one)")
    p.add_argument("--json", type=Path, default=None, help="also write every per-seed value and the table here")
    return p


def _params(args) -> dict:
    from lopd.config import deep_merge, parse_params, read_yaml_mapping

    raw = read_yaml_mapping(REPO / "params.yaml", "params file")
    if args.profile is not None:
        raw = deep_merge(raw, read_yaml_mapping(args.profile, "profile"))
    seeds = list(range(args.seeds))
    raw = deep_merge(raw, {"train": {"arms": ["base", *ARMS], "seeds": seeds, "extra_arms": [], "extra_seeds": [],
                                     "steps": args.steps, "rollout_budget": None, "per_seed_draws": False,
                                     "use_best_params": args.best_params is not None}})
    parse_params(raw, "bench/upstream.py params")  # bad input stops here, before anything runs
    return raw


def _lopd(root: Path, *argv: str) -> None:
    from lopd import data
    from lopd.cli import run_in_process

    data.ACCESS_LOG.clear()  # one process per stage in the pipeline: each records only its own split reads
    rc = run_in_process(["--params", str(root / "params.yaml"), *argv])
    if rc != 0:
        raise SystemExit(f"lopd {' '.join(argv)} in {root} exited {rc}")


def _test_reward(root: Path, arm: str, seed: int) -> float:
    return json.loads((root / "results" / "eval" / arm / f"seed-{seed}" / "result.json").read_text())["test_reward"]


def _shared(ws: Path, raw: dict, args) -> None:
    """Splits and the base policy, once: every draw links them."""
    (ws / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    _lopd(ws, "prepare")
    if args.base_dir is not None:
        (ws / "models").mkdir(exist_ok=True)
        (ws / "models" / "base").symlink_to(args.base_dir.resolve())
    else:
        _lopd(ws, "base")


def _draw(ws: Path, raw: dict, args, d: int) -> Path:
    """Bank and φ0 of draw d, then every arm's runs and evaluations in ``ws/draw-d``."""
    from lopd.config import deep_merge

    root = ws / f"draw-{d}"
    (root / "models").mkdir(parents=True, exist_ok=True)
    for link, target in ((root / "data", ws / "data"), (root / "models" / "base", ws / "models" / "base")):
        if not link.exists():
            link.symlink_to(target.resolve())
    (root / "params.yaml").write_text(yaml.safe_dump(deep_merge(raw, {"bank": {"seed": d}, "cold_start": {"seed": d}}),
                                                     sort_keys=False))
    if args.best_params is not None:
        (root / "hpo").mkdir(exist_ok=True)
        for name in ("best_params.yaml", "baselines.yaml"):
            src = args.best_params.with_name(name) if name != "best_params.yaml" else args.best_params
            if src.exists():
                (root / "hpo" / name).write_text(src.read_text())
    _lopd(root, "bank")
    _lopd(root, "cold-start")
    for s in range(args.seeds):  # every training seed of this draw reads its one bank and φ0 (train.per_seed_draws
        # false would seed every models/draws/*-s the same as models/*: a link instead of recomputing it per seed)
        for kind in ("bank", "cold_start"):
            link = root / "models" / "draws" / f"{kind}-{s}"
            link.parent.mkdir(exist_ok=True)
            if not link.exists():
                link.symlink_to(Path("..") / kind)
    for arm in (("base",) if d == 0 else ()) + ARMS:  # base uses no draw: evaluated once, in draw 0
        _lopd(root, "train", "--arm", arm)  # every seed of the arm as one population, as the train stage
        _lopd(root, "evaluate", "--arm", arm)
    return root


def spread(values: dict[int, dict[str, list[float]]], base: list[float]) -> list[dict]:
    """Per contrast lopd − X: per-draw means, between-draw sd, pooled seed-level sd and the derived figures
    of the module docstring. ``values[d][arm]`` = per-seed test rewards of draw d; ``base`` = base's."""
    import numpy as np
    from scipy import stats

    rows = []
    for x in CONTROLS:
        c = np.array([np.subtract(values[d]["lopd"], base if x == "base" else values[d][x]) for d in sorted(values)])
        n_draws, n_seeds = c.shape
        means = c.mean(axis=1)
        between = float(np.std(means, ddof=1)) if n_draws > 1 else math.nan
        within = float(np.sqrt(np.mean(np.var(c, axis=1, ddof=1)))) if n_seeds > 1 else math.nan
        seed_part = within / math.sqrt(n_seeds)
        rows.append({"contrast": f"lopd - {x}", "draw_means": means.tolist(), "between_draw_sd": between,
                     "seed_sd": within, "seed_sd_of_draw_mean": seed_part,
                     "draw_component_sd": math.sqrt(max(0.0, between ** 2 - seed_part ** 2)),
                     "seed_ci_half": float(stats.t.ppf(0.975, n_seeds - 1) * seed_part) if n_seeds > 1 else math.nan})
    return rows


def _print(rows: list[dict], values: dict, base: list[float], args, seconds: float) -> None:
    print(f"upstream draws: {args.draws} draws (bank.seed = cold_start.seed = d), {args.seeds} training seeds "
          f"per draw, {args.steps} steps, base fixed; {seconds:.0f} s")
    for d in sorted(values):
        print(f"  draw {d}: " + ", ".join(f"{a} {sum(v) / len(v):.4f}" for a, v in values[d].items())
              + f" (mean test reward over seeds); base {sum(base) / len(base):.4f}")
    head = ["contrast", *(f"draw {d}" for d in sorted(values)), "between-draw sd", "seed sd", "seed sd/sqrt(n)",
            "draw component sd", "seed 95% CI half"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        cells = [r["contrast"], *(f"{m:+.4f}" for m in r["draw_means"])]
        cells += [f"{r[k]:.4f}" for k in ("between_draw_sd", "seed_sd", "seed_sd_of_draw_mean", "draw_component_sd",
                                          "seed_ci_half")]
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.draws < 2 or args.seeds < 2 or args.steps < 1:
        print("error: need --draws >= 2, --seeds >= 2 and --steps >= 1 (an sd needs two values)", file=sys.stderr)
        return 2
    for f in (args.profile, args.best_params, args.base_dir):
        if f is not None and not f.exists():
            print(f"error: {f} not found", file=sys.stderr)
            return 2
    raw = _params(args)
    ws = args.workspace or Path(tempfile.mkdtemp(prefix="lopd-upstream-"))
    ws.mkdir(parents=True, exist_ok=True)
    raw = {**raw, "tracking": {**raw["tracking"], "uri": f"sqlite:///{ws.resolve() / 'mlflow.db'}"}}
    os.environ.pop("LOPD_ROOT", None)  # every stage's root is its params file's directory
    t0 = time.time()
    _shared(ws, raw, args)
    roots = {d: _draw(ws, raw, args, d) for d in range(args.draws)}
    base = [_test_reward(roots[0], "base", s) for s in range(args.seeds)]
    values = {d: {a: [_test_reward(r, a, s) for s in range(args.seeds)] for a in ARMS} for d, r in roots.items()}
    rows = spread(values, base)
    _print(rows, values, base, args, time.time() - t0)
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "base": base,
                                         "values": values, "table": rows}, indent=1))
    print(f"workspace: {ws}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
