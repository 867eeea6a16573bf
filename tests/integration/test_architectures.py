"""Three decoder architectures (Qwen3, Llama, GPT-2) through the "real model" path.

Each tiny random model is saved as a Hugging Face directory (``save_pretrained`` + tokenizer),
loaded back with :func:`lopd.model.backbone.load_causal_lm` like a downloaded checkpoint,
wrapped in a :class:`Backbone`, given a fresh composer (its state stands in for φ0, since the
workspace's φ0 was trained for another hidden size) and trained for 2 LOPD steps against the
workspace's experience bank (re-embedded by each backbone). Each step must give a finite loss and move the student LoRA.
"""

from __future__ import annotations

import math

import pytest
import torch

ARCHS = ["qwen3", "llama", "gpt2"]


@pytest.fixture(scope="module")
def shared(workspace):
    """The workspace's params, bank and tasks (read once; never modified)."""
    import os

    from lopd import data as data_mod
    from lopd.bank import ExperienceBank
    from lopd.engine.evaluation import make_envs

    params = workspace.params()
    reader = data_mod.SplitReader(workspace.paths.splits, role="train")
    train, val = reader.load("train"), reader.load("val")
    bank = ExperienceBank.load(workspace.paths.bank)
    return params, bank, train, val, make_envs(params)


@pytest.mark.parametrize("arch", ARCHS)
def test_arch_runs_two_lopd_steps(arch, shared, tmp_path):
    from lopd.arms import get_arm
    from lopd.bank import ExperienceBank, embed_tasks
    from lopd.envs.base import Task
    from tests.conftest import default_params
    from lopd.model.backbone import Backbone, build_tiny_model, load_causal_lm
    from lopd.model.composer import Composer
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary, load_tokenizer
    from lopd.training.trainer import HParams, Resources, Trainer

    params, bank, train, val, envs = shared
    torch.set_num_threads(2)
    mp = default_params({"model": dict(arch=arch, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                       intermediate_size=64, max_seq_len=params.model.max_seq_len, device="cpu",
                                       dtype="float32")}).model
    tok = build_tokenizer(env_vocabulary(["tool", "code"]))
    d = tmp_path / arch
    build_tiny_model(mp, tok, seed=0).save_pretrained(str(d))
    tok.save_pretrained(str(d))

    tok2 = load_tokenizer(d)
    base = load_causal_lm(d, torch.device("cpu"), torch.float32)
    assert base.config.model_type == arch
    torch.manual_seed(0)
    bb = Backbone(base, tok2, mp)
    assert bb.adapter_params("student") and bb.adapter_params("composer"), f"{arch}: no LoRA parameters"

    k_max = params.cold_start.k_max
    torch.manual_seed(1)
    phi0 = Composer(bb, k_max).state()
    # the bank's task embeddings come from the workspace's backbone: re-embed its entries with
    # this one (same experiences, this model's embedding space)
    bank_tasks = [Task(e.task_id, e.domain, e.family, e.prompt) for e in bank.entries]
    arch_bank = ExperienceBank(bank.entries, embed_tasks("backbone", bb, bank_tasks), "backbone")
    tasks = train[:24]
    res = Resources(params=params, bb=bb, bank=arch_bank, train_tasks=tasks, val_tasks=val[:4], envs=envs, phi0=phi0,
                    k_max=k_max)
    res.task_emb = dict(zip([t.task_id for t in tasks], embed_tasks("backbone", bb, tasks)))
    hp = HParams.from_params(params, steps=2, tasks_per_step=4, val_every=2, val_tasks=4, checkpoint_every=2)
    tr = Trainer(res, get_arm("lopd"), hp, seed=0)
    tr.prepare(tasks)
    before = {k: v.clone() for k, v in bb.adapter_state("student").items()}
    phi_before = [p.detach().clone() for p in tr.phi]
    for _ in range(2):
        m = tr.train_step()
        assert math.isfinite(m["loss"]) and math.isfinite(m["kd_loss"]), f"{arch}: non-finite loss {m}"
        assert math.isfinite(m["beta"])
    after = bb.adapter_state("student")
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved > 0, f"{arch}: the student LoRA did not move"
    assert any(not torch.equal(a, b) for a, b in zip(tr.phi, phi_before)), f"{arch}: φ did not move"


def test_lora_targets_come_from_peft_defaults_with_an_override():
    """peft's per-architecture defaults (GPT-NeoX included, refused by the old hand-kept list);
    ``model.lora_target_modules`` overrides; an architecture peft does not know is a clear error."""
    from types import SimpleNamespace

    from lopd.errors import BadInput
    from lopd.model.backbone import lora_targets

    def fake(model_type):
        return SimpleNamespace(config=SimpleNamespace(model_type=model_type))

    assert lora_targets(fake("gpt_neox"), None) == ["query_key_value"]
    assert lora_targets(fake("qwen3"), None) == ["q_proj", "v_proj"]
    assert lora_targets(fake("qwen3"), ["q_proj", "k_proj"]) == ["q_proj", "k_proj"]
    with pytest.raises(BadInput, match="lora_target_modules"):
        lora_targets(fake("no-such-arch"), None)


@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_states_skip_the_lm_head_and_equal_the_causal_lms_last_hidden_state(arch):
    """Backbone.hidden_states runs the decoder without its LM head; it must be the very tensor the causal
    LM reports as ``hidden_states[-1]`` (after the final norm), and carry the same gradient to the LoRA."""
    from lopd.model.backbone import Backbone, build_tiny_model
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary
    from tests.conftest import default_params

    mp = default_params({"model": dict(arch=arch, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                       intermediate_size=64, device="cpu", dtype="float32")}).model
    tok = build_tokenizer(env_vocabulary(["tool", "code"]))
    bb = Backbone(build_tiny_model(mp, tok, seed=0), tok, mp, arch=arch)
    for p in bb.adapter_params("composer"):
        torch.nn.init.normal_(p, std=0.1)  # B starts at 0: give the adapter a gradient path through A too
    ids = torch.randint(3, len(tok), (3, 12))
    attn = torch.ones_like(ids)
    attn[1, 8:] = 0
    grads = []
    for lean in (True, False):
        bb.model.zero_grad(set_to_none=True)
        if lean:
            h = bb.hidden_states(ids, attn)
        else:
            bb.mode("composer")
            h = bb.model(input_ids=ids, attention_mask=attn, output_hidden_states=True, use_cache=False).hidden_states[-1]
        (h * torch.linspace(-1, 1, h.shape[-1])).sum().backward()
        grads.append((h.detach(), [p.grad.clone() for p in bb.adapter_params("composer")]))
    (h1, g1), (h2, g2) = grads
    assert torch.equal(h1, h2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))  # bitwise: the LM head took no part in either
