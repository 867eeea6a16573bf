"""``lopd`` command line: one subcommand per pipeline stage plus tools.

Bad input (invalid params, missing or corrupt files, a forbidden split, an unknown arm)
exits with status 2 and one message naming the cause; a failed run exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import warnings  # noqa: E402

# deprecation chatter from transformers/peft internals says nothing about our runs
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*requires_grad.*converted to a Python scalar.*")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lopd", description=__doc__)
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    p.add_argument("--profile", default=None, help="a profile YAML merged over the params file")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("validate", help="validate the params and exit")
    sub.add_parser("prepare", help="write the sealed train/val/test splits")
    sub.add_parser("base", help="train (or fingerprint) the base policy and evaluate it on val")
    sub.add_parser("bank", help="build the experience bank from base rollouts on train")
    sub.add_parser("cold-start", help="composer cold start (phi0)")
    sub.add_parser("probe", help="privilege probe: teacher delta with relevant/shuffled/none context on val")
    h = sub.add_parser("hpo", help="validation-only search over margin, K, n_ret")
    h.add_argument("--worker", action="store_true", help="join the existing study as an extra worker")
    h.add_argument("--storage", default=None, help="Optuna storage URL (default: the journal file)")
    h.add_argument("--n-trials", type=int, default=None, help="trials for this worker (default: hpo.n_trials)")
    t = sub.add_parser("train", help="train one arm with one seed")
    t.add_argument("--arm", required=True)
    t.add_argument("--seed", type=int, required=True)
    t.add_argument("--out", default=None)
    e = sub.add_parser("evaluate", help="evaluate one trained student on the test split")
    e.add_argument("--arm", required=True)
    e.add_argument("--seed", type=int, required=True)
    sub.add_parser("sensitivity", help="validation sensitivity grid around the selected point")
    sub.add_parser("report", help="tables, figures and audits under reports/")
    a = sub.add_parser("apply-profile", help="write params merged with a profile to a file")
    a.add_argument("profile_file")
    a.add_argument("--out", default="params.yaml")
    return p


def main(argv: list[str] | None = None) -> int:
    from lopd.errors import BadInput, RunFailed

    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"run failed: {e}", file=sys.stderr)
        return 1


def _dispatch(args) -> int:
    from lopd.config import load_params

    if args.cmd == "apply-profile":
        import yaml

        from lopd.config import deep_merge, parse_params, read_yaml_mapping

        base = read_yaml_mapping(args.params, "params file")
        merged = deep_merge(base, read_yaml_mapping(args.profile_file, "profile"))
        parse_params(merged, f"{args.params} + {args.profile_file}")
        with open(args.out, "w") as f:
            yaml.safe_dump(merged, f, sort_keys=False)
        print(f"wrote {args.out}")
        return 0
    params = load_params(args.params, args.profile)
    if args.cmd == "validate":
        print("params OK")
        return 0
    from lopd import stages

    if args.cmd == "prepare":
        stages.stage_prepare(params)
    elif args.cmd == "base":
        stages.stage_base(params)
    elif args.cmd == "bank":
        stages.stage_bank(params)
    elif args.cmd == "cold-start":
        stages.stage_cold_start(params)
    elif args.cmd == "probe":
        stages.stage_probe(params)
    elif args.cmd == "hpo":
        stages.stage_hpo(params, worker=args.worker, storage=args.storage, n_trials=args.n_trials)
    elif args.cmd == "train":
        stages.stage_train(params, args.arm, args.seed, out=args.out)
    elif args.cmd == "evaluate":
        stages.stage_evaluate(params, args.arm, args.seed)
    elif args.cmd == "sensitivity":
        stages.stage_sensitivity(params)
    elif args.cmd == "report":
        stages.stage_report(params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
