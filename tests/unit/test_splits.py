"""Sealed splits: disjoint, deterministic, hash-checked, and test readable only by 'evaluate'."""

from __future__ import annotations

import json

import pytest

from lopd import data as data_mod
from lopd.data import SPLITS, SplitReader, generate_splits, write_splits
from lopd.envs.base import Task
from lopd.errors import BadInput, SplitAccessError
from lopd.utils import sha256_file
from tests.conftest import default_params  # noqa: E402

COUNTS = {"train": 12, "val": 6, "test": 8}


@pytest.fixture(scope="module")
def params():
    return default_params({"envs": {"n_train": COUNTS["train"], "n_val": COUNTS["val"], "n_test": COUNTS["test"],
                                  "seed": 5}})


@pytest.fixture()
def root(tmp_path, params):
    d = tmp_path / "splits"
    write_splits(d, generate_splits(params.envs))
    return d


def test_counts_and_domains(params):
    splits = generate_splits(params.envs)
    assert set(splits) == set(SPLITS)
    for s in SPLITS:
        ts = splits[s]
        assert len(ts) == COUNTS[s] * len(params.envs.domains)
        assert {t.domain for t in ts} == {"tool", "code"}
        assert sum(t.domain == "tool" for t in ts) == COUNTS[s]


def test_disjoint_by_task_id(params):
    splits = generate_splits(params.envs)
    ids = {s: [t.task_id for t in splits[s]] for s in SPLITS}
    for s in SPLITS:
        assert len(set(ids[s])) == len(ids[s])
    assert not set(ids["train"]) & set(ids["val"])
    assert not set(ids["train"]) & set(ids["test"])
    assert not set(ids["val"]) & set(ids["test"])


def test_generation_deterministic(params):
    a, b = generate_splits(params.envs), generate_splits(params.envs)
    assert {s: [t.to_json() for t in a[s]] for s in SPLITS} == {s: [t.to_json() for t in b[s]] for s in SPLITS}
    other = default_params({"envs": {**params.envs.model_dump(), "seed": 6}})
    c = generate_splits(other.envs)
    assert [t.to_json() for t in c["train"]] != [t.to_json() for t in a["train"]]


def test_written_files_identical(tmp_path, params):
    m1 = write_splits(tmp_path / "a", generate_splits(params.envs))
    m2 = write_splits(tmp_path / "b", generate_splits(params.envs))
    assert m1 == m2
    for s in SPLITS:
        assert (tmp_path / "a" / f"{s}.jsonl").read_bytes() == (tmp_path / "b" / f"{s}.jsonl").read_bytes()
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    # rewriting in place gives the same bytes too
    m3 = write_splits(tmp_path / "a", generate_splits(params.envs))
    assert m3 == m1


def test_manifest_hashes_match(root):
    manifest = json.loads((root / "manifest.json").read_text())
    assert set(manifest["files"]) == set(SPLITS)
    for s in SPLITS:
        e = manifest["files"][s]
        path = root / e["path"]
        assert e["path"] == f"{s}.jsonl"
        assert e["sha256"] == sha256_file(path)
        assert len(e["sha256"]) == 64
        assert e["n"] == len(path.read_text().splitlines()) == 2 * COUNTS[s]
    assert not list(root.glob("*.tmp"))


def test_round_trip(root, params):
    splits = generate_splits(params.envs)
    r = SplitReader(root, role="train")
    for s in ("train", "val"):
        loaded = r.load(s)
        assert all(isinstance(t, Task) for t in loaded)
        assert loaded == splits[s]
    assert SplitReader(root, role="evaluate").load("test") == splits["test"]


def test_access_log_records_reads(root):
    before = len(data_mod.ACCESS_LOG)
    SplitReader(root, role="base").load("val")
    entry = data_mod.ACCESS_LOG[before]
    assert entry["split"] == "val" and entry["role"] == "base"
    assert entry["sha256"] == sha256_file(root / "val.jsonl")


@pytest.mark.parametrize("role", ["train", "hpo", "prepare", "base", "bank", "cold_start", "probe", "sensitivity",
                                  "test"])
def test_test_split_sealed(root, role):
    before = len(data_mod.ACCESS_LOG)
    with pytest.raises(SplitAccessError) as ei:
        SplitReader(root, role=role).load("test")
    msg = str(ei.value)
    assert "test" in msg and "evaluate" in msg and repr(role) in msg
    assert isinstance(ei.value, BadInput)  # -> exit status 2
    assert len(data_mod.ACCESS_LOG) == before  # a refused read is not logged


def test_evaluate_can_read_test(root):
    tasks = SplitReader(root, role="evaluate").load("test")
    assert len(tasks) == 2 * COUNTS["test"]


def test_unknown_split(root):
    with pytest.raises(BadInput, match="unknown split 'dev'"):
        SplitReader(root, role="evaluate").load("dev")


@pytest.mark.parametrize("split,role", [("train", "train"), ("val", "hpo"), ("test", "evaluate")])
def test_corrupt_split_file(root, split, role):
    with open(root / f"{split}.jsonl", "ab") as f:
        f.write(b"x")
    with pytest.raises(BadInput, match="corrupt") as ei:
        SplitReader(root, role=role).load(split)
    assert f"{split}.jsonl" in str(ei.value)


def test_edited_split_file(root):
    p = root / "train.jsonl"
    p.write_text(p.read_text().replace('"tool"', '"tooo"', 1))
    with pytest.raises(BadInput, match="corrupt"):
        SplitReader(root, role="train").load("train")
    # other splits still load
    assert SplitReader(root, role="train").load("val")


def test_missing_split_file(root):
    (root / "val.jsonl").unlink()
    with pytest.raises(BadInput, match="missing"):
        SplitReader(root, role="train").load("val")


def test_missing_manifest(root):
    (root / "manifest.json").unlink()
    with pytest.raises(BadInput, match="manifest not found"):
        SplitReader(root, role="train")


def test_missing_dir(tmp_path):
    with pytest.raises(BadInput, match="prepare"):
        SplitReader(tmp_path / "nowhere", role="evaluate")


def test_corrupt_manifest(root):
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(BadInput, match="corrupt"):
        SplitReader(root, role="train")


def test_stage_prepare_writes_under_the_root_not_the_cwd(tmp_path, monkeypatch, params):
    import lopd.stages.prepare as prepare_stage
    from lopd.paths import Paths

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    m = prepare_stage.run(params, Paths(tmp_path))
    assert not (elsewhere / "data").exists()
    assert (tmp_path / "data" / "splits" / "manifest.json").exists()
    assert {s: m["files"][s]["n"] for s in SPLITS} == {s: 2 * n for s, n in COUNTS.items()}
    assert SplitReader(tmp_path / "data" / "splits", role="evaluate").load("test")


# ----------------------------------------------------------------- worlds


@pytest.fixture()
def world_root(tmp_path, params):
    d = tmp_path / "splits_w"
    write_splits(d, generate_splits(params.envs), data_mod.worlds_record(params.envs))
    return d


def test_manifest_records_worlds(world_root, params):
    from lopd.envs import make_env

    rec = json.loads((world_root / "manifest.json").read_text())["worlds"]
    assert rec["null_world"] is False and rec["n_options"] == params.envs.n_options
    assert set(rec["domains"]) == set(params.envs.domains)
    for d in params.envs.domains:
        env = make_env(d, params.envs)
        r = rec["domains"][d]
        assert r["target"] == {w.name: w.family for w in env.worlds["target"]}
        assert r["pretrain"] == {w.name: w.family for w in env.worlds["pretrain"]}
        assert not set(r["target"]) & set(r["pretrain"])
        assert len(r["conventions_sha256"]) == 64
    # the conventions themselves are pinned by hash, not printed
    text = (world_root / "manifest.json").read_text()
    assert "conventions\"" not in text.replace("conventions_sha256\"", "")
    assert SplitReader(world_root, role="train").worlds() == rec


def test_reader_refuses_a_task_outside_the_target_worlds(world_root, params):
    """A task of a pretraining world in a split would leak the base policy's data into evaluation."""
    from lopd.envs import make_env

    pre = make_env("tool", params.envs).worlds["pretrain"][0].name
    path = world_root / "train.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(next(line for line in lines if '"domain": "tool"' in line))
    row["world"] = pre
    path.write_text("\n".join([json.dumps(row, sort_keys=True)] + lines[1:]) + "\n")
    manifest = json.loads((world_root / "manifest.json").read_text())
    manifest["files"]["train"]["sha256"] = sha256_file(path)  # a consistent but wrong prepare
    (world_root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadInput, match="not a target world"):
        SplitReader(world_root, role="train").load("train")
    assert SplitReader(world_root, role="train").load("val")


def test_splits_cover_every_target_world(params):
    from lopd.envs import make_env

    splits = generate_splits(params.envs)
    for d in params.envs.domains:
        names = [w.name for w in make_env(d, params.envs).worlds["target"]]
        for s in SPLITS:
            got = [t.world for t in splits[s] if t.domain == d]
            assert set(got) <= set(names)
            assert got == [names[i % len(names)] for i in range(len(got))]  # round-robin


def test_manifest_records_content_hashes_and_zero_overlap(root, params):
    man = json.loads((root / "manifest.json").read_text())
    splits = generate_splits(params.envs)
    for s in SPLITS:
        assert man["files"][s]["content"] == [data_mod.content_key(t) for t in splits[s]]
    assert man["content_overlap"] == {"between": {"train-val": 0, "train-test": 0, "val-test": 0},
                                      "within": {"train": 0, "val": 0, "test": 0}}


def test_content_key_is_the_prompt_not_the_id():
    a = Task(task_id="tool/bank/1-00001", domain="tool", family="bank", prompt="ro mu bank : send 9 to cy")
    b = Task(task_id="tool/bank/2-00007", domain="tool", family="bank", prompt="ro mu bank :  send 9 to cy")
    c = Task(task_id="code/x/2-00007", domain="code", family="bank", prompt="ro mu bank : send 9 to cy")
    assert data_mod.content_key(a) == data_mod.content_key(b) != data_mod.content_key(c)


def test_a_family_space_too_small_for_the_sizes_is_a_clear_error():
    """The clamp family has 45 distinct tasks per world: 4 worlds of it cannot give 200 distinct ones
    each. Generation stops and names the family and the sizes instead of repeating tasks."""
    p = default_params({"envs": {"domains": ["code"], "n_target_worlds": 4, "n_train": 700, "n_val": 50,
                                 "n_test": 50}})
    with pytest.raises(BadInput, match=r"family '\w+' has fewer distinct tasks per world than the splits ask "
                                       r"\(n_train 700, n_val 50, n_test 50 over 4 target worlds"):
        generate_splits(p.envs)
