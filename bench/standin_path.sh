#!/usr/bin/env bash
# The real-model path end to end on a CPU, with the Qwen3-0.6B-shaped stand-in at toy counts:
# prepare, base (fingerprint), bank (scripted demonstrations: random weights solve nothing),
# cold start, one short hpo trial, the seeds' bank and cold-start draws, two train steps of lopd, grpo and
# opsd_text (each arm's seeds as one population, with the profile's activation checkpointing), evaluate every arm,
# report (marked PATH CHECK, NOT A RESULT). A path check, never a result; not part of `make test`.
#
#   bench/standin_path.sh            (builds the stand-in first if models/external/qwen3-0.6b-standin is missing)
#
# Workspace: bench/out/standin (rebuilt each run), params = params.yaml + profiles/qwen3-0.6b-standin.yaml
# + profiles/standin-cpu-toy.yaml. Prints each stage's wall time and the total. Offline.
# FROM=<stage> (e.g. FROM=cold-start) keeps the workspace's earlier outputs and starts at that stage;
# UNTIL=<stage> (e.g. UNTIL=cold-start: what bench/standin_memory.py needs) stops after that stage.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WS=${WS:-$REPO/bench/out/standin}
STANDIN=$REPO/models/external/qwen3-0.6b-standin
export PATH="$REPO/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true

if [ ! -f "$STANDIN/config.json" ]; then
  (cd "$REPO" && lopd make-standin)
fi
FROM=${FROM:-prepare}
if [ "$FROM" = prepare ]; then
  rm -rf "$WS"
  mkdir -p "$WS/models/external"
  ln -s "$STANDIN" "$WS/models/external/qwen3-0.6b-standin"
fi
cd "$WS"
lopd --params "$REPO/params.yaml" apply-profile "$REPO/profiles/qwen3-0.6b-standin.yaml" --out params.yaml
lopd --params params.yaml apply-profile "$REPO/profiles/standin-cpu-toy.yaml" --out params.yaml

train_list() {  # a list under params.yaml's train section, space-separated
  python -c "import sys, yaml; print(' '.join(map(str, yaml.safe_load(open('params.yaml'))['train'][sys.argv[1]])))" "$1"
}
arms=$(train_list arms)
t_all=$(date +%s)
started=0
run() {
  [ "$1" = "$FROM" ] && started=1
  [ $started = 1 ] || { echo "lopd $* (skipped: FROM=$FROM)"; return 0; }
  local t0; t0=$(date +%s)
  lopd --params params.yaml "$@" > "log.$(echo "$*" | tr ' ' '_')" 2>&1 || {
    echo "FAILED: lopd $* (log: $WS/log.$(echo "$*" | tr ' ' '_'))"; tail -20 "log.$(echo "$*" | tr ' ' '_')"; exit 1; }
  printf '%-32s %5d s\n' "lopd $*" $(( $(date +%s) - t0 ))
  if [ "$1" = "${UNTIL:-}" ]; then echo "stopped after lopd $1 (UNTIL=$UNTIL)"; exit 0; fi
}
run prepare
run base
run bank
[ $started = 0 ] || grep -q '"path_check"' models/bank/manifest.json || { echo "bank manifest does not mark the path check"; exit 1; }
run cold-start
run hpo
# the final runs' upstream draws (train.per_seed_draws): seed s of every arm reads bank and cold-start draw s
for s in $(train_list seeds); do run bank --draw "$s"; run cold-start --draw "$s"; done
# as the stages run them (dvc.yaml): every seed of an arm as one population, then each seed's student on test
for arm in $arms; do run train --arm "$arm"; done
for arm in $arms; do run evaluate --arm "$arm"; done
run report
head -c 300 reports/falsification.md | grep -q "PATH CHECK, NOT A RESULT" || { echo "report not marked as a path check"; exit 1; }
echo "stand-in path check completed in $(( $(date +%s) - t_all )) s (stand-in build not included)"
