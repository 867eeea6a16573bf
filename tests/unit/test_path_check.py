"""The stand-in's path check: ``bank.scripted_demos`` fills the bank with the environments' scripted
solutions (counting the ones that fail), the bank refuses to be empty without it, and the report
is marked PATH CHECK, NOT A RESULT only when the flag is set."""

from __future__ import annotations

from pathlib import Path

import pytest

from lopd.analysis.report import PATH_CHECK_BANNER, PATH_CHECK_FILES, _mark_path_check
from lopd.engine.evaluation import make_envs
from lopd.stages.bank import _scripted
from tests.conftest import default_params


def _tasks(params, n_tool: int = 6, n_code: int = 4) -> list:
    envs = make_envs(params)
    return envs, envs["tool"].generate(5, n_tool) + envs["code"].generate(5, n_code)


def test_scripted_demos_solve_every_task_and_skip_the_solved():
    p = default_params({"bank": {"scripted_demos": True}})
    envs, tasks = _tasks(p)
    demos, failed = _scripted(p, envs, tasks, have={tasks[0].task_id})
    assert failed == 0
    assert [d.task_id for d in demos] == [t.task_id for t in tasks[1:]]  # a task with a policy success is kept
    assert all(d.reward == 1.0 for d in demos)
    assert {d.domain for d in demos} == {"tool", "code"}
    assert all(d.messages[0] == ("user", t.prompt) for d, t in zip(demos, tasks[1:]))


def test_scripted_demos_that_cannot_finish_are_counted_not_kept():
    p = default_params({"bank": {"scripted_demos": True}, "envs": {"max_turns": 1}})
    envs, tasks = _tasks(p, n_tool=6, n_code=0)
    demos, failed = _scripted(p, envs, tasks, have=set())
    assert failed > 0 and len(demos) + failed == len(tasks)  # multi-action tool solutions need > 1 turn


def test_report_banner_only_on_a_path_check(tmp_path: Path):
    for name in PATH_CHECK_FILES:
        (tmp_path / name).write_text(f"# {name}\n")
    _mark_path_check(tmp_path)
    for name in PATH_CHECK_FILES:
        text = (tmp_path / name).read_text()
        assert text.startswith(PATH_CHECK_BANNER) and text.endswith(f"# {name}\n")
    assert default_params().bank.scripted_demos is False  # the default pipeline is never a path check


def test_bank_refuses_an_empty_bank_without_the_flag(monkeypatch, tmp_path):
    from lopd.errors import RunFailed
    from lopd.stages import bank as bank_stage

    p = default_params()
    monkeypatch.setattr(bank_stage, "load_backbone", lambda params, paths: None)
    monkeypatch.setattr(bank_stage, "_successes", lambda *a: [])
    monkeypatch.setattr(bank_stage.data_mod, "SplitReader",
                        lambda *a, **k: type("R", (), {"load": lambda self, split: []})())
    with pytest.raises(RunFailed, match="bank.scripted_demos"):
        bank_stage.run(p, type("P", (), {"splits": tmp_path})())


def _deep_tiny_backbone(num_layers: int):
    """The tiny qwen3 at ``num_layers`` layers with Qwen3's RMSNorm ε = 1e-6 (the tiny default's too)."""
    import torch

    from lopd.config import deep_merge, parse_params
    from lopd.model.backbone import Backbone, build_tiny_model
    from tests import tiny_policy as tp
    from tests.conftest import tiny_params_dict

    torch.set_num_threads(1)
    p = parse_params(deep_merge(tiny_params_dict(), {"model": {"num_layers": num_layers}}), "deep tiny")
    model = build_tiny_model(p.model, tp.tokenizer(), seed=0)
    for m in model.modules():
        if hasattr(m, "variance_epsilon"):
            m.variance_epsilon = 1e-6
    return Backbone(model, tp.tokenizer(), p.model), p


@pytest.mark.parametrize("gate_init, finite", [(0.0, False), (0.001, True)])
def test_deep_model_cold_start_needs_a_nonzero_gate(gate_init, finite):
    """28 layers (Qwen3-0.6B's depth): a zero-gated latent prefix overflows the cold start's gradient,
    and the cold start stops with the cause instead of writing a NaN φ0; gate_init > 0 trains."""
    import numpy as np

    from lopd.bank import ExperienceBank
    from lopd.errors import RunFailed
    from lopd.training.cold_start import cold_start

    bb, p = _deep_tiny_backbone(28)
    envs, tasks = _tasks(p, n_tool=3, n_code=0)
    demos, _ = _scripted(p, envs, tasks, have=set())
    emb = np.random.default_rng(0).normal(size=(len(demos), 8)).astype(np.float32)
    bank = ExperienceBank(demos, emb, "backbone")
    task_emb = {d.task_id: emb[i] for i, d in enumerate(demos)}
    cp = p.cold_start.model_copy(update={"steps": 1, "batch_size": 2, "gate_init": gate_init})
    if finite:
        comp, rows = cold_start(bb, bank, task_emb, cp, k_choices=[4])
        assert all(bool(x.isfinite().all()) for x in comp.phi_params())
        assert float(comp.block.gate.detach()) != gate_init  # the gate trained
    else:
        with pytest.raises(RunFailed, match="gate_init"):
            cold_start(bb, bank, task_emb, cp, k_choices=[4])
