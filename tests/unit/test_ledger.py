"""The ledger of confirmatory reads (``registration/ledger.yaml``, :mod:`lopd.confirmation.ledger`): the committed
file is valid, it records every registration the committed report names, and :func:`earlier_reads` finds a
reused split or seed by hand."""

from __future__ import annotations

import re

import pytest

from lopd.confirmation.ledger import LEDGER, Read, earlier_reads, load
from lopd.errors import BadInput
from tests.conftest import REPO


def test_the_committed_ledger_is_valid_and_starts_with_the_five_reads_of_one_split():
    reads = load(REPO / LEDGER)
    assert [r.registration[:8] for r in reads[:5]] == ["6c3c30e3", "afb5a58b", "d67b8342", "0082876d", "e076c854"]
    assert {r.split_manifest_md5 for r in reads[:5]} == {"1fedb8acd2110a81021593a84e9fa7e0"}
    assert all(set(range(100, 110)) <= set(r.seeds) for r in reads[:5])


def test_the_committed_report_names_a_registration_on_record():
    """A confirmatory verdict cannot be committed unrecorded: reports/falsification.md's registration must be
    in the ledger (append its entry in the commit that commits the verdict; bench/recover_ledger.py prints it)."""
    md = (REPO / "reports" / "falsification.md").read_text()
    named = re.search(r"Registration: sha256 `([0-9a-f]{64})`", md)
    if named is None:
        pytest.skip("the committed report names no registration (no confirmatory verdict)")
    assert named.group(1) in {r.registration for r in load(REPO / LEDGER)}, (
        f"reports/falsification.md names registration {named.group(1)[:12]}…, which registration/ledger.yaml "
        "does not record")


def _read(reg: str, split: str, seeds) -> Read:
    return Read(registration=reg * 64, commit="c" * 40, date="2026-12-05", points=(), seeds=tuple(seeds),
                split_manifest_md5=split * 32, verdict="v", label="l")


def test_earlier_reads_by_hand():
    reads = [_read("a", "1", range(100, 110)), _read("b", "1", range(100, 132)), _read("c", "2", [7])]
    assert earlier_reads(reads, "d" * 64, "3" * 32, [200, 201]) == []  # fresh split, fresh seeds
    got = earlier_reads(reads, "d" * 64, "3" * 32, [105, 106, 107, 130, 7])
    assert len(got) == 3 and "seed(s) 105-107" in got[0] and "seed(s) 105-107, 130" in got[1] and "seed(s) 7" in got[2]
    got = earlier_reads(reads, "d" * 64, "1" * 32, [300])
    assert len(got) == 2 and all("the same split" in x and "seed" not in x for x in got)
    assert len(earlier_reads(reads, "b" * 64, "1" * 32, range(100, 132))) == 1  # its own read is not earlier


def test_a_malformed_ledger_is_refused_naming_the_entry(tmp_path):
    good = {"registration": "a" * 64, "commit": "c", "date": "d", "points": [], "seeds": [1],
            "split_manifest_md5": "b" * 32, "verdict": "v", "label": "l"}
    import yaml

    for bad, msg in [({**good, "seeds": []}, "seeds"), ({**good, "registration": "xyz"}, "sha256"),
                     ({k: v for k, v in good.items() if k != "verdict"}, "lacks verdict")]:
        p = tmp_path / "ledger.yaml"
        p.write_text(yaml.safe_dump({"reads": [good | {"registration": "e" * 64}, bad]}))
        with pytest.raises(BadInput, match=rf"reads\[1\].*{msg}"):
            load(p)
    p.write_text(yaml.safe_dump({"reads": [good, good]}))
    with pytest.raises(BadInput, match="already recorded"):
        load(p)


def test_a_workspace_read_becomes_an_entry_the_ledger_accepts(tmp_path):
    """``bench/recover_ledger.py --workspace`` (what ``bench/land_repro.sh`` appends): the entry of a finished run,
    from its report, params and lock, appended to a ledger that then loads with it as the last read."""
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("recover_ledger", REPO / "bench" / "recover_ledger.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    md = ("# Falsification test\n\nRegistration: sha256 `" + "d" * 64 + "` (...)\n\n"
          "**No claim that retrieved content drives a gain** on the average over S. Label: **no claim** (...).\n\n"
          "## Specification curve\n\n| point | trial | role | margin |\n|---|---|---|---|\n"
          "| p0 | 9 | selected | degenerates |\n| p0 | 9 | selected | degenerates |\n| p1 | 13 | binding | binds |\n")
    lock = {"stages": {"register": {"deps": [{"path": "data/confirm/manifest.json", "md5": "e" * 32}]}}}
    e = mod.entry_of(md, {"confirm": {"seeds": [200, 201]}}, lock, "c" * 40, "2026-12-06T05:00:00+00:00")
    assert e["points"] == [{"point": "p0", "trial": 9, "role": "selected"}, {"point": "p1", "trial": 13, "role": "binding"}]
    assert (e["verdict"], e["label"], e["split_manifest_md5"]) == ("No claim that retrieved content drives a gain",
                                                                   "no claim", "e" * 32)
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text((REPO / LEDGER).read_text())
    with ledger.open("a") as fh:  # as land_repro.sh appends it
        yaml.safe_dump([e], fh, sort_keys=False, width=120, default_flow_style=None)
    reads = load(ledger)
    assert reads[-1].registration == "d" * 64 and reads[-1].seeds == (200, 201)
    assert reads[:-1] == load(REPO / LEDGER)
