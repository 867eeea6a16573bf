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

from lopd.compat.kernels import pin_kernels  # noqa: E402

# before torch computes anything, here and in the warm worker this command may start (it inherits the
# environment): the same CPU kernels on every x86-64 machine, whatever the parent environment says
pin_kernels()

from lopd.dispatch import parse, run_in_process, runs_stage  # noqa: E402 - after the kernels are pinned


def main(argv: list[str] | None = None) -> int:
    """Console entry point. Under ``dvc repro`` (and only when called as a command) the stage runs
    in the warm worker; otherwise in this process."""
    import time

    from lopd import warm
    from lopd.utils import process_start_time

    # this process's start, for the start-up figure (a warm child gets it in the client's environment);
    # overwritten, never inherited: a parent that ran lopd in-process (a test) must not lend its own
    try:
        t0 = process_start_time()
    except OSError:  # no /proc: now
        t0 = None
    os.environ["LOPD_T0"] = repr(time.time() if t0 is None else t0)
    if warm.wanted(argv) and sys.argv[1:2] != ["launch"]:
        args = sys.argv[1:]
        ns = parse(args)  # usage errors are reported here, not in the worker
        if runs_stage(ns.cmd):  # a registered stage command (lopd/stages/registry.py); tools run here
            rc = warm.run_client(args)
            if rc != -1:
                return rc
    return run_in_process(sys.argv[1:] if argv is None else argv)


__all__ = ["main", "run_in_process"]


if __name__ == "__main__":
    sys.exit(main())
