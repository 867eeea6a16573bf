"""The DVC internals lopd reads (lopd/compat/dvc.py) are where the adapter expects them in the installed
DVC, and behave as it assumes: a moved one fails here with its name."""

from __future__ import annotations

import io
from importlib.metadata import version

import dvc.dvcfile as dvcfile
import dvc.utils.serialize._yaml as dvc_yaml

from lopd.compat import dvc as compat_dvc
from tests.unit.test_compat import missing_internals

LOCK = "schema: '2.0'\nstages:\n  prepare:\n    cmd: lopd prepare\n    outs:\n    - path: data/x\n      md5: " \
       "0123456789abcdef0123456789abcdef\n      size: 3\n"


def test_every_listed_dvc_internal_is_present():
    missing = missing_internals(compat_dvc.INTERNALS)
    assert not missing, (f"dvc {version('dvc')} moved internals that lopd/compat/dvc.py reads (checked against "
                         f"{compat_dvc.CHECKED_VERSION}): " + ", ".join(missing))


def test_dvc_schema_accepts_a_lock_and_rejects_a_torn_one():
    assert compat_dvc.lock_schema_problem(LOCK) is None
    assert "DVC" in compat_dvc.lock_schema_problem(LOCK[: LOCK.index("md5")] + "md5: [")
    assert "schema" in compat_dvc.lock_schema_problem("schema: '2.0'\nstages:\n  prepare:\n    nope: 1\n")


def test_wrapped_lock_writes_write_the_same_text_and_can_tear_it(monkeypatch):
    monkeypatch.setattr(dvcfile.Lockfile, "dump_stages", dvcfile.Lockfile.dump_stages)
    monkeypatch.setattr(dvc_yaml, "_dump", dvc_yaml._dump)
    data = {"schema": "2.0", "stages": {"a": {"cmd": "x"}}}
    plain = io.StringIO()
    dvc_yaml._dump(data, plain)
    seen: list[str] = []
    compat_dvc.wrap_lock_writes(lambda names: None, lambda text, stream: seen.append(text) or False)
    wrapped = io.StringIO()
    dvc_yaml._dump(data, wrapped)
    assert wrapped.getvalue() == plain.getvalue() == seen[0]
    compat_dvc.wrap_lock_writes(lambda names: None, lambda text, stream: stream.write(text[:5]) or True)
    torn = io.StringIO()
    dvc_yaml._dump(data, torn)
    assert torn.getvalue() == plain.getvalue()[:5]
