"""The fault-injection switch (lopd/faults.py) the kill-anywhere chain relies on: its spec, and that a
named point kills the whole process group at its n-th hit, after logging it, and nowhere else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from lopd.errors import BadInput
from lopd.faults import KillSpec, kill_point, spec


def test_spec_parses_stage_point_and_count():
    assert KillSpec.parse("train@lopd:step:2") == KillSpec("train@lopd", "step", 2)
    assert KillSpec.parse("evaluate@*:write") == KillSpec("evaluate@*", "write", 1)
    s = KillSpec.parse("evaluate@*:write")
    assert s.matches("evaluate@lopd", "write") and not s.matches("evaluate@lopd", "step")
    assert not s.matches("train@lopd", "write") and not s.matches(None, "write")


@pytest.mark.parametrize("bad", ["train", "train:nap", "train:step:0", ":step", "train:step:x"])
def test_a_malformed_spec_is_bad_input(bad, monkeypatch):
    monkeypatch.setenv("LOPD_KILL_AT", bad)
    with pytest.raises(BadInput, match="LOPD_KILL_AT"):
        spec()


def test_unset_or_other_stage_does_nothing(monkeypatch):
    monkeypatch.delenv("LOPD_KILL_AT", raising=False)
    kill_point("write", stage="prepare")  # still alive
    monkeypatch.setenv("LOPD_KILL_AT", "base:write")
    kill_point("write", stage="prepare")
    kill_point("step", stage="prepare")


def _child(tmp_path, body: str, **env) -> subprocess.CompletedProcess:
    code = "import os\nfrom lopd.utils import atomic_write_text\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LOPD_KILL_LOG": str(tmp_path / "kills.log"), **env},
                          start_new_session=True)  # its own group: the kill must not reach pytest


def test_the_nth_write_kills_the_group_after_the_file_is_complete(tmp_path):
    r = _child(tmp_path, """
        for i in range(4):
            atomic_write_text(f"out{i}.txt", f"file {i}\\n")
        print("survived")
    """, LOPD_KILL_AT="prepare:write:2", DVC_STAGE="prepare")
    assert r.returncode == -signal.SIGKILL and "survived" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert (tmp_path / "out1.txt").read_text() == "file 1\n" and not (tmp_path / "out2.txt").exists()
    log = (tmp_path / "kills.log").read_text().splitlines()
    assert len(log) == 1 and log[0].endswith("killed at prepare:write:2 out1.txt"), log
    assert "LOPD_KILL_AT" in r.stderr


def test_a_point_of_another_stage_lets_the_process_finish(tmp_path):
    r = _child(tmp_path, """
        atomic_write_text("out.txt", "x")
        print("survived")
    """, LOPD_KILL_AT="bank:write", DVC_STAGE="prepare")
    assert r.returncode == 0 and "survived" in r.stdout, r.stderr
    assert not (tmp_path / "kills.log").exists()
