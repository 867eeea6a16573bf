"""The ``lopd`` commands that run no stage: the tools around the pipeline.

``repro`` (the guarded ``dvc repro``), ``verify``, ``lock-status``, ``dvc-yaml``, ``exp run``, ``params``, ``doctor``,
``apply-profile`` and ``make-standin``. :mod:`lopd.dispatch` imports this module by name, only for
these commands, so no stage's code deps include the tools.
"""

from __future__ import annotations


def run(args) -> int:
    """Run the tool ``args.cmd`` with its parsed arguments; its exit status."""
    from lopd.paths import Paths

    if args.cmd == "apply-profile":
        return _apply_profile(args)
    if args.cmd == "repro":
        return _repro(args)
    if args.cmd == "verify":
        from lopd.workflow.verify import verify

        return verify(Paths.for_params(args.params).root, args.stages or None, keep=args.keep)
    if args.cmd == "lock-status":
        from lopd.workflow.lockstale import main

        return main(Paths.for_params(args.params).root)
    if args.cmd == "dvc-yaml":
        from lopd.workflow.dvcgen import write

        return write(Paths.for_params(args.params).root, check_only=args.check)
    if args.cmd == "make-standin":
        from lopd.config import load_params
        from lopd.training.standin import make_standin

        return make_standin(load_params(args.params, args.profile), Paths.for_params(args.params).root, args.out)
    if args.cmd == "exp":
        from lopd.workflow.experiment import run_profile_experiment

        return run_profile_experiment(args.params, args.exp_profile or args.profile, args.dvc_args)
    if args.cmd == "params":
        from lopd.workflow.params_view import show

        return show(args.params, args.params_profile or args.profile, args.overrides, args.sections)
    if args.cmd == "doctor":
        from lopd.workflow.doctor import doctor

        return doctor(args.params, mlflow=not args.no_mlflow)
    raise ValueError(f"no tool {args.cmd!r}")  # the parser admits only the commands above


def _apply_profile(args) -> int:
    import yaml

    from lopd.config import deep_merge, parse_params, read_yaml_mapping
    from lopd.utils import atomic_write_text

    merged = deep_merge(read_yaml_mapping(args.params, "params file"), read_yaml_mapping(args.profile_file, "profile"))
    parse_params(merged, f"{args.params} + {args.profile_file}")
    atomic_write_text(args.out, yaml.safe_dump(merged, sort_keys=False))
    print(f"wrote {args.out}")
    return 0


def _repro(args) -> int:
    """``lopd repro``: the guarded ``dvc repro``; after a whole repro (no stage named) that succeeded,
    the experiment's MLflow parent is closed with the report even if DVC skipped the report stage.

    A whole repro (no argument for DVC) whose workspace still matches the stamp the last whole repro
    left (:mod:`lopd.workflow.stamp`) runs neither DVC nor MLflow: nothing either would read has
    changed. ``--by-hash`` skips that check."""
    from pathlib import Path

    from lopd.config import load_params
    from lopd.paths import Paths
    from lopd.workflow import stamp
    from lopd.workflow.lockguard import Busy, dvc_locks_held, find_root, guarded_repro

    whole = not args.dvc_args
    root = find_root(Path.cwd())
    if whole and root is not None and not args.by_hash and (last := stamp.unchanged(root)) is not None:
        try:
            with dvc_locks_held(root):
                pass
        except Busy:
            last = None  # DVC runs here: the guarded path says so
        if last is not None:
            print(f"Data and pipelines are up to date (lopd: nothing DVC reads has changed since the whole "
                  f"repro of {last['written']}; `lopd repro --by-hash` has DVC check every hash).")
            return 0
    rc = guarded_repro(args.dvc_args)
    if rc != 0 or any(not a.startswith("-") for a in args.dvc_args):
        return rc
    from lopd.tracking import close_experiment

    params = load_params(args.params, args.profile)
    state = close_experiment(params, Paths.for_params(args.params).root)
    if state not in ("already finished", "no report"):  # the report stage closed it, or there is none
        print(f"lopd repro: MLflow experiment parent: {state} (DVC skipped the report stage)")
    if whole and root is not None and (state in ("ok", "already finished", "no report")):
        stamp.write(root, params.tracking.uri)
    return rc
