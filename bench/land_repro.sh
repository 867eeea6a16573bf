#!/usr/bin/env bash
# Lands a finished clean default repro (the workspace `bash bench/pipeline.sh` left) in this checkout: its
# confirmatory read goes on record in registration/ledger.yaml, register and report reread the ledger, and the
# lock, the reports and the ledger come back to the checkout, which `lopd lock-status` must then call fresh.
#   bash bench/land_repro.sh /tmp/lopd-pipeline-XXXX <commit the run's tree was copied from>
# Stops, changing nothing in the checkout, when the workspace's run is unfinished or stale, or when the
# checkout's code or params differ from the workspace's (the lock would then describe another tree).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$REPO/.venv/bin"
WORK="$(cd "${1:?usage: bash bench/land_repro.sh <workspace> <commit>}" && pwd)"
BASE="${2:?the commit whose tree the run was copied from (bench/pipeline.sh copies the checkout as it was)}"
export PATH="$BIN:$PATH" DVC_NO_ANALYTICS=1 MLFLOW_DISABLE_TELEMETRY=true PYTHONPATH="$WORK"
fail() { echo "land_repro: $*" >&2; exit 1; }

[ -f "$WORK/reports/falsification.md" ] || fail "$WORK has no reports/falsification.md: the run is not finished"
grep -q "Registration: sha256" "$WORK/reports/falsification.md" || fail "the run's report names no registration"
# the tree the lock will describe: every tracked file a stage can read must be the workspace's
cd "$REPO"
differ=$(git ls-files lopd params.yaml dvc.yaml pyproject.toml | while read -r f; do
  cmp -s "$f" "$WORK/$f" || echo "$f"; done)
[ -z "$differ" ] || fail "the checkout differs from the run's tree in: $(echo $differ | head -c 400)"
git cat-file -e "$BASE^{commit}" 2>/dev/null || fail "$BASE is not a commit of this repository"

cd "$WORK"
lopd lock-status > /dev/null || fail "the run's own lock is stale (cd $WORK && lopd lock-status says why): rerun dvc repro there"

# the read on record: the checkout's ledger, with this read appended unless its registration is there already
reg=$(grep -o 'Registration: sha256 `[0-9a-f]*`' reports/falsification.md | grep -o '[0-9a-f]\{64\}')
cp "$REPO/registration/ledger.yaml" registration/ledger.yaml
if ! grep -q "registration: $reg" registration/ledger.yaml; then
  (cd "$REPO" && "$BIN/python" bench/recover_ledger.py --workspace "$WORK" --commit "$BASE") > entry.yaml
  cat entry.yaml >> registration/ledger.yaml   # a list item at column 0, as the reads above
  echo "ledger: appended the read of registration ${reg:0:12}…"
fi
lopd repro > land.log 2>&1 || { tail -30 land.log; fail "lopd repro after the ledger entry failed (log: $WORK/land.log)"; }
grep "Running stage" land.log || true   # register and report: the ledger is their dependency
lopd lock-status || fail "the run's lock is stale after the ledger's rerun"

# back to the checkout (the first change there): the lock, the ledger, every committed report (a report the run no longer writes is removed)
cp dvc.lock "$REPO/dvc.lock"
cp registration/ledger.yaml "$REPO/registration/ledger.yaml"
rm -rf "$REPO/reports" && cp -a reports "$REPO/reports"   # every file under reports/ is a stage's output
cd "$REPO"
PYTHONPATH="$REPO" lopd lock-status || fail "the checkout's lock is stale after the copy"
git status --short
echo "landed. By hand: update the README's results and docs/benchmarks.md from reports/ and $WORK"
echo "(bench/pipeline_report.py, bench/compare_locks.py), then commit all of it in one commit."
