"""``bench/preflight.py`` on the committed params: the confirmatory split they draw is the one the ledger's last
read (the committed registration's own) holds, by the md5 ``register`` compares; a run that must register anew is
told it cannot on that split."""

from __future__ import annotations

import re
import subprocess
import sys

from lopd.confirmation import ledger
from tests.conftest import REPO


def _preflight(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "bench" / "preflight.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_the_committed_split_is_the_one_the_last_registration_read():
    last = ledger.load(REPO / ledger.LEDGER)[-1]
    named = re.search(r"Registration: sha256 `([0-9a-f]{64})`", (REPO / "reports" / "falsification.md").read_text())
    assert named and named.group(1) == last.registration
    r = _preflight()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"manifest md5 {last.split_manifest_md5}" in r.stdout
    assert f"held: registration {last.registration[:12]}" in r.stdout
    r = _preflight("--new-registration")
    assert r.returncode == 1 and "must move no pilot number" in r.stdout
