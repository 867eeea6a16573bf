#!/usr/bin/env bash
# Times the full default `dvc repro` from a clean copy of this checkout, then the no-op rerun, and
# says where the time went (start-up, useful CPU share, time per stage kind: bench/pipeline_report.py).
#   bash bench/pipeline.sh [profile.yaml]     (default: params.yaml as committed)
#   LOPD_PIPELINE_DIR=<dir> puts the workspace under <dir> instead of /tmp (a run that must outlive /tmp)
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
t0=$(date +%s.%N)
dvc repro > repro.log 2>&1 || { tail -40 repro.log; echo "dvc repro FAILED (log: $WORK/repro.log)"; exit 1; }
t1=$(date +%s.%N)
dvc repro > noop.log 2>&1
t2=$(date +%s.%N)
lopd repro > /dev/null 2>&1  # closes the MLflow parent and leaves the stamp; then the no-op figures:
grep -c "Running stage" repro.log | xargs echo "stages run:"
echo "full dvc repro: $("$BIN/python" -c "print(round($t1 - $t0, 1))") s"
echo "no-op dvc repro: $("$BIN/python" -c "print(round($t2 - $t1, 1))") s  (stages re-run: $(grep -c 'Running stage' noop.log || true))"
"$BIN/python" "$REPO/bench/pipeline_report.py" "$WORK" "$("$BIN/python" -c "print($t1 - $t0)")"
"$BIN/python" "$REPO/bench/noop_repro.py" "$WORK" --repeats 3
echo "outputs kept in $WORK"
