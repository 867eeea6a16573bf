"""``lopd`` command line: one subcommand per pipeline stage plus tools.

``dvc.yaml`` calls these directly (``lopd train --arm lopd --seed 3``). Under ``dvc repro`` a stage
runs in a fork of a warm worker that imported the ML stack once (:mod:`lopd.warm`).

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

from lopd.kernels import pin_kernels  # noqa: E402

# before torch computes anything, here and in the warm worker this command may start (it inherits the
# environment): the same CPU kernels on every x86-64 machine, whatever the parent environment says
pin_kernels()

import warnings  # noqa: E402

# deprecation chatter from transformers/peft internals says nothing about our runs
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*requires_grad.*converted to a Python scalar.*")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lopd", description=__doc__)
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml); its directory "
                                                           "is the root of every input and output")
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
    for name, text in (("train", "train one arm with one seed"),
                       ("evaluate", "evaluate one trained student on the test split")):
        t = sub.add_parser(name, help=text)
        t.add_argument("--arm", required=True)
        t.add_argument("--seed", type=int, required=True)
    sub.add_parser("sensitivity", help="validation sensitivity grid around the selected point")
    sub.add_parser("report", help="tables, figures and audits under reports/")
    f = sub.add_parser("fingerprint", help="hash the code deps and params values a dvc.yaml stage declares "
                                           "(code_train, code_evaluate) into that stage's output")
    f.add_argument("stage", help="the dvc.yaml stage whose deps are hashed, e.g. code_train")
    sub.add_parser("launch", help="run the out-of-date stages on a Ray cluster, then fan in (lopd launch --help)")
    r = sub.add_parser("repro", help="dvc repro, after checking dvc.lock (a torn lock is restored from the last "
                                     "complete snapshot) and clearing stale DVC locks")
    r.add_argument("dvc_args", nargs=argparse.REMAINDER, help="passed to dvc repro")
    m = sub.add_parser("make-standin", help="build the offline Qwen3-0.6B-shaped stand-in (random weights, a locally "
                                            "trained BPE tokenizer) under models/external/")
    m.add_argument("--out", default=None, help="target directory (default: models/external/qwen3-0.6b-standin)")
    a = sub.add_parser("apply-profile", help="write params merged with a profile to a file")
    a.add_argument("profile_file")
    a.add_argument("--out", default="params.yaml")
    return p


def process_start_time(pid: int | None = None) -> float:
    """Wall-clock time (epoch s) at which a process started, from /proc; now if unavailable.

    /proc gives the start in clock ticks since boot. The boot's epoch is taken as now minus
    ``CLOCK_BOOTTIME`` (sub-millisecond), not /proc/stat's ``btime``: that is whole seconds,
    truncated, and would make every process look up to 1 s older (0.94 s on one machine, i.e.
    0.94 s of phantom start-up per stage)."""
    import time

    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def main(argv: list[str] | None = None) -> int:
    """Console entry point. Under ``dvc repro`` (and only when called as a command) the stage runs
    in the warm worker; otherwise in this process."""
    from lopd import warm

    # this process's start, for the start-up figure (a warm child gets it in the client's environment);
    # overwritten, never inherited: a parent that ran lopd in-process (a test) must not lend its own
    os.environ["LOPD_T0"] = repr(process_start_time())
    if warm.wanted(argv) and sys.argv[1:2] != ["launch"]:
        args = sys.argv[1:]
        ns = _parser().parse_args(args)  # usage errors are reported here, not in the worker
        if ns.cmd not in ("validate", "apply-profile", "repro"):
            rc = warm.run_client(args)
            if rc != -1:
                return rc
    return run_in_process(sys.argv[1:] if argv is None else argv)


def run_in_process(argv: list[str]) -> int:
    from lopd.errors import BadInput, RunFailed

    if argv[:1] == ["launch"]:  # the cluster launcher has its own options (lopd launch --help)
        from lopd.launch.run import main as launch_main

        return launch_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args, _start_recording)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"run failed: {e}", file=sys.stderr)
        return 1
    finally:
        from lopd.config import _READS

        _write_record(_READS, args)


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
        from lopd.lockguard import guarded_repro

        return guarded_repro(args.dvc_args)
    if args.cmd == "fingerprint":
        return _fingerprint(args, start_recording)
    params = load_params(args.params, args.profile)
    start_recording()  # after validation: the schema's cross-section checks are not a stage's reads
    if args.cmd == "validate":
        print("params OK")
        return 0
    paths = Paths.for_params(args.params)
    if args.cmd == "make-standin":
        from lopd.model.standin import make_standin

        return make_standin(params, paths.root, args.out)
    stage = importlib.import_module(f"lopd.stages.{args.cmd.replace('-', '_')}")
    _check_arm_and_seed(params, args)
    from lopd.lockguard import snapshot_for_stage

    snapshot_for_stage()  # under DVC: keep the dvc.lock DVC finished writing before this stage (issue 16)
    with _timed(paths, args.cmd):
        _run_stage(stage, params, paths, args)
    return 0


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
    snapshot_for_stage()  # under DVC: as every stage does (issue 16)
    with _timed(paths, args.cmd):
        out, fp = write_code_fingerprint(paths.root, args.stage)
    print(f"{args.stage}: {len(fp['files'])} files, sha256 {fp['sha256'][:16]}… -> {os.path.relpath(out, paths.root)}")
    return 0


def _check_arm_and_seed(params, args) -> None:
    """Before anything is written: an unknown arm, or a seed that is not one of the arm's
    (``train.seeds``, plus ``train.extra_seeds`` for ``train.extra_arms``), is bad input."""
    if args.cmd not in ("train", "evaluate"):
        return
    from lopd.arms import get_arm
    from lopd.config import unrecorded
    from lopd.errors import BadInput

    get_arm(args.arm)
    with unrecorded():  # the dvc.yaml matrix guarantees it; declaring train.seeds would rerun every seed
        if args.seed not in params.train.seeds_of(args.arm):
            raise BadInput(f"seed {args.seed} is not in train.seeds {params.train.seeds}"
                           + (f" or train.extra_seeds {params.train.extra_seeds}" if args.arm in params.train.extra_arms else ""))


def _run_stage(stage, params, paths, args) -> None:
    if args.cmd in ("train", "evaluate"):
        stage.run(params, paths, args.arm, args.seed)
    elif args.cmd == "hpo":
        stage.run(params, paths, worker=args.worker, storage=args.storage, n_trials=args.n_trials)
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


def _write_record(reads: set | None, args) -> None:
    """Write ``<LOPD_RECORD_DIR>/<stage>.json``: params keys read and ``lopd`` source files imported."""
    if reads is None:
        return
    import json
    from pathlib import Path

    from lopd.config import record_reads

    record_reads(None)
    pkg = Path(__file__).resolve().parent
    files = sorted({str(Path(m.__file__).resolve().relative_to(pkg.parent)) for name, m in list(sys.modules.items())
                    if name.split(".")[0] == "lopd" and getattr(m, "__file__", None)})
    stage = os.environ.get("DVC_STAGE") or args.cmd
    out = Path(os.environ["LOPD_RECORD_DIR"]) / f"{stage}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"stage": stage, "params": sorted(reads), "modules": files}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
