"""Library-level bad input: each case raises BadInput (exit status 2) naming the cause."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lopd.arms import ARMS, get_arm
from lopd.bank import BANK_MODES, Experience, ExperienceBank
from lopd.training.checkpoint import load_checkpoint, load_tensors_verified, save_checkpoint, save_tensors
from lopd.envs.base import Task
from lopd.errors import BadInput
from tests.conftest import default_params  # noqa: E402

# ------------------------------------------------------------------ checkpoints


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(8, 4, generator=g), "b": torch.arange(6, dtype=torch.float32)}


def test_checkpoint_round_trip(tmp_path):
    t, state = _tensors(), {"step": 7, "beta": 0.25, "history": [{"reward": 0.5}]}
    save_checkpoint(tmp_path / "ck", t, state)
    t2, s2 = load_checkpoint(tmp_path / "ck")
    assert set(t2) == set(t) and all(torch.equal(t[k], t2[k]) for k in t)
    assert s2 == state
    assert not (tmp_path / "ck.tmp").exists() and not (tmp_path / "ck.old").exists()


def test_checkpoint_overwrite(tmp_path):
    save_checkpoint(tmp_path / "ck", _tensors(), {"step": 1})
    save_checkpoint(tmp_path / "ck", _tensors(), {"step": 2})
    assert load_checkpoint(tmp_path / "ck")[1]["step"] == 2


@pytest.mark.parametrize("name", ["tensors.safetensors", "state.pt"])
def test_checkpoint_truncated(tmp_path, name):
    ck = tmp_path / "ck"
    save_checkpoint(ck, _tensors(), {"step": 3})
    p = ck / name
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInput, match="corrupt") as ei:
        load_checkpoint(ck)
    assert name in str(ei.value) and str(ck) in str(ei.value)
    assert ei.value.exit_code == 2


def test_checkpoint_missing_file(tmp_path):
    ck = tmp_path / "ck"
    save_checkpoint(ck, _tensors(), {"step": 3})
    (ck / "state.pt").unlink()
    with pytest.raises(BadInput, match="corrupt or truncated: state.pt"):
        load_checkpoint(ck)


@pytest.mark.parametrize("meta", [None, "{oops"])
def test_checkpoint_bad_meta(tmp_path, meta):
    ck = tmp_path / "ck"
    save_checkpoint(ck, _tensors(), {"step": 3})
    if meta is None:
        (ck / "meta.json").unlink()
    else:
        (ck / "meta.json").write_text(meta)
    with pytest.raises(BadInput, match="corrupt: cannot read meta.json"):
        load_checkpoint(ck)


def test_checkpoint_absent_dir(tmp_path):
    with pytest.raises(BadInput, match="meta.json"):
        load_checkpoint(tmp_path / "never")


# ------------------------------------------------------------------ weights files


def test_tensors_round_trip(tmp_path):
    p = tmp_path / "w" / "phi0.safetensors"
    save_tensors(p, _tensors())
    assert (tmp_path / "w" / "phi0.safetensors.sha256").read_text().strip() == hashlib.sha256(p.read_bytes()).hexdigest()
    out = load_tensors_verified(p)
    assert all(torch.equal(out[k], v) for k, v in _tensors().items())


def test_tensors_truncated_with_hash(tmp_path):
    p = tmp_path / "phi0.safetensors"
    save_tensors(p, _tensors())
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(BadInput, match="corrupt or truncated") as ei:
        load_tensors_verified(p)
    assert "hash mismatch" in str(ei.value) and "phi0.safetensors" in str(ei.value)


@pytest.mark.parametrize("cut", [5, 40, -10])
def test_tensors_truncated_without_hash(tmp_path, cut):
    p = tmp_path / "student.safetensors"
    save_tensors(p, _tensors())
    (tmp_path / "student.safetensors.sha256").unlink()
    data = p.read_bytes()
    p.write_bytes(data[:cut])
    with pytest.raises(BadInput, match="corrupt or truncated") as ei:
        load_tensors_verified(p)
    assert "student.safetensors" in str(ei.value)


def test_tensors_garbage_file(tmp_path):
    p = tmp_path / "student.safetensors"
    p.write_bytes(b"not a safetensors file at all")
    with pytest.raises(BadInput, match="corrupt or truncated"):
        load_tensors_verified(p)


def test_tensors_missing(tmp_path):
    with pytest.raises(BadInput, match="weights file not found") as ei:
        load_tensors_verified(tmp_path / "runs" / "lopd-0" / "student.safetensors")
    assert "student.safetensors" in str(ei.value)


# ------------------------------------------------------------------ experience bank


def _exp(i: int, domain: str = "tool", family: str = "bank") -> Experience:
    return Experience(f"{domain}/{family}/0-{i:05d}", domain, family, f"{family} : x {i}",
                      [("user", f"{family} : x {i}"), ("assistant", "login")], 1.0)


def _write_bank_files(d: Path, lines: list[str], emb: np.ndarray, embedder: str = "backbone") -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "bank.jsonl").write_text("".join(line + "\n" for line in lines))
    np.save(d / "embeddings.npy", emb)
    sha = {n: hashlib.sha256((d / n).read_bytes()).hexdigest() for n in ("bank.jsonl", "embeddings.npy")}
    (d / "manifest.json").write_text(json.dumps({"n": len(lines), "embedder": embedder, "sha256": sha}))


def test_bank_round_trip(tmp_path):
    entries = [_exp(i) for i in range(3)]
    emb = np.eye(3, 4, dtype=np.float32) * 2
    ExperienceBank(entries, emb, "backbone").save(tmp_path / "bank")
    b = ExperienceBank.load(tmp_path / "bank")
    assert len(b) == 3 and b.embedder == "backbone"
    assert [e.to_json() for e in b.entries] == [e.to_json() for e in entries]
    assert np.allclose(np.linalg.norm(b.emb, axis=1), 1.0)


def test_bank_empty(tmp_path):
    d = tmp_path / "bank"
    _write_bank_files(d, [], np.zeros((0, 4), np.float32))
    with pytest.raises(BadInput, match="empty") as ei:
        ExperienceBank.load(d)
    assert "bank.rollouts_per_task" in str(ei.value)


def test_bank_empty_saved_by_library(tmp_path):
    ExperienceBank([], np.zeros((0, 4), np.float32), "backbone").save(tmp_path / "bank")
    with pytest.raises(BadInput, match="empty"):
        ExperienceBank.load(tmp_path / "bank")


def test_bank_missing(tmp_path):
    with pytest.raises(BadInput, match="run the bank stage first"):
        ExperienceBank.load(tmp_path / "nobank")


def test_bank_corrupt_file(tmp_path):
    d = tmp_path / "bank"
    ExperienceBank([_exp(i) for i in range(3)], np.eye(3, 4), "backbone").save(d)
    with open(d / "bank.jsonl", "a") as f:
        f.write("\n")
    with pytest.raises(BadInput, match="missing or corrupt") as ei:
        ExperienceBank.load(d)
    assert "bank.jsonl" in str(ei.value)


@pytest.mark.parametrize("manifest", ["{oops", "{}"])
def test_bank_corrupt_manifest(tmp_path, manifest):
    d = tmp_path / "bank"
    ExperienceBank([_exp(i) for i in range(3)], np.eye(3, 4), "backbone").save(d)
    (d / "manifest.json").write_text(manifest)
    with pytest.raises(BadInput, match="corrupt"):
        ExperienceBank.load(d)


def test_bank_embedding_count_mismatch():
    with pytest.raises(BadInput, match="3 entries but 2 embeddings"):
        ExperienceBank([_exp(i) for i in range(3)], np.eye(2, 4), "backbone")


@pytest.fixture()
def small_bank():
    entries = [_exp(0), _exp(1), _exp(2), _exp(3, "code", "wrap")]
    return ExperienceBank(entries, np.eye(4, 4, dtype=np.float32), "backbone")


def test_retrieve_n_ret_larger_than_bank(small_bank):
    own = Task(small_bank.entries[0].task_id, "tool", "bank", "bank : x 0")
    q = np.array([1, 0, 0, 0], np.float32)
    assert len(small_bank.retrieve(own, q, 3, "relevant")) == 3  # the 3 others
    with pytest.raises(BadInput, match="n_ret=4") as ei:
        small_bank.retrieve(own, q, 4, "relevant")  # only 3 eligible: the task itself is excluded
    assert "only 3 eligible" in str(ei.value)
    new = Task("tool/bank/9-00000", "tool", "bank", "bank : x 9")
    with pytest.raises(BadInput, match="n_ret=5"):
        small_bank.retrieve(new, q, 5, "shuffled")


def test_retrieve_never_own_task(small_bank):
    own = Task(small_bank.entries[0].task_id, "tool", "bank", "bank : x 0")
    got = small_bank.retrieve(own, np.array([1, 0, 0, 0], np.float32), 1, "relevant")
    assert got[0].task_id != own.task_id


def test_retrieve_unrelated_pool_too_small(small_bank):
    t = Task("tool/bank/9-00000", "tool", "bank", "bank : x 9")
    assert small_bank.retrieve(t, np.ones(4), 1, "unrelated")[0].domain == "code"
    with pytest.raises(BadInput, match="unrelated"):
        small_bank.retrieve(t, np.ones(4), 2, "unrelated")


@pytest.mark.parametrize("mode", ["random", "", "Relevant"])
def test_unknown_bank_mode(small_bank, mode):
    t = Task("tool/bank/9-00000", "tool", "bank", "bank : x 9")
    with pytest.raises(BadInput, match="unknown bank mode") as ei:
        small_bank.retrieve(t, np.ones(4), 1, mode)
    for m in BANK_MODES:
        assert m in str(ei.value)


def test_n_ret_zero(small_bank):
    t = Task("tool/bank/9-00000", "tool", "bank", "bank : x 9")
    with pytest.raises(BadInput, match="n_ret must be >= 1"):
        small_bank.retrieve(t, np.ones(4), 0, "relevant")
    assert small_bank.retrieve(t, np.ones(4), 0, "none") == []


# ------------------------------------------------------------------ model directories


def test_not_a_causal_lm(tmp_path):
    from transformers import BertConfig, BertModel

    from lopd.model.backbone import load_causal_lm

    cfg = BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)
    BertModel(cfg).save_pretrained(tmp_path / "bert")
    with pytest.raises(BadInput, match="causal") as ei:
        load_causal_lm(tmp_path / "bert", torch.device("cpu"), torch.float32)
    assert "BertModel" in str(ei.value)


def test_model_dir_without_config(tmp_path):
    from lopd.model.backbone import load_causal_lm

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")
    with pytest.raises(BadInput, match="no config.json"):
        load_causal_lm(tmp_path / "m", torch.device("cpu"), torch.float32)
    with pytest.raises(BadInput, match="no config.json"):
        load_causal_lm(tmp_path / "absent", torch.device("cpu"), torch.float32)


def test_model_dir_bad_config(tmp_path):
    from lopd.model.backbone import load_causal_lm

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(BadInput, match="cannot read its config"):
        load_causal_lm(tmp_path / "m", torch.device("cpu"), torch.float32)


def test_causal_lm_without_weights(tmp_path):
    from transformers import GPT2Config

    from lopd.model.backbone import load_causal_lm

    cfg = GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    cfg.architectures = ["GPT2LMHeadModel"]
    (tmp_path / "m").mkdir()
    cfg.save_pretrained(tmp_path / "m")
    with pytest.raises(BadInput, match="could not be loaded") as ei:
        load_causal_lm(tmp_path / "m", torch.device("cpu"), torch.float32)
    assert str(tmp_path / "m") in str(ei.value) and "weights" in str(ei.value)


def test_tiny_causal_lm_loads(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from lopd.model.backbone import load_causal_lm

    cfg = GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "m")
    m = load_causal_lm(tmp_path / "m", torch.device("cpu"), torch.float32)
    assert m(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 32)


def test_cuda_device_without_cuda():
    from lopd.model.backbone import resolve_device

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(BadInput, match="no CUDA device"):
        resolve_device(default_params({"model": {"device": "cuda"}}).model)


# ------------------------------------------------------------------ tracking


@pytest.fixture()
def fast_mlflow(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")


def test_unreachable_tracking_warns(fast_mlflow, capsys, tmp_path, monkeypatch):
    from lopd.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    # no retries, 2 s timeout (fast_mlflow): the store is given up on at once, not after minutes
    tr = Tracker(default_params({"tracking": {"uri": "http://127.0.0.1:9", "on_failure": "warn"}}), "run", {"stage": "test"})
    assert tr.ok is False and tr.run_id is None
    assert tr.status.startswith("failed")
    assert "WARNING" in capsys.readouterr().err
    # logging is a no-op, never an exception
    tr.log_params({"a": 1})
    tr.log_metrics({"loss": 1.0, "nan": float("nan"), "none": None}, step=0)
    tr.flush()
    tr.set_tag("k", "v")
    tr.log_artifact(str(tmp_path))
    tr.end()
    assert tr.status.startswith("failed")
    assert list(tmp_path.iterdir()) == []


def test_unreachable_tracking_fails(fast_mlflow):
    from lopd.tracking import Tracker

    with pytest.raises(BadInput, match="on_failure") as ei:
        Tracker(default_params({"tracking": {"uri": "http://127.0.0.1:9", "on_failure": "fail"}}), "run", {"stage": "test"})
    assert "127.0.0.1:9" in str(ei.value)


def test_disabled_tracker():
    from lopd.tracking import Tracker

    tr = Tracker(default_params({"tracking": {"on_failure": "fail"}}), "run", {}, enabled=False)
    assert not tr.ok and tr.status == "failed: disabled (not rank 0)"
    tr.log_metrics({"x": 1.0}, 0)
    tr.end()


# ------------------------------------------------------------------ arms


@pytest.mark.parametrize("name", ["nope", "", "LOPD", "lopd "])
def test_unknown_arm(name):
    with pytest.raises(BadInput, match="unknown arm") as ei:
        get_arm(name)
    msg = str(ei.value)
    assert "known arms" in msg
    for a in ARMS:
        assert a in msg


def test_known_arms():
    for name in ARMS:
        assert get_arm(name).name == name
    assert {"base", "sft", "grpo", "lopd", "lopd_shuffled", "lopd_unrelated"} <= set(ARMS)
