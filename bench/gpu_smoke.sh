#!/usr/bin/env bash
# GPU smoke test (< 8 minutes on one GPU): in a scratch copy of this checkout, run
# prepare -> base -> bank -> cold-start on a tiny config with device cuda + bfloat16, then a few
# LOPD steps, printing step time, tokens/s and peak GPU memory (torch.cuda.max_memory_allocated).
# If models/external/Qwen3-0.6B/config.json exists, the same few steps run with that real model.
#
#   bash bench/gpu_smoke.sh            # exits 0 with a clear message when no CUDA GPU is present
#
# GPU_SMOKE_FORCE_CPU=1 runs the same flow on CPU in float32 (to check the script itself);
# GPU_SMOKE_REAL_MODEL=<dir> uses another local HF model directory for part 2.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$REPO/.venv/bin"
[ -x "$BIN/python" ] || BIN="$(dirname "$(command -v python3)")"
PY="$BIN/python"
[ -x "$PY" ] || PY="$(command -v python3)"
export PATH="$BIN:$PATH" DVC_NO_ANALYTICS=1 MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       TOKENIZERS_PARALLELISM=false PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

DEVICE=cuda DTYPE=bfloat16
if [ "${GPU_SMOKE_FORCE_CPU:-0}" = "1" ]; then
  DEVICE=cpu DTYPE=float32
  echo "GPU_SMOKE_FORCE_CPU=1: running the smoke flow on CPU (float32); numbers are not GPU numbers"
elif ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "NO GPU: torch.cuda.is_available() is False on this machine -- GPU smoke test skipped (exit 0)."
  exit 0
else
  "$PY" -c "import torch; p = torch.cuda.get_device_properties(0); print(f'GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}')"
fi

WORK="$(mktemp -d /tmp/lopd-gpu-smoke-XXXX)"
cd "$REPO"
git ls-files -co --exclude-standard | while read -r f; do
  [ -f "$f" ] && mkdir -p "$WORK/$(dirname "$f")" && cp -p "$f" "$WORK/$f"
done
cd "$WORK"
echo "scratch copy: $WORK"

tiny_profile() {  # $1 = file; $2 = extra model lines; $3 = bank.min_reward
  cat > "$1" <<EOF
model:
  device: $DEVICE
  dtype: $DTYPE
$2
tracking: {uri: "sqlite:///$WORK/mlflow.db", on_failure: warn}
envs: {n_train: 96, n_val: 16, n_test: 16}
base: {steps: 1000}
bank: {rollouts_per_task: 4, min_reward: ${3:-1.0}}
cold_start: {steps: 6, batch_size: 8}
train: {steps: 4, tasks_per_step: 16, val_every: 100, val_tasks: 8, checkpoint_every: 100, use_best_params: false}
EOF
}

run_stages() {  # $1 = label
  local t0 t1
  for s in prepare base bank cold-start; do
    t0=$(date +%s.%N)
    if ! "$BIN/lopd" --params params.yaml "$s" > "stage-$1-$s.log" 2>&1; then
      tail -30 "stage-$1-$s.log"; echo "[$1] stage $s FAILED (log: $WORK/stage-$1-$s.log)"; exit 1
    fi
    t1=$(date +%s.%N)
    echo "[$1] $s: $("$PY" -c "print(round($t1 - $t0, 1))") s"
  done
}

T_START=$(date +%s)
# --- 1. tiny model -------------------------------------------------------------------------------
cp "$REPO/params.yaml" base-params.yaml
tiny_profile gpu-tiny.yaml "" 1.0
"$BIN/lopd" --params base-params.yaml apply-profile gpu-tiny.yaml --out params.yaml > /dev/null
run_stages tiny
"$PY" bench/gpu_step.py --steps 4 --label tiny

# --- 2. real Qwen3-0.6B, if its weights are in the checkout ------------------------------------------
REAL="${GPU_SMOKE_REAL_MODEL:-$REPO/models/external/Qwen3-0.6B}"
if [ -f "$REAL/config.json" ]; then
  rm -rf data models results runs checkpoints
  tiny_profile gpu-qwen.yaml "  name_or_path: $REAL
  max_seq_len: 512
  lora_r: 16
  lora_alpha: 32" 0.0   # min_reward 0: an untuned model may solve nothing; this measures speed only
  cat >> gpu-qwen.yaml <<EOF
evaluate: {max_new_tokens: 48, batch_size: 64}
EOF
  "$BIN/lopd" --params base-params.yaml apply-profile gpu-qwen.yaml --out params.yaml > /dev/null
  run_stages qwen3-0.6b
  "$PY" bench/gpu_step.py --steps 3 --label qwen3-0.6b
else
  echo "no real model at $REAL/config.json: real-model steps skipped (put a Qwen3-0.6B HF directory there)"
fi
echo "GPU smoke done in $(( $(date +%s) - T_START )) s (outputs kept in $WORK)"
