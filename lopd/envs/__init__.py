"""Environments: procedurally generated, deterministic, verifiable domains."""

from __future__ import annotations

from typing import Any

from lopd.envs.base import Env, Episode, StepResult, Task


def make_env(domain: str, envs_params: Any = None) -> Any:
    """The environment object for ``domain`` configured from the ``envs`` params section."""
    if domain == "tool":
        from lopd.envs.tool import ToolEnv

        if envs_params is None:
            return ToolEnv()
        return ToolEnv(families=list(envs_params.tool_families), max_turns=envs_params.max_turns)
    if domain == "code":
        from lopd.envs.code import CodeEnv

        return CodeEnv()
    if domain == "bfcl":
        from lopd.envs.bfcl import BFCLEnv

        return BFCLEnv(categories=list(getattr(envs_params, "bfcl_categories", ["simple"])))
    if domain == "humaneval":
        from lopd.envs.humaneval import HumanEvalEnv

        return HumanEvalEnv()
    raise ValueError(f"unknown domain {domain!r}; known: tool, code, bfcl, humaneval")


__all__ = ["Env", "Episode", "StepResult", "Task", "make_env"]
