"""``lopd`` command line (the console script): one subcommand per pipeline stage plus tools.

``dvc.yaml`` calls these directly (``lopd train --arm lopd --seed 3``). Under ``dvc repro`` a stage
runs in a fork of a warm worker that imported the ML stack once (:mod:`lopd.warm`).

Bad input (invalid params, missing or corrupt files, a forbidden split, an unknown arm)
exits with status 2 and one message naming the cause; a failed run exits 1.
"""

from __future__ import annotations

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

from lopd.dispatch import parse, run_in_process  # noqa: E402 - after the kernels are pinned


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
        ns = parse(args)  # usage errors are reported here, not in the worker
        if ns.cmd not in ("validate", "apply-profile", "repro", "exp", "params", "doctor"):
            rc = warm.run_client(args)
            if rc != -1:
                return rc
    return run_in_process(sys.argv[1:] if argv is None else argv)


__all__ = ["main", "process_start_time", "run_in_process"]


if __name__ == "__main__":
    sys.exit(main())
