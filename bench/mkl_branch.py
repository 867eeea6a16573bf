"""What MKL's cross-vendor branch would cost: training steps of the default model's shape (a bare Qwen3
config, 64 wide, 2 layers, batch 32 × 128) with ``MKL_CBWR`` at the pinned ``AVX2`` against ``COMPATIBLE``
(SSE2, the branch Intel's guide names for the same results across vendors), each in its own process, the
ATen and oneDNN pins as a stage sets them; plus a hash of the weights each reaches (same branch, same bits).

    python bench/mkl_branch.py [--steps 60] [--repeats 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = r"""
import hashlib, os, sys, time
os.environ.update(MKL_CBWR=sys.argv[1], ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
torch.set_num_threads(2)
torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=132, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, max_position_embeddings=256)
m = Qwen3ForCausalLM(cfg)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
x = torch.randint(0, 132, (32, 128))
def step():
    out = m(input_ids=x, labels=x)
    out.loss.backward()
    opt.step()
    opt.zero_grad()
for _ in range(5):
    step()
n = int(sys.argv[2])
t = time.perf_counter()
for _ in range(n):
    step()
dt = time.perf_counter() - t
h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in m.parameters())).hexdigest()[:16]
print(f"{n / dt:.2f} {h}")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    rates: dict[str, list[float]] = {"AVX2": [], "COMPATIBLE": []}
    hashes: dict[str, set[str]] = {k: set() for k in rates}
    for _ in range(a.repeats):
        for branch in rates:  # alternated, so the machine's hour weighs on both alike
            out = subprocess.run([sys.executable, "-c", CHILD, branch, str(a.steps)], capture_output=True, text=True,
                                 check=True).stdout.split()
            rates[branch].append(float(out[0]))
            hashes[branch].add(out[1])
    for branch, r in rates.items():
        print(f"MKL_CBWR={branch:10s} steps/s {', '.join(f'{x:.2f}' for x in r)}  weights {', '.join(sorted(hashes[branch]))}")
    best = {k: max(v) for k, v in rates.items()}
    print(f"COMPATIBLE / AVX2 time per step: {best['AVX2'] / best['COMPATIBLE']:.2f}x (best of {a.repeats} each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
