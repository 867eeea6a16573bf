"""Tiny policies for the rollout-engine tests, built in-process from the tiny params (no
pipeline workspace): a random-init model of any architecture, and a briefly trained one
wrapped in the LoRA :class:`Backbone` with a non-zero student adapter (as the trainer rolls
out)."""

from __future__ import annotations

from functools import lru_cache

import torch

from tests.conftest import tiny_params_dict


@lru_cache(maxsize=None)
def params(arch: str = "qwen3"):
    from lopd.config import deep_merge, parse_params

    # one option per convention slot: every world has the same conventions, so a briefly trained
    # policy solves tasks and the engine tests exercise rewarded episodes (the engine never reads
    # conventions; with two options per slot the 200-step policy solved none of the test's 16 tasks)
    return parse_params(deep_merge(tiny_params_dict(), {"model": {"arch": arch}, "envs": {"n_options": 1}}),
                        "rollout test params")


@lru_cache(maxsize=None)
def tokenizer():
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary

    p = params()
    return build_tokenizer(env_vocabulary(p.envs.domains, p.envs))


@lru_cache(maxsize=None)
def envs() -> dict:
    from lopd.engine.evaluation import make_envs

    return make_envs(params())


def tasks(n_tool: int, n_code: int, seed: int = 7) -> list:
    e = envs()
    return e["tool"].generate(seed, n_tool) + e["code"].generate(seed, n_code)


def random_policy(arch: str = "qwen3", seed: int = 0):
    """(model, ChatFormat) of a random-init tiny model of ``arch``."""
    from lopd.model.backbone import build_tiny_model
    from lopd.model.chat import ChatFormat

    torch.set_num_threads(1)
    model = build_tiny_model(params(arch).model, tokenizer(), seed=seed).eval()
    return model, ChatFormat(tokenizer())


@lru_cache(maxsize=None)
def trained_backbone(steps: int = 400):
    """A tiny qwen3 trained briefly on scripted demonstrations (400 steps, 5% noise: with the
    `as`/`in` markers the 200-step, 20%-noise policy of before solved none of the test's tasks),
    wrapped in the LoRA backbone with a random (non-zero) student adapter, in student mode."""
    from lopd.training.base_policy import pretraining_demos, train_on_demos
    from lopd.model.backbone import Backbone

    p = params()
    model, fmt = random_policy("qwen3", seed=1)
    bp = p.base.model_copy(update={"noise": 0.05, "truncate_prob": 0.0, "demos_per_task": 1, "tasks_per_world": 2})
    demos = pretraining_demos(envs(), bp, p.envs.seed)
    train_on_demos(model, fmt, demos, steps=steps, batch_size=16, lr=3e-3, seed=0)
    torch.manual_seed(0)
    bb = Backbone(model, tokenizer(), p.model)
    with torch.no_grad():
        for prm in bb.adapter_params("student"):
            prm.normal_(0.0, 0.05)  # lora_B starts at zero: make the adapter change the policy
    bb.mode("student")
    bb.model.eval()
    return bb
