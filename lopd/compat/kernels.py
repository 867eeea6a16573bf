"""Pinned CPU kernels: the same arithmetic, hence the same bits, on x86-64 CPUs with AVX2 of one vendor.

PyTorch, MKL and oneDNN each pick their vectorised kernels by the CPU's instruction set at run
time, and the kernels sum in different orders: one computation (matmul, softmax, layer_norm)
gives different bits under AVX-512, AVX2 and the scalar default on one machine, and the base
policy's thousands of steps amplify one bit into a different model. So every stage process pins,
before torch computes anything:

- ``ATEN_CPU_CAPABILITY=avx2`` (ATen's vectorised kernels; read lazily at the first dispatch);
- ``MKL_CBWR=AVX2`` (MKL's conditional numerical reproducibility on the AVX2 code path: Intel
  promises the same bits on every *Intel* CPU with AVX2, and AMD EPYC machines have matched each
  other; across the two vendors the bits differ, measured: ``tests/e2e/test_golden.py`` keeps one
  reference per vendor; ``MKL_CBWR=COMPATIBLE`` would be the cross-vendor branch);
- ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's ISA cap);
- the thread counts (:func:`pin_threads`: torch's intra-op pool, OpenMP and MKL), because a
  parallel reduction's order depends on how many threads split it.

The values are *set*, not defaulted: a parent environment (a user's shell, a CI runner) cannot
change what a stage computes. AVX2 is on essentially every x86-64 server since 2013; a CPU
without it (or another architecture) runs its own kernels and gets a clear message that its
results will differ bitwise from the committed ones. GPUs are out of scope: CUDA kernels are only
reproducible on one GPU model and driver.
"""

from __future__ import annotations

import os
import platform
import sys

PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_STATE: dict = {"pinned": None, "warned": False}


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo has none, e.g. another architecture)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def can_pin(machine: str | None = None, flags: set[str] | None = None) -> bool:
    """True where the AVX2 pin is available: an x86-64 CPU that has AVX2 and FMA."""
    machine = (machine or platform.machine()).lower()
    flags = cpu_flags() if flags is None else flags
    return machine in ("x86_64", "amd64") and {"avx2", "fma"} <= flags


def pin_kernels(env: os._Environ | dict | None = None) -> bool:
    """Set the kernel pins in ``env`` (default ``os.environ``), overriding whatever a parent set.

    Must run before torch's first computation in this process (ATen reads its capability once,
    lazily). Returns True when pinned; on a CPU without AVX2 it removes any inherited pin (an
    ``avx2`` request there would be ignored with a warning anyway), prints once that results will
    differ, and returns False."""
    env = os.environ if env is None else env
    ok = can_pin()
    if ok:
        env.update(PINNED_ENV)
    else:
        for key in PINNED_ENV:
            env.pop(key, None)
        if not _STATE["warned"]:
            _STATE["warned"] = True
            print(f"lopd: this CPU ({platform.machine()}) has no AVX2: kernels are not pinned, so results here "
                  "will differ bitwise from those of the committed run (bitwise reproducibility holds on x86-64 "
                  "CPUs with AVX2)", file=sys.stderr)
    _STATE["pinned"] = ok
    return ok


def pin_threads(n: int) -> None:
    """Fix torch's intra-op thread count (which also sets OpenMP's and MKL's) and export it for
    subprocesses."""
    import torch

    torch.set_num_threads(int(n))
    for key in THREAD_ENV:
        os.environ[key] = str(int(n))


def kernel_record() -> dict:
    """What this process actually computes with, for a stage's side file."""
    import torch

    return {
        "pinned": bool(_STATE["pinned"]),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "torch": torch.__version__,
    }


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed python, numpy and torch; fix the thread count (CPU float reductions depend on it)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if threads:
        pin_threads(threads)
