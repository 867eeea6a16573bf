"""In-process dispatch of a ``lopd`` command line to its stage: argument parsing, params validation,
the stage's run, its timing side file and (under ``LOPD_RECORD_DIR``) its declared = read record.

Both the ``lopd`` command (:mod:`lopd.cli`, when it runs a stage in its own process) and a warm
worker's stage child (:mod:`lopd.warm`) call :func:`run_in_process`; neither imports the other for it.

Bad input (invalid params, missing or corrupt files, a forbidden split, an unknown arm)
exits with status 2 and one message naming the cause; a failed run exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from typing import TYPE_CHECKING

from lopd.arms import get_arm
from lopd.compat.kernels import kernel_record
from lopd.config import load_params, record_reads, recorded_reads, unrecorded
from lopd.errors import BadInput, RunFailed
from lopd.paths import Paths
from lopd.stages.registry import COMMANDS, command
from lopd.utils import atomic_write_text, write_json
from lopd.workflow.lockguard import snapshot_for_stage

if TYPE_CHECKING:
    from lopd.config import Params


# deprecation chatter from transformers/peft internals says nothing about our runs
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*requires_grad.*converted to a Python scalar.*")

STAGE_COMMANDS = frozenset(c.name for c in COMMANDS)
TOOLS_MODULE = "lopd.workflow.tools"  # by name: see _dispatch
LAUNCH_MODULE = "lopd.launch.main"

DESCRIPTION = """``lopd`` command line: one subcommand per pipeline stage plus tools.

Bad input (invalid params, missing or corrupt files, a forbidden split, an unknown arm)
exits with status 2 and one message naming the cause; a failed run exits 1."""


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per registered stage command (:data:`lopd.stages.registry.COMMANDS`)
    plus the tools around the pipeline."""
    p = argparse.ArgumentParser(prog="lopd", description=DESCRIPTION)
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml); its directory "
                                                           "is the root of every input and output")
    p.add_argument("--profile", default=None, help="a profile YAML merged over the params file")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("validate", help="validate the params and exit")
    for cmd in COMMANDS:
        sp = sub.add_parser(cmd.name, help=cmd.help)
        for arg in cmd.args:
            arg.add_to(sp)
    sub.add_parser("launch", help="run the out-of-date stages on a Ray cluster, then fan in (lopd launch --help)")
    r = sub.add_parser("repro", help="dvc repro, after checking dvc.lock (a torn lock is restored from the last "
                                     "complete snapshot) and clearing stale DVC locks")
    r.add_argument("--by-hash", action="store_true", help="let DVC hash every dependency and output even when "
                                                         "the workspace matches the last whole repro's stamp")
    r.add_argument("dvc_args", nargs=argparse.REMAINDER, help="passed to dvc repro")
    v = sub.add_parser("verify", help="rerun stages in a scratch copy and print, per output, whether it is "
                                      "identical to the committed dvc.lock (the workspace is not touched)")
    v.add_argument("stages", nargs="*", help="dvc.yaml stages (default: prepare base bank bank_draw@0)")
    v.add_argument("--keep", action="store_true", help="keep the scratch copy")
    sub.add_parser("lock-status", help="exit 1 (naming each difference) when the committed dvc.lock does not describe "
                                       "this tree: a code, params or committed dep changed, or a committed report")
    g = sub.add_parser("dvc-yaml", help="write dvc.yaml from the stage registry (lopd/stages/registry.py), its code "
                                        "deps from the import graph")
    g.add_argument("--check", action="store_true", help="write nothing; exit 1 if dvc.yaml differs from the registry")
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
    elif args.cmd == "repro":  # DVC's options before any target (``-f``, ``-s``) are not lopd's
        args.dvc_args = extra + args.dvc_args
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def runs_stage(cmd: str) -> bool:
    """Whether ``lopd <cmd>`` runs stage code (a registered command): the warm worker serves only those."""
    return cmd in STAGE_COMMANDS


def run_in_process(argv: list[str]) -> int:
    if argv[:1] == ["launch"]:  # the cluster launcher has its own options (lopd launch --help)
        return importlib.import_module(LAUNCH_MODULE).main(argv[1:])
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
        _write_record(recorded_reads(), args)


def _dispatch(args, start_recording=lambda: None) -> int:
    """Run a registered stage command (or ``validate``); any other command is a tool
    (:mod:`lopd.workflow.tools`, imported by name: a stage's process never runs one, so its code is
    not among any stage's deps)."""
    if args.cmd != "validate" and not runs_stage(args.cmd):
        return importlib.import_module(TOOLS_MODULE).run(args)
    if args.cmd == "validate":
        load_params(args.params, args.profile)
        print("params OK")
        return 0
    paths, cmd = Paths.for_params(args.params), command(args.cmd)
    # a command that hashes params raw (lopd fingerprint) reads none through the config
    params = load_params(args.params, args.profile) if cmd.loads_params else None
    start_recording()  # after validation: the schema's cross-section checks are not a stage's reads
    if params is not None:
        _check_arm_and_seed(params, args)
    inputs = (paths,) if params is None else (params, paths)
    run = importlib.import_module(cmd.module).run
    snapshot_for_stage()  # under DVC: keep the dvc.lock DVC finished writing before this stage (lopd/workflow/lockguard.py)
    with _timed(paths, args.cmd):
        run(*inputs, **{a.dest: getattr(args, a.dest) for a in cmd.args})
    return 0


def _check_arm_and_seed(params: Params, args) -> None:
    """Before anything is written: an unknown arm, a seed that is not one of the arm's (``train.seeds``,
    plus ``train.extra_seeds`` for ``train.extra_arms``), or an upstream draw (``--draw``) that is not a
    seed of the final runs, is bad input."""
    if args.cmd in ("bank", "cold-start") and args.draw is not None:
        with unrecorded():  # the dvc.yaml matrix guarantees it, as for train
            final = [*params.train.seeds, *params.train.extra_seeds]
        if args.draw not in final:
            raise BadInput(f"draw {args.draw} is not a seed of the final runs "
                           f"(train.seeds + train.extra_seeds {final})")
    if args.cmd not in ("train", "evaluate"):
        return
    get_arm(args.arm)
    if args.seed is None:
        return
    with unrecorded():  # a hand-run check: the dvc.yaml stages run every seed of an arm
        if args.seed not in params.train.seeds_of(args.arm):
            raise BadInput(f"seed {args.seed} is not in train.seeds {params.train.seeds}"
                           + (f" or train.extra_seeds {params.train.extra_seeds}" if args.arm in params.train.extra_arms else ""))


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
    return kernel_record()


# --------------------------------------------------------------------------- declared = read
def _start_recording() -> set | None:
    """With ``LOPD_RECORD_DIR`` set, record every params key this stage reads."""
    if not os.environ.get("LOPD_RECORD_DIR"):
        return None
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

    record_reads(None)
    client = os.environ.get(CLIENT_MODULES_ENV, "")
    files = sorted(set(imported_lopd_files()) | set(client.split(os.pathsep) if client else ()))
    stage = os.environ.get("DVC_STAGE") or args.cmd
    atomic_write_text(Path(os.environ["LOPD_RECORD_DIR"]) / f"{stage}.json",
                      json.dumps({"stage": stage, "params": sorted(reads), "modules": files}, indent=1))
