"""Does a kernel pin give the same bits whatever the CPU's vendor? A probe from one Intel machine.

    python bench/vendor_probe.py [--branches AVX2 COMPATIBLE] [--base WORKSPACE]

MKL picks its code path by the CPUID vendor string. ``bench/cpuid_amd.c`` (an ``LD_PRELOAD`` shim, built here
with gcc into ``bench/out/``) makes a process see ``AuthenticAMD`` through CPUID faulting, so MKL takes the
path it takes on AMD, at native speed. For each ``MKL_CBWR`` branch the probe hashes matmuls, softmax and
layer_norm of fixed random inputs (4 shapes, 1 thread, the rest of the pin as :mod:`lopd.compat.kernels` sets
it), natively and under the shim, and says whether the two agree. With ``--base WORKSPACE`` (a smoke workspace
after ``lopd prepare``) it also runs ``lopd base`` under the shim in a copy and prints the model's sha256, to
compare with ``tests/golden/smoke_outputs.AuthenticAMD.json``: that is the test of whether the shim stands for a
real AMD machine. Needs an x86-64 Intel CPU with the ``cpuid_fault`` flag (a KVM guest has it) and gcc.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIM_SRC = REPO / "bench" / "cpuid_amd.c"
SHIM = REPO / "bench" / "out" / "cpuid_amd.so"

KERNELS = r"""
import hashlib, os, sys
sys.path.insert(0, sys.argv[1])
from lopd.compat.kernels import pin_kernels
pin_kernels()
os.environ["MKL_CBWR"] = sys.argv[2]
import torch
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
h = hashlib.sha256()
for m, k, n in [(64, 256, 256), (512, 128, 384), (37, 1000, 77), (256, 256, 1024)]:
    c = torch.randn(m, k, generator=g) @ torch.randn(k, n, generator=g)
    for t in (c, torch.softmax(c, -1), torch.nn.functional.layer_norm(c, (n,))):
        h.update(t.numpy().tobytes())
print(h.hexdigest()[:16])
"""


def build_shim() -> Path:
    if not SHIM.exists() or SHIM.stat().st_mtime < SHIM_SRC.stat().st_mtime:
        SHIM.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(SHIM), str(SHIM_SRC), "-ldl"], check=True)
    return SHIM


def run(cmd: list[str], shim: bool, cwd: Path | None = None) -> str:
    env = {**os.environ, **({"LD_PRELOAD": str(SHIM)} if shim else {})}
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({'shim' if shim else 'native'}): {r.stderr[-1500:]}")
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--branches", nargs="+", default=["AVX2", "AVX512", "AVX", "COMPATIBLE"])
    ap.add_argument("--base", type=Path, default=None, help="a smoke workspace after `lopd prepare`")
    a = ap.parse_args()
    if "GenuineIntel" not in Path("/proc/cpuinfo").read_text() or "cpuid_fault" not in Path("/proc/cpuinfo").read_text():
        raise SystemExit("needs an Intel CPU with CPUID faulting (cpuid_fault in /proc/cpuinfo)")
    build_shim()
    print(f"{'MKL_CBWR':<12} {'Intel (native)':<18} {'AMD (shim)':<18} same bits")
    for branch in a.branches:
        cmd = [sys.executable, "-c", KERNELS, str(REPO), branch]
        native, amd = run(cmd, False), run(cmd, True)
        print(f"{branch:<12} {native:<18} {amd:<18} {'yes' if native == amd else 'no'}")
    if a.base is not None:
        with tempfile.TemporaryDirectory() as tmp:
            ws = Path(shutil.copytree(a.base, Path(tmp) / "ws", symlinks=True))
            for out in ("models/base", "results/base"):
                shutil.rmtree(ws / out, ignore_errors=True)
            run([str(Path(sys.executable).parent / "lopd"), "base"], True, cwd=ws)
            digest = subprocess.run(["sha256sum", str(ws / "models/base/model/model.safetensors")],
                                    capture_output=True, text=True, check=True).stdout.split()[0]
            print(f"lopd base under the shim: models/base/model/model.safetensors {digest[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
