#!/usr/bin/env bash
# Wall time of the smoke matrix: a serial `dvc repro` and then `lopd launch` on a local Ray cluster with
# N job slots (default 2), each in its own clean copy of this checkout, one after the other (never
# concurrently), plus whether the launched run's dvc.lock output hashes equal the serial run's.
#   bash bench/launch.sh [N_SLOTS]
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$REPO/.venv/bin"
SLOTS="${1:-2}"
export PATH="$BIN:$PATH" DVC_NO_ANALYTICS=1 MLFLOW_DISABLE_TELEMETRY=true RAY_DISABLE_USAGE_STATS=1
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@example.com GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@example.com
WORK="$(mktemp -d /tmp/lopd-launch-XXXX)"

copy() {  # a clean, committed smoke-profile copy of the checkout in $1
  (cd "$REPO" && git ls-files -co --exclude-standard) | while read -r f; do
    [ -f "$REPO/$f" ] && mkdir -p "$1/$(dirname "$f")" && cp -p "$REPO/$f" "$1/$f"; done
  (cd "$1" && git init -q && "$BIN/lopd" apply-profile profiles/smoke.yaml && git add -A && git commit -qm smoke)
}
secs() { "$BIN/python" -c "print(round($2 - $1, 1))"; }

copy "$WORK/serial"
t0=$(date +%s.%N)
(cd "$WORK/serial" && dvc repro > repro.log 2>&1) || { tail -30 "$WORK/serial/repro.log"; exit 1; }
t1=$(date +%s.%N)
echo "makespan estimate from the serial run's stage times (bench/makespan.py):"
"$BIN/python" "$REPO/bench/makespan.py" "$WORK/serial" --workers 1 "$SLOTS" --top 6
copy "$WORK/launch"
t2=$(date +%s.%N)
(cd "$WORK/launch" && "$BIN/python" -m lopd.launch.main --num-cpus "$SLOTS" --num-gpus 0 --log-dir "$WORK/logs" > launch.log 2>&1) \
  || { tail -30 "$WORK/launch/launch.log"; exit 1; }
t3=$(date +%s.%N)
echo "smoke matrix, serial dvc repro: $(secs "$t0" "$t1") s"
echo "smoke matrix, lopd launch with $SLOTS job slots (Ray start and fan-in included): $(secs "$t2" "$t3") s"
"$BIN/python" - "$WORK" <<'EOF'
import json, sys, yaml
from pathlib import Path
w = Path(sys.argv[1])
outs = lambda r: {o["path"]: o.get("md5") for e in yaml.safe_load((w / r / "dvc.lock").read_text())["stages"].values()
                  for o in e.get("outs", [])}
a, b = outs("serial"), outs("launch")
print(f"dvc.lock outputs equal to the serial run's: {sum(a[p] == b.get(p) for p in a)}/{len(a)}")
ev = [json.loads(l) for l in (w / "logs" / "events.jsonl").read_text().splitlines()]
starts = {(e["stage"], e["attempt"]): e["t"] for e in ev if e["event"] == "start"}
spans = sorted((starts[(e["stage"], e["attempt"])], e["t"]) for e in ev if e["event"] == "end")
peak = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
print(f"jobs: {len(spans)}, most running at once: {peak}")
EOF
echo "outputs kept in $WORK"
