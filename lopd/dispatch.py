"""In-process dispatch of a ``lopd`` command line to its stage: argument parsing, params validation,
the stage's run, its timing side file and (under ``LOPD_RECORD_DIR``) its declared = read record.

Both the ``lopd`` command (:mod:`lopd.cli`, when it runs a stage in its own process) and a warm
worker's stage child (:mod:`lopd.warm`) call :func:`run_in_process`; neither imports the other for it.

Bad input (invalid params, missing or corrupt files, a forbidden split, an unknown arm)
exits with status 2 and one message naming the cause; a failed run exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

# deprecation chatter from transformers/peft internals says nothing about our runs
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*requires_grad.*converted to a Python scalar.*")

DESCRIPTION = """``lopd`` command line: one subcommand per pipeline stage plus tools.

Bad input (invalid params, missing or corrupt files, a forbidden split, an unknown arm)
exits with status 2 and one message naming the cause; a failed run exits 1."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lopd", description=DESCRIPTION)
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml); its directory "
                                                           "is the root of every input and output")
    p.add_argument("--profile", default=None, help="a profile YAML merged over the params file")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("validate", help="validate the params and exit")
    sub.add_parser("prepare", help="write the sealed train/val/test splits")
    sub.add_parser("base", help="train (or fingerprint) the base policy and evaluate it on val")
    for name, text in (("bank", "build the experience bank from base rollouts on train"),
                       ("cold-start", "composer cold start (phi0)")):
        d = sub.add_parser(name, help=text)
        d.add_argument("--draw", type=int, default=None, help="upstream draw of the final runs' training seed DRAW "
                       "(models/draws/); default: the shared draw (models/bank, models/cold_start)")
    sub.add_parser("probe", help="privilege probe: teacher delta with relevant/shuffled/none context on val")
    h = sub.add_parser("hpo", help="validation-only search over margin, K, n_ret")
    h.add_argument("--worker", action="store_true", help="join the existing study as an extra worker")
    h.add_argument("--storage", default=None, help="Optuna storage URL (default: the journal file)")
    h.add_argument("--n-trials", type=int, default=None, help="the study's budget of finished trials, shared by the stage and every "
                                                                "worker: each stops once it is reached (default: hpo.n_trials)")
    for name, text in (("train", "train every seed of one arm, as one population"),
                       ("evaluate", "evaluate every trained seed of one arm on the test split")):
        t = sub.add_parser(name, help=text)
        t.add_argument("--arm", required=True)
        t.add_argument("--seed", type=int, default=None, help="that seed only, alone (train: the path of a run "
                                                                 "across processes)")
    sub.add_parser("sensitivity", help="validation sensitivity grid around the selected point")
    sub.add_parser("confirm-split", help="write the sealed confirmatory test split (no prompt or solution of "
                                         "train, val or test)")
    sub.add_parser("register", help="write registration/registration.json: the rule, S, arms, seeds, effect, "
                                    "design, before any confirmatory read")
    c = sub.add_parser("confirm-draw", help="the bank and cold start of one confirmation seed")
    c.add_argument("--seed", type=int, required=True)
    c = sub.add_parser("confirm-train", help="the rule's arms at one point of S on every confirmation seed")
    c.add_argument("--slot", type=int, required=True, help="the slot of S (confirm.points)")
    sub.add_parser("confirm-evaluate", help="evaluate the confirmation's students on the confirmatory split "
                                            "(refuses without registration.json)")
    sub.add_parser("report", help="tables, figures and audits under reports/")
    f = sub.add_parser("fingerprint", help="hash the code deps and params values a dvc.yaml stage declares "
                                           "(code_train, code_evaluate) into that stage's output")
    f.add_argument("stage", help="the dvc.yaml stage whose deps are hashed, e.g. code_train")
    sub.add_parser("launch", help="run the out-of-date stages on a Ray cluster, then fan in (lopd launch --help)")
    r = sub.add_parser("repro", help="dvc repro, after checking dvc.lock (a torn lock is restored from the last "
                                     "complete snapshot) and clearing stale DVC locks")
    r.add_argument("dvc_args", nargs=argparse.REMAINDER, help="passed to dvc repro")
    v = sub.add_parser("verify", help="rerun stages in a scratch copy and print, per output, whether it is "
                                      "identical to the committed dvc.lock (the workspace is not touched)")
    v.add_argument("stages", nargs="*", help="dvc.yaml stages (default: prepare base bank bank_draw@0)")
    v.add_argument("--keep", action="store_true", help="keep the scratch copy")
    m = sub.add_parser("make-standin", help="build the offline Qwen3-0.6B-shaped stand-in (random weights, a locally "
                                            "trained BPE tokenizer) under models/external/")
    m.add_argument("--out", default=None, help="target directory (default: models/external/qwen3-0.6b-standin)")
    _tool_parsers(sub)
    a = sub.add_parser("apply-profile", help="write params merged with a profile to a file")
    a.add_argument("profile_file")
    a.add_argument("--out", default="params.yaml")
    return p


def _tool_parsers(sub) -> None:
    """``lopd exp run``, ``lopd params``, ``lopd doctor``: tools around the pipeline, no stage."""
    x = sub.add_parser("exp", help="dvc exp run with a profile's values as -S overrides, behind the lock guard "
                                   "(params.yaml stays as committed; dvc exp show lists the run)")
    x.add_argument("action", choices=["run"])
    x.add_argument("--profile", dest="exp_profile", default=None, help="a profile YAML (e.g. profiles/smoke.yaml)")
    x.epilog = "Any other argument is passed to dvc exp run (e.g. -n NAME)."
    v = sub.add_parser("params", help="print the effective params with each key's description, marking keys "
                                      "that differ from the committed params.yaml")
    v.add_argument("sections", nargs="*", help="only these sections (default: all)")
    v.add_argument("--profile", dest="params_profile", default=None, help="a profile YAML merged over the params")
    v.add_argument("-S", "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one key (value as YAML), like dvc exp run -S; repeatable")
    d = sub.add_parser("doctor", help="check and repair what the lock guard handles after a bare dvc repro / "
                                      "dvc exp run: a torn dvc.lock, stale DVC locks, stale MLflow runs")
    d.add_argument("--no-mlflow", action="store_true", help="leave the MLflow store alone")


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; ``lopd exp run`` passes the arguments it does not know to ``dvc exp run``
    (wherever they stand: ``-n NAME --profile P`` works as well as ``--profile P -n NAME``)."""
    p = parser()
    args, extra = p.parse_known_args(argv)
    if args.cmd == "exp":
        args.dvc_args = extra
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def run_in_process(argv: list[str]) -> int:
    from lopd.errors import BadInput, RunFailed

    if argv[:1] == ["launch"]:  # the cluster launcher has its own options (lopd launch --help)
        from lopd.launch.main import main as launch_main

        return launch_main(argv[1:])
    args = parse(argv)
    try:
        return _dispatch(args, _start_recording)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"run failed: {e}", file=sys.stderr)
        return 1
    finally:
        from lopd.config import recorded_reads

        _write_record(recorded_reads(), args)


def _apply_profile(args) -> int:
    import yaml

    from lopd.config import deep_merge, parse_params, read_yaml_mapping
    from lopd.utils import atomic_write_text

    merged = deep_merge(read_yaml_mapping(args.params, "params file"), read_yaml_mapping(args.profile_file, "profile"))
    parse_params(merged, f"{args.params} + {args.profile_file}")
    atomic_write_text(args.out, yaml.safe_dump(merged, sort_keys=False))
    print(f"wrote {args.out}")
    return 0


def _dispatch(args, start_recording=lambda: None) -> int:
    import importlib

    from lopd.config import load_params
    from lopd.paths import Paths

    if args.cmd == "apply-profile":
        return _apply_profile(args)
    if args.cmd == "repro":
        return _repro(args)
    if args.cmd == "verify":
        from lopd.verify import verify

        return verify(Paths.for_params(args.params).root, args.stages or None, keep=args.keep)
    if args.cmd == "fingerprint":
        return _fingerprint(args, start_recording)
    if args.cmd in ("exp", "params", "doctor"):
        return _tool(args)
    params = load_params(args.params, args.profile)
    start_recording()  # after validation: the schema's cross-section checks are not a stage's reads
    if args.cmd == "validate":
        print("params OK")
        return 0
    paths = Paths.for_params(args.params)
    if args.cmd == "make-standin":
        from lopd.training.standin import make_standin

        return make_standin(params, paths.root, args.out)
    stage = importlib.import_module(f"lopd.stages.{args.cmd.replace('-', '_')}")
    _check_arm_and_seed(params, args)
    from lopd.lockguard import snapshot_for_stage

    snapshot_for_stage()  # under DVC: keep the dvc.lock DVC finished writing before this stage (lopd/lockguard.py)
    with _timed(paths, args.cmd):
        _run_stage(stage, params, paths, args)
    return 0


def _repro(args) -> int:
    """``lopd repro``: the guarded ``dvc repro``; after a whole repro (no stage named) that succeeded,
    the experiment's MLflow parent is closed with the report even if DVC skipped the report stage."""
    from lopd.config import load_params
    from lopd.lockguard import guarded_repro
    from lopd.paths import Paths

    rc = guarded_repro(args.dvc_args)
    if rc != 0 or any(not a.startswith("-") for a in args.dvc_args):
        return rc
    from lopd.tracking import close_experiment

    state = close_experiment(load_params(args.params, args.profile), Paths.for_params(args.params).root)
    if state not in ("already finished", "no report"):  # the report stage closed it, or there is none
        print(f"lopd repro: MLflow experiment parent: {state} (DVC skipped the report stage)")
    return rc


def _tool(args) -> int:
    if args.cmd == "exp":
        from lopd.experiment import run_profile_experiment

        return run_profile_experiment(args.params, args.exp_profile or args.profile, args.dvc_args)
    if args.cmd == "params":
        from lopd.params_view import show

        return show(args.params, args.params_profile or args.profile, args.overrides, args.sections)
    from lopd.doctor import doctor

    return doctor(args.params, mlflow=not args.no_mlflow)


def _fingerprint(args, start_recording) -> int:
    """``lopd fingerprint <stage>``: the code stage of a matrix stage kind (dvc.yaml ``code_train``,
    ``code_evaluate``). It hashes the code deps and the values of the params its
    stanza declares: what the kind's items read, which DVC then checks once here, not once per item.
    It reads the params raw, not through the validated config, so none is recorded as read; the
    modules it imports (this one, lopd.utils, lopd.config and what every stage imports) are among
    the deps it hashes, so a change to them reruns it too."""
    from lopd.lockguard import snapshot_for_stage
    from lopd.paths import Paths
    from lopd.utils import write_code_fingerprint

    start_recording()
    paths = Paths.for_params(args.params)
    snapshot_for_stage()  # under DVC: as every stage does
    with _timed(paths, args.cmd):
        out, fp = write_code_fingerprint(paths.root, args.stage)
    print(f"{args.stage}: {len(fp['files'])} files, sha256 {fp['sha256'][:16]}… -> {os.path.relpath(out, paths.root)}")
    return 0


def _check_arm_and_seed(params, args) -> None:
    """Before anything is written: an unknown arm, a seed that is not one of the arm's (``train.seeds``,
    plus ``train.extra_seeds`` for ``train.extra_arms``), or an upstream draw (``--draw``) that is not a
    seed of the final runs, is bad input."""
    from lopd.config import unrecorded
    from lopd.errors import BadInput

    if args.cmd in ("bank", "cold-start") and args.draw is not None:
        with unrecorded():  # the dvc.yaml matrix guarantees it, as for train
            final = [*params.train.seeds, *params.train.extra_seeds]
        if args.draw not in final:
            raise BadInput(f"draw {args.draw} is not a seed of the final runs "
                           f"(train.seeds + train.extra_seeds {final})")
    if args.cmd not in ("train", "evaluate"):
        return
    from lopd.arms import get_arm

    get_arm(args.arm)
    if args.seed is None:
        return
    with unrecorded():  # a hand-run check: the dvc.yaml stages run every seed of an arm
        if args.seed not in params.train.seeds_of(args.arm):
            raise BadInput(f"seed {args.seed} is not in train.seeds {params.train.seeds}"
                           + (f" or train.extra_seeds {params.train.extra_seeds}" if args.arm in params.train.extra_arms else ""))


def _run_stage(stage, params, paths, args) -> None:
    if args.cmd in ("train", "evaluate"):
        stage.run(params, paths, args.arm, args.seed)
    elif args.cmd == "hpo":
        stage.run(params, paths, worker=args.worker, storage=args.storage, n_trials=args.n_trials)
    elif args.cmd in ("bank", "cold-start"):
        stage.run(params, paths, draw=args.draw)
    elif args.cmd == "confirm-draw":
        stage.run(params, paths, args.seed)
    elif args.cmd == "confirm-train":
        stage.run(params, paths, args.slot)
    else:
        stage.run(params, paths)


class _timed:
    """Side file ``.lopd/timing/<stage>.json`` (not a DVC output): when the process started, when the
    stage's work began and ended, and the CPU seconds of that work (its subprocesses included), for
    ``bench/pipeline.sh``'s start-up and useful-work figures."""

    def __init__(self, paths, cmd: str):
        self.paths, self.cmd = paths, cmd

    def __enter__(self):
        import resource
        import time

        self.t0 = time.time()
        self.ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]

    def __exit__(self, exc_type, *exc):
        import resource
        import time

        from lopd.utils import write_json

        if exc_type is not None:
            return  # a failed stage leaves no timing record (nor anything else a rerun could trust)
        ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        cpu = sum(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime for a, b in zip(self.ru, ru))
        stage = os.environ.get("DVC_STAGE") or self.cmd
        write_json(self.paths.root / ".lopd" / "timing" / f"{stage.replace('@', '-')}.json",
                   {"stage": stage, "kind": self.cmd, "t_process": float(os.environ.get("LOPD_T0", self.t0)),
                    "t_work": self.t0, "t_end": time.time(), "cpu_work": cpu,
                    "warm": os.environ.get("LOPD_IN_WARM") == "1", "kernels": _kernels()})


def _kernels() -> dict:
    """The kernels the stage actually ran with (empty for a stage that never imported torch)."""
    if "torch" not in sys.modules:
        return {}
    from lopd.kernels import kernel_record

    return kernel_record()


# --------------------------------------------------------------------------- declared = read
def _start_recording() -> set | None:
    """With ``LOPD_RECORD_DIR`` set, record every params key this stage reads."""
    if not os.environ.get("LOPD_RECORD_DIR"):
        return None
    from lopd.config import record_reads

    reads: set[str] = set()
    record_reads(reads)
    return reads


CLIENT_MODULES_ENV = "LOPD_RECORD_CLIENT_MODULES"  # set by a warm client: the lopd files it imported


def imported_lopd_files() -> list[str]:
    """The ``lopd`` source files this process has imported, relative to the repository root."""
    from pathlib import Path

    pkg = Path(__file__).resolve().parent
    return sorted({str(Path(m.__file__).resolve().relative_to(pkg.parent)) for name, m in list(sys.modules.items())
                   if name.split(".")[0] == "lopd" and getattr(m, "__file__", None)})


def _write_record(reads: set | None, args) -> None:
    """Write ``<LOPD_RECORD_DIR>/<stage>.json``: params keys read and ``lopd`` source files imported."""
    if reads is None:
        return
    import json
    from pathlib import Path

    from lopd.config import record_reads
    from lopd.utils import atomic_write_text

    record_reads(None)
    client = os.environ.get(CLIENT_MODULES_ENV, "")
    files = sorted(set(imported_lopd_files()) | set(client.split(os.pathsep) if client else ()))
    stage = os.environ.get("DVC_STAGE") or args.cmd
    atomic_write_text(Path(os.environ["LOPD_RECORD_DIR"]) / f"{stage}.json",
                      json.dumps({"stage": stage, "params": sorted(reads), "modules": files}, indent=1))
