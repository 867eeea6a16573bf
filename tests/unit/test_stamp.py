"""The no-op stamp of ``lopd repro`` (:mod:`lopd.workflow.stamp`), on a toy workspace with no DVC:
the signature is stable while nothing changes and moves with every change DVC would see."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from lopd.workflow import stamp


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("x = 1\n")
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "sub" / "w.bin").write_bytes(b"\0" * 8)
    (tmp_path / "params.yaml").write_text("a: 1\n")
    (tmp_path / "mlflow.db").write_bytes(b"db")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": {"cmd": "true", "deps": ["code"],
                                                                         "outs": ["out"], "params": ["a"]}}}))
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"s": {
        "cmd": "true", "deps": [{"path": "code", "md5": "x.dir"}], "params": {"params.yaml": {"a": 1}},
        "outs": [{"path": "out", "md5": "y.dir"}]}}}))
    return tmp_path


def _bump(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_signature_is_stable_and_the_stamp_round_trips(ws):
    assert stamp.signature(ws, "mlflow.db") == stamp.signature(ws, "mlflow.db")
    assert stamp.unchanged(ws) is None  # no stamp yet
    stamp.write(ws, "sqlite:///mlflow.db")
    got = stamp.unchanged(ws)
    assert got is not None and got["store"] == "mlflow.db"
    stamp.forget(ws)
    assert stamp.unchanged(ws) is None


@pytest.mark.parametrize("change", ["touch_dep", "edit_dep_same_size", "add_out_file", "remove_out_file",
                                    "params", "lock", "dvc_yaml", "store", "store_removed"])
def test_every_change_dvc_would_see_breaks_the_stamp(ws, change):
    stamp.write(ws, "sqlite:///mlflow.db")
    if change == "touch_dep":
        _bump(ws / "code" / "a.py")
    elif change == "edit_dep_same_size":
        (ws / "code" / "a.py").write_text("x = 2\n")
        _bump(ws / "code" / "a.py")  # a coarse-clock filesystem could keep the mtime: make it move
    elif change == "add_out_file":
        (ws / "out" / "sub" / "extra").write_text("")
    elif change == "remove_out_file":
        (ws / "out" / "sub" / "w.bin").unlink()
    elif change == "params":
        (ws / "params.yaml").write_text("a: 2\n")
        _bump(ws / "params.yaml")
    elif change == "lock":
        (ws / "dvc.lock").write_text((ws / "dvc.lock").read_text() + "\n")
    elif change == "dvc_yaml":
        (ws / "dvc.yaml").write_text((ws / "dvc.yaml").read_text() + "\n")
    elif change == "store":
        _bump(ws / "mlflow.db")
    elif change == "store_removed":
        (ws / "mlflow.db").unlink()
    assert stamp.unchanged(ws) is None, change


def test_where_a_stat_cannot_vouch_there_is_no_fast_path(ws):
    assert stamp.local_store("http://tracking:5000") is None
    assert stamp.local_store("sqlite:///mlflow.db") == "mlflow.db"
    assert stamp.local_store("sqlite:////abs/m.db") == "/abs/m.db"
    stamp.write(ws, "http://tracking:5000")
    assert stamp.read(ws) is None  # a tracking server: no stamp, every repro asks DVC and MLflow
    spec = yaml.safe_load((ws / "dvc.yaml").read_text())
    spec["stages"]["s"]["always_changed"] = True
    (ws / "dvc.yaml").write_text(yaml.safe_dump(spec))
    assert stamp.signature(ws, None) is None
    stamp.write(ws, "sqlite:///mlflow.db")
    assert stamp.read(ws) is None  # nothing stamped
    (ws / "dvc.lock").unlink()
    assert stamp.signature(ws, None) is None
