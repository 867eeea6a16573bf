"""Sections every stage shares: the backbone (``model``), task generation (``envs``) and MLflow
(``tracking``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from lopd.config.section import DistinctList, Section


class ModelParams(Section):
    """The backbone: a local Hugging Face CausalLM, or a tiny model built from these sizes."""

    name_or_path: str | None = Field(description="a local Hugging Face CausalLM directory; null = a tiny model "
                                                 "built from the sizes below")
    arch: Literal["qwen3", "llama", "gpt2"] = Field(description="architecture of the tiny model (and of the "
                                                                "LoRA target defaults)")
    hidden_size: int = Field(ge=8, description="tiny model: width of the residual stream; divisible by num_heads")
    num_layers: int = Field(ge=1, description="tiny model: transformer blocks")
    num_heads: int = Field(ge=1, description="tiny model: attention (query) heads")
    num_kv_heads: int = Field(ge=1, description="tiny model: key/value heads (grouped-query attention); "
                                                "divides num_heads")
    intermediate_size: int = Field(ge=8, description="tiny model: width of the MLP's hidden layer")
    max_seq_len: int = Field(ge=16, description="longest sequence in tokens (context + trajectory)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        description="weights' dtype; auto = bfloat16 on CUDA, float32 on CPU")
    device: Literal["auto", "cpu", "cuda"] = Field(description="where the model runs; auto = CUDA if available")
    lora_r: int = Field(ge=1, description="rank of the student's and composer's LoRA adapters")
    lora_alpha: int = Field(ge=1, description="LoRA scaling numerator (the update is scaled by lora_alpha / lora_r)")
    lora_target_modules: list[str] | None = Field(description="module names that get LoRA adapters; "
                                                              "null = the architecture's default")
    torch_threads: int = Field(ge=1, description="CPU threads torch uses per process")

    @model_validator(mode="after")
    def _heads(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("model.num_heads must be divisible by model.num_kv_heads")
        return self


class EnvParams(Section):
    """Task generation (the prepare stage) and the worlds the tasks live in (lopd.envs.base.WorldConfig)."""

    domains: DistinctList[Literal["tool", "code"]] = Field(description="task domains trained and evaluated on "
                                                               "(non-empty, no duplicates)")
    tool_families: list[Literal["inventory", "bank", "thermo", "ticket"]] = Field(
        description="tool-use task families drawn from in the tool domain")
    eval_domains: list[Literal["bfcl", "humaneval"]] = Field(
        description="evaluation-only benchmark domains (real models): read by the evaluate stage, never trained on")
    bfcl_categories: list[Literal["simple", "multiple"]] = Field(description="BFCL categories evaluated when "
                                                                             "eval_domains has bfcl")
    max_turns: int = Field(ge=1, le=20, description="most assistant turns in one episode")
    n_train: int = Field(ge=4, description="train tasks per domain")
    n_val: int = Field(ge=4, description="validation tasks per domain (the search and the premise gate read them)")
    n_test: int = Field(ge=4, description="test tasks per domain (read by the evaluate stage only)")
    n_confirm: int = Field(ge=4, description="confirmatory test tasks per domain (stage confirm_split; read by the "
                                             "confirm_evaluate stage only), none sharing a prompt or a solution "
                                             "with train, val or test")
    seed: int = Field(ge=0, description="seed of task and world generation")
    # < the 256 two-syllable world names (lopd.envs.base.MAX_WORLDS; not imported here, so that reading
    # params does not import the environments; tests/unit/test_worlds.py checks the two agree)
    n_target_worlds: int = Field(ge=1, le=255, description="worlds shared by train/val/test (tasks disjoint by id)")
    n_pretrain_worlds: int = Field(ge=1, description="worlds used only to pretrain the base policy, disjoint "
                                                     "from the target worlds")
    n_options: int = Field(ge=1, le=4, description="options per convention slot; 1 = every world the same, "
                                                   "nothing hidden to retrieve")
    null_world: bool = Field(description="true: every target task draws its conventions afresh, so retrieved "
                                         "experience carries nothing (calibration)")


class TrackingParams(Section):
    """Where MLflow records runs (read by every stage, declared by none: no output depends on it)."""

    uri: str = Field(description="MLflow tracking URI, e.g. sqlite:///mlflow.db (relative to the repository)")
    experiment: str = Field(description="MLflow experiment name the runs are recorded under")
    on_failure: Literal["warn", "fail"] = Field(description="when MLflow fails: warn = run on and record the "
                                                            "failure in result.json; fail = stop (exit 2)")
    async_logging: bool = Field(description="true: metrics go through MLflow's background queue; false: "
                                            "written synchronously")
