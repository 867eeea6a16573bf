#!/usr/bin/env bash
# Times the full default `dvc repro` from a clean copy of this checkout, then the no-op rerun, and
# says where the time went (start-up, useful CPU share, time per stage kind: bench/pipeline_report.py).
#   bash bench/pipeline.sh [profile.yaml]     (default: params.yaml as committed)
#   LOPD_PIPELINE_DIR=<dir> puts the workspace under <dir> instead of /tmp (a run that must outlive /tmp)
#   LOPD_PIPELINE_SLOTS=<n> runs the pipeline with `lopd launch` on a local Ray cluster of n job slots instead of
#     one `dvc repro` (the copy is committed first: each job's worktree checks out that commit); the lock still
#     comes from DVC (every job is `dvc repro --single-item`, then a fan-in `dvc repro` restores them all); the
#     ready stages of a kind are batched (`lopd launch --batch`) unless LOPD_PIPELINE_BATCH=0
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$REPO/.venv/bin"
mkdir -p "${LOPD_PIPELINE_DIR:-/tmp}"
WORK="$(cd "$(mktemp -d "${LOPD_PIPELINE_DIR:-/tmp}/lopd-pipeline-XXXX")" && pwd)"   # absolute: the script changes directory
export PATH="$BIN:$PATH" DVC_NO_ANALYTICS=1 MLFLOW_DISABLE_TELEMETRY=true
cd "$REPO"
git ls-files -co --exclude-standard | while read -r f; do [ -f "$f" ] && mkdir -p "$WORK/$(dirname "$f")" && cp -p "$f" "$WORK/$f"; done
cd "$WORK"
# the copy's own lopd/ (not the checkout's, which the editable install points at): edits to the
# checkout while this runs cannot reach the run
export PYTHONPATH="$WORK${PYTHONPATH:+:$PYTHONPATH}"
case "$("$BIN/python" -c 'import lopd; print(lopd.__file__)')" in "$WORK"/*) ;; *) echo "lopd is not imported from $WORK"; exit 1;; esac
rm -f dvc.lock   # clean: no outputs and no lock (DVC keeps a lock's entries of stages that no longer exist)
git init -q
if [ $# -ge 1 ]; then "$BIN/lopd" apply-profile "$REPO/$1"; fi
SLOTS="${LOPD_PIPELINE_SLOTS:-}"
if [ -n "$SLOTS" ]; then
  export GIT_AUTHOR_NAME="${GIT_AUTHOR_NAME:-bench}" GIT_AUTHOR_EMAIL="${GIT_AUTHOR_EMAIL:-bench@example.com}"
  export GIT_COMMITTER_NAME="${GIT_COMMITTER_NAME:-bench}" GIT_COMMITTER_EMAIL="${GIT_COMMITTER_EMAIL:-bench@example.com}"
  export RAY_DISABLE_USAGE_STATS=1
  git add -A && git commit -qm "pipeline bench: the checkout as copied"
fi
t0=$(date +%s.%N)
if [ -n "$SLOTS" ]; then
  BATCH=(); [ "${LOPD_PIPELINE_BATCH:-1}" = 0 ] || BATCH=(--batch)
  "$BIN/lopd" launch "${BATCH[@]}" --num-cpus "$SLOTS" --num-gpus 0 --log-dir "$WORK/launch-logs" > repro.log 2>&1 \
    || { tail -40 repro.log; echo "lopd launch FAILED (log: $WORK/repro.log, jobs: $WORK/launch-logs)"; exit 1; }
else
  dvc repro > repro.log 2>&1 || { tail -40 repro.log; echo "dvc repro FAILED (log: $WORK/repro.log)"; exit 1; }
fi
t1=$(date +%s.%N)
dvc repro > noop.log 2>&1
t2=$(date +%s.%N)
lopd repro > /dev/null 2>&1  # closes the MLflow parent and leaves the stamp; then the no-op figures:
if [ -n "$SLOTS" ]; then
  grep -h -c "^Running stage" "$WORK"/launch-logs/*.log | paste -sd+ | bc | xargs echo "stages run (by the jobs):"
else
  grep -c "Running stage" repro.log | xargs echo "stages run:"
fi
echo "full dvc repro: $("$BIN/python" -c "print(round($t1 - $t0, 1))") s"
echo "no-op dvc repro: $("$BIN/python" -c "print(round($t2 - $t1, 1))") s  (stages re-run: $(grep -c 'Running stage' noop.log || true))"
"$BIN/python" "$REPO/bench/pipeline_report.py" "$WORK" "$("$BIN/python" -c "print($t1 - $t0)")"
"$BIN/python" "$REPO/bench/noop_repro.py" "$WORK" --repeats 3
echo "outputs kept in $WORK"
