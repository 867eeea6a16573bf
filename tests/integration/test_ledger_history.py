"""Every confirmatory read in git history is on record: each registration that a committed
``reports/falsification.md`` ever named (``bench/recover_ledger.py``, which reads git only) is in the committed
``registration/ledger.yaml`` with the same S, seeds, split and verdict. ``commit`` and ``date`` may differ for a
read landed from a workspace (the ledger names the tree that ran, git the commit that landed it)."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from lopd.confirmation.ledger import LEDGER, load
from tests.conftest import REPO

SAME = ("points", "seeds", "split_manifest_md5", "verdict", "label")


def _recover():
    spec = importlib.util.spec_from_file_location("recover_ledger", REPO / "bench" / "recover_ledger.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_read_in_git_history_is_in_the_ledger(monkeypatch):
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("no full git history here (not a repository, or a shallow clone): the reads cannot be recovered")
    monkeypatch.chdir(REPO)
    recovered = _recover().reads("HEAD")
    ledger = {r.registration: r for r in load(REPO / LEDGER)}
    assert len(recovered) >= 6
    for e in recovered:
        assert e["registration"] in ledger, f"registration {e['registration'][:12]}… (read at {e['commit'][:7]}) is not in the ledger"
        r = ledger[e["registration"]]
        got = {"points": [dict(p) for p in r.points], "seeds": list(r.seeds), "split_manifest_md5": r.split_manifest_md5,
               "verdict": r.verdict, "label": r.label}
        assert got == {k: e[k] for k in SAME}, e["registration"][:12]
