"""``lopd verify``: reruns stages in a scratch copy and says, per output, whether it is identical to
the committed ``dvc.lock``'s record, without touching the workspace it verifies.

End to end on the shared smoke pipeline's repository (its ``dvc.lock`` is the "committed" one):
``prepare`` rerun in a scratch copy is identical, the smoke repository is left as it was, and a
lock whose recorded hash was changed (a planted difference) makes it print DIFFERENT and exit 1.
"""

from __future__ import annotations

import shutil

import pytest

from lopd.errors import BadInput
from lopd.workflow.verify import compare, lock_outputs, verify

LOCK = """schema: '2.0'
stages:
  a:
    cmd: x
    outs:
    - path: out/a
      md5: 11
  b:
    cmd: y
    outs:
    - path: out/b1
      md5: 21
    - path: out/b2
      md5: 22
"""


def test_compare_names_each_output_of_the_chosen_stages():
    committed = lock_outputs(LOCK)
    assert committed == {"a": {"out/a": 11}, "b": {"out/b1": 21, "out/b2": 22}}
    rerun = {"b": {"out/b1": 21, "out/b2": 99}}
    assert compare(committed, rerun, ["b"]) == [("b", "out/b1", True), ("b", "out/b2", False)]
    assert compare(committed, rerun, ["a"]) == [("a", "out/a", False)]  # not rerun: not identical


def test_verify_refuses_a_stage_the_lock_does_not_record(tmp_path):
    (tmp_path / "dvc.lock").write_text(LOCK)
    with pytest.raises(BadInput, match=r"\['c'\] have no entry"):
        verify(tmp_path, ["c"])
    with pytest.raises(BadInput, match="no committed dvc.lock"):
        verify(tmp_path / "nowhere", ["a"])


def _tree(root):
    return sorted((p.relative_to(root).as_posix(), p.stat().st_mtime_ns) for p in root.rglob("*")
                  if p.is_file() and ".git" not in p.parts)


def test_verify_reruns_prepare_identically_and_catches_a_planted_difference(smoke_recorded, tmp_path, capsys):
    repo = smoke_recorded.repo
    before = _tree(repo)
    rc = verify(repo, ["prepare"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "identical  data/splits/train.jsonl  (prepare)" in out and "DIFFERENT" not in out, out
    assert _tree(repo) == before, "lopd verify wrote into the workspace it verified"

    planted = shutil.copytree(repo, tmp_path / "planted", symlinks=True)
    lock = (planted / "dvc.lock").read_text()
    md5 = lock_outputs(lock)["prepare"]["data/splits/train.jsonl"]
    # prepare's own record of the file (its first mention: the downstream stages' deps come later)
    (planted / "dvc.lock").write_text(lock.replace(md5, "f" * len(md5), 1))
    rc = verify(planted, ["prepare"])
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    assert "DIFFERENT  data/splits/train.jsonl  (prepare)" in out, out
    assert "identical  data/splits/val.jsonl  (prepare)" in out, out
