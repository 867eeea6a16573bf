"""Typed, validated parameters.

``params.yaml`` is the only knob file: one section per stage plus shared sections
(``model``, ``envs``, ``tracking``). :func:`load_params` reads it (optionally merged with a
profile), validates every key and value, and raises :class:`BadInput` naming the offending
key and the allowed values. Stage entry points turn :class:`BadInput` into exit status 2
before they write anything.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lopd.arms import ARMS as ARM_REGISTRY
from lopd.errors import BadInput

ARMS = tuple(ARM_REGISTRY)


# Read recording (``tests/test_declared_reads.py``): when a set is installed, every read of a
# section's key adds "section.key" to it, so a stage's reads can be compared with its dvc.yaml
# declaration. ``Params`` itself is not recorded: reaching a section is not reading a key.
_READS: set[str] | None = None


def record_reads(into: set[str] | None) -> None:
    """Start (a set) or stop (``None``) recording params reads."""
    global _READS
    _READS = into


class unrecorded:
    """Reads inside this block are not recorded: for checks whose result DVC already guarantees
    (e.g. ``seed in train.seeds`` for a matrix stage — declaring ``train.seeds`` there would rerun
    every seed's stage when one seed is added)."""

    def __enter__(self):
        global _READS
        self._saved, _READS = _READS, None

    def __exit__(self, *exc):
        global _READS
        _READS = self._saved


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def __getattribute__(self, name: str):
        if _READS is not None and not name.startswith("_") and name in type(self).model_fields:
            sec = _SECTION_NAMES.get(type(self).__name__)
            if sec is not None:
                _READS.add(f"{sec}.{name}")
        return super().__getattribute__(name)

    def model_dump(self, *args, **kwargs):
        if _READS is not None and type(self).__name__ in _SECTION_NAMES:
            exclude = kwargs.get("exclude") or ()
            sec = _SECTION_NAMES[type(self).__name__]
            _READS.update(f"{sec}.{k}" for k in type(self).model_fields if k not in exclude)
        return super().model_dump(*args, **kwargs)


class ModelParams(_Section):
    name_or_path: str | None  # a local HF CausalLM dir; None = tiny model from config
    arch: Literal["qwen3", "llama", "gpt2"]
    hidden_size: int = Field(ge=8)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=8)
    max_seq_len: int = Field(ge=16)
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    device: Literal["auto", "cpu", "cuda"]
    lora_r: int = Field(ge=1)
    lora_alpha: int = Field(ge=1)
    lora_target_modules: list[str] | None
    torch_threads: int = Field(ge=1)

    @model_validator(mode="after")
    def _heads(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("model.num_heads must be divisible by model.num_kv_heads")
        return self


class EnvParams(_Section):
    domains: list[Literal["tool", "code"]]
    tool_families: list[Literal["inventory", "bank", "thermo", "ticket"]]
    # evaluation-only benchmark domains (real models): read by the evaluate stage, never trained on
    eval_domains: list[Literal["bfcl", "humaneval"]]
    bfcl_categories: list[Literal["simple", "multiple"]]
    max_turns: int = Field(ge=1, le=20)
    n_train: int = Field(ge=4)
    n_val: int = Field(ge=4)
    n_test: int = Field(ge=4)
    seed: int = Field(ge=0)
    # worlds (lopd.envs.base.WorldConfig): target worlds shared by train/val/test, disjoint
    # pretraining worlds for the base policy, options per convention slot, null world
    # < the 256 two-syllable world names (lopd.envs.base.MAX_WORLDS; not imported here, so that reading
    # params does not import the environments; tests/test_worlds.py checks the two agree)
    n_target_worlds: int = Field(ge=1, le=255)
    n_pretrain_worlds: int = Field(ge=1)
    n_options: int = Field(ge=1, le=4)
    null_world: bool

    @field_validator("domains")
    @classmethod
    def _nonempty(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError("envs.domains must be a non-empty list without duplicates; allowed: tool, code")
        return v


class TrackingParams(_Section):
    uri: str
    experiment: str
    on_failure: Literal["warn", "fail"]
    async_logging: bool


class BaseParams(_Section):
    tasks_per_world: int = Field(ge=2)
    demos_per_task: int = Field(ge=1)
    # P(n same-world successes in a demo's context) for n = 0, 1, ..., len-1
    context_probs: list[float]
    context_loss: bool  # also supervise the context trajectories (lopd.training.base_policy.encode_demo)
    noise: float = Field(ge=0.0, le=1.0)
    truncate_prob: float = Field(ge=0.0, le=1.0)
    steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    seed: int = Field(ge=0)

    @field_validator("context_probs")
    @classmethod
    def _probs(cls, v):
        if not v or any(p < 0 for p in v) or abs(sum(v) - 1.0) > 1e-6:
            raise ValueError(f"base.context_probs must be non-negative and sum to 1, got {v}")
        return v

    @model_validator(mode="after")
    def _context_fits(self):
        if len(self.context_probs) > self.tasks_per_world:
            raise ValueError(f"base.context_probs allows {len(self.context_probs) - 1} same-world experiences in a "
                             f"context; base.tasks_per_world ({self.tasks_per_world}) must exceed that")
        return self


class EvalParams(_Section):
    temperature: float = Field(gt=0)
    greedy: bool
    max_new_tokens: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    samples_per_task: int = Field(ge=1)  # test-split rollouts per task (common random numbers across arms)


class BankParams(_Section):
    embedder: Literal["backbone", "minilm"]
    rollouts_per_task: int = Field(ge=1)
    min_reward: float = Field(ge=0.0, le=1.0)
    seed: int = Field(ge=0)
    scripted_demos: bool


class ColdStartParams(_Section):
    steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    k_max: int = Field(ge=1)
    n_ret_max: int = Field(ge=1)
    seed: int = Field(ge=0)
    distill_weight: float = Field(ge=0.0)  # weight of KL(text teacher ‖ latent teacher); 0 = NLL only
    distill_top_m: int = Field(ge=1)
    gate_init: float = Field(ge=0.0)


class ProbeParams(_Section):
    """The premise gate (lopd.analysis.premise): rollouts per val task per condition, and the pre-registered rule."""

    samples_per_task: int = Field(ge=1)
    seed: int = Field(ge=0)
    confidence: float = Field(gt=0, lt=1)
    min_margin: float = Field(ge=0.0)  # reward units
    min_delta: float = Field(ge=0.0)  # nats per token


class TrainParams(_Section):
    arms: list[str]
    seeds: list[int]
    # more seeds for some arms (stages train_extra@/evaluate_extra@): the falsification rule's arms
    # need >= 10 seeds, the other arms fewer (a DVC matrix is a full cross product, hence two)
    extra_arms: list[str]
    extra_seeds: list[int]
    steps: int = Field(ge=1)
    tasks_per_step: int = Field(ge=1)
    group_size: int = Field(ge=1)
    lr_student: float = Field(gt=0)
    lr_composer: float = Field(gt=0)
    margin: float = Field(ge=0.0)
    K: int = Field(ge=1)
    n_ret: int = Field(ge=1)
    lambda_anchor: float = Field(ge=0.0)
    eta_beta: float = Field(ge=0.0)
    beta_init: float = Field(ge=0.0)
    top_m: int = Field(ge=1)
    support: Literal["teacher", "student", "union"]
    temperature: float = Field(gt=0)
    rollout_budget: int | None = Field(ge=1)
    val_every: int = Field(ge=1)
    val_tasks: int = Field(ge=1)
    val_samples_per_task: int = Field(ge=1)
    checkpoint_every: int = Field(ge=1)
    beta_max: float = Field(gt=0)
    infeasible_patience: int = Field(ge=1)
    use_best_params: bool

    @field_validator("arms")
    @classmethod
    def _arms(cls, v):
        bad = [a for a in v if a not in ARMS]
        if bad:
            raise ValueError(f"unknown arm(s) {bad}; known arms: {', '.join(ARMS)}")
        if len(set(v)) != len(v) or not v:
            raise ValueError("train.arms must be a non-empty list without duplicates")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        if not v or len(set(v)) != len(v) or any(s < 0 for s in v):
            raise ValueError(f"train.seeds must be a non-empty list of distinct non-negative integers, got {v}")
        return v

    @model_validator(mode="after")
    def _extra(self):
        if len(set(self.extra_arms)) != len(self.extra_arms) or not set(self.extra_arms) <= set(self.arms):
            raise ValueError(f"train.extra_arms must be distinct arms of train.arms {self.arms}, got {self.extra_arms}")
        s = self.extra_seeds
        if len(set(s)) != len(s) or any(x < 0 for x in s) or set(s) & set(self.seeds):
            raise ValueError(f"train.extra_seeds must be distinct non-negative integers not in train.seeds "
                             f"{self.seeds}, got {s}")
        return self

    def seeds_of(self, arm: str) -> list[int]:
        """Every training seed of ``arm``: ``seeds``, plus ``extra_seeds`` if it is an extra arm."""
        return [*self.seeds, *(self.extra_seeds if arm in self.extra_arms else [])]


class HpoParams(_Section):
    n_trials: int = Field(ge=1)
    seed: int = Field(ge=0)
    study_name: str
    margin_choices: list[float]
    k_choices: list[int]
    n_ret_min: int = Field(ge=1)
    n_ret_max: int = Field(ge=1)
    lr_choices: list[float]
    baseline_arms: list[str]
    tie_rule: Literal["best", "median_margin", "smallest_margin"]
    tie_alpha: float = Field(gt=0.0, lt=1.0)
    seeds_per_trial: int = Field(ge=1)
    steps: int | None = Field(ge=1)
    val_every: int = Field(ge=1)

    @field_validator("lr_choices")
    @classmethod
    def _lrs(cls, v):
        if not v or any(x <= 0 for x in v) or len(set(v)) != len(v):
            raise ValueError(f"hpo.lr_choices must be distinct learning rates > 0, got {v}")
        return v

    @field_validator("baseline_arms")
    @classmethod
    def _baselines(cls, v):
        bad = [a for a in v if a not in ARM_REGISTRY or not ARM_REGISTRY[a].trains]
        if bad or len(set(v)) != len(v):
            raise ValueError(f"hpo.baseline_arms must be distinct training arms, got {v}")
        return v

    @field_validator("margin_choices")
    @classmethod
    def _margins(cls, v):
        if not v or any(m < 0 for m in v):
            raise ValueError(f"hpo.margin_choices must be non-empty and >= 0, got {v}")
        return v

    @field_validator("k_choices")
    @classmethod
    def _ks(cls, v):
        if not v or any(k < 1 for k in v):
            raise ValueError(f"hpo.k_choices must be non-empty integers >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _range(self):
        if self.n_ret_min > self.n_ret_max:
            raise ValueError("hpo.n_ret_min must be <= hpo.n_ret_max")
        return self


class SensitivityParams(_Section):
    seeds: list[int]
    margins: list[float]
    ks: list[int]
    n_rets: list[int]
    steps: int | None = Field(ge=1)


class RuleParams(_Section):
    """The pre-registered falsification rule: its text (rendered first) and its structure."""

    text: str
    treatment: str
    gain_over: list[str]  # part (i): treatment beats each of these
    content_controls: list[str]  # part (ii): and each of these
    rho: float | None = Field(gt=0, lt=1)  # smallest effect of interest; null = off
    rho_baseline: str  # the arm in rho * (treatment - rho_baseline)

    @model_validator(mode="after")
    def _arms(self):
        named = [self.treatment, *self.gain_over, *self.content_controls, self.rho_baseline]
        unknown = sorted({a for a in named if a not in ARMS})
        if unknown:
            raise ValueError(f"report.rule names unknown arm(s) {unknown}; known arms: {', '.join(ARMS)}")
        others = [*self.gain_over, *self.content_controls]
        if not self.gain_over or not self.content_controls or len(set(others)) != len(others) \
                or self.treatment in others:
            raise ValueError("report.rule: gain_over and content_controls must be non-empty, without "
                             "duplicates, and must not contain the treatment arm")
        return self


class DesignParams(_Section):
    """What the default seed count is sized for; tests/test_calibration.py simulates it."""

    effect: float = Field(gt=0, lt=1)  # content effect lopd − control (= lopd − base), mean test reward
    n_seeds: int = Field(ge=2)  # seeds of every arm the rule names
    seed_sd: float = Field(ge=0)  # training-seed sd of an arm's mean test reward
    n_tasks: int = Field(ge=1)
    samples_per_task: int = Field(ge=1)
    task_reward_low: float = Field(ge=0, le=1)  # per-task success probabilities ~ U(low, high)
    task_reward_high: float = Field(ge=0, le=1)
    power: float = Field(gt=0, lt=1)
    n_sim: int = Field(ge=50)  # simulated experiments per design-power figure (report and calibration tests)

    @model_validator(mode="after")
    def _range(self):
        if self.task_reward_low >= self.task_reward_high or self.task_reward_high + self.effect > 1:
            raise ValueError("report.design: need task_reward_low < task_reward_high and "
                             "task_reward_high + effect <= 1")
        return self


class ReportParams(_Section):
    alpha: float = Field(gt=0, lt=1)
    n_boot: int = Field(ge=100)  # hierarchical-bootstrap and efficiency-CI resamples
    rule: RuleParams
    design: DesignParams


class LaunchResources(_Section):
    """What one Ray job reserves (Ray sets CUDA_VISIBLE_DEVICES to the GPUs it grants)."""

    num_cpus: float = Field(ge=0)
    num_gpus: float = Field(ge=0)


class LaunchParams(_Section):
    """``lopd launch`` (lopd/launch/run.py): the out-of-date stages as Ray jobs. Read by no stage."""

    # per job, by stage name (the part before '@'); ``default`` for every stage not listed
    resources: dict[str, LaunchResources]
    max_retries: int = Field(ge=0)  # attempts after the first, per job
    worktree_root: str | None  # null = <repo>/.dvc/tmp/launch (ignored by git and DVC)
    shared_paths: list[str]  # linked into every worktree
    keep_worktrees: bool  # keep each finished job's worktree (debugging)

    @field_validator("resources")
    @classmethod
    def _has_default(cls, v):
        if "default" not in v:
            raise ValueError("launch.resources needs a `default` entry (the resources of every stage not listed)")
        return v

    @field_validator("shared_paths")
    @classmethod
    def _relative(cls, v):
        bad = [p for p in v if Path(p).is_absolute() or ".." in Path(p).parts]
        if bad:
            raise ValueError(f"launch.shared_paths must be paths inside the repository, got {bad}")
        return v


class Params(_Section):
    model: ModelParams
    envs: EnvParams
    tracking: TrackingParams
    base: BaseParams
    evaluate: EvalParams
    bank: BankParams
    cold_start: ColdStartParams
    probe: ProbeParams
    train: TrainParams
    hpo: HpoParams
    sensitivity: SensitivityParams
    report: ReportParams
    launch: LaunchParams

    @model_validator(mode="after")
    def _cross(self):
        if self.train.K > self.cold_start.k_max:
            raise ValueError(f"train.K ({self.train.K}) must be <= cold_start.k_max ({self.cold_start.k_max})")
        if max(self.hpo.k_choices) > self.cold_start.k_max:
            raise ValueError(f"hpo.k_choices must be <= cold_start.k_max ({self.cold_start.k_max})")
        if self.train.n_ret > self.cold_start.n_ret_max or self.hpo.n_ret_max > self.cold_start.n_ret_max:
            raise ValueError(f"train.n_ret and hpo.n_ret_max must be <= cold_start.n_ret_max ({self.cold_start.n_ret_max})")
        return self

    def section_hash(self, *names: str) -> str:
        """A short hash of whole sections, for MLflow tags (not recorded as reads: a tag is not an output)."""
        with unrecorded():
            d = {n: getattr(self, n).model_dump() for n in (names or type(self).model_fields)}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


_SECTION_NAMES = {f.annotation.__name__: name for name, f in Params.model_fields.items()}


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _format_error(e: ValidationError, source: str) -> str:
    lines = [f"invalid parameters in {source}:"]
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            parent = err["loc"][:-1]
            allowed = _allowed_keys(parent)
            msg = f"unknown key; allowed keys here: {', '.join(allowed)}"
        elif err["type"] == "literal_error":
            msg = f"{msg} (got {err.get('input')!r})"
        else:
            msg = f"{msg} (got {err.get('input')!r})" if "input" in err and not isinstance(err.get("input"), dict) else msg
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def _allowed_keys(loc: tuple) -> list[str]:
    model: Any = Params
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        model = field.annotation
    return sorted(getattr(model, "model_fields", {}).keys())


def parse_params(raw: dict[str, Any], source: str = "params") -> Params:
    if not isinstance(raw, dict):
        raise BadInput(f"{source}: expected a mapping of sections, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        raise BadInput(_format_error(e, source)) from None


def read_yaml_mapping(path: str | Path, what: str = "params file") -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; every failure is a :class:`BadInput` naming the file."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{what} not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise BadInput(f"{what} {path} is not valid YAML: {e}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadInput(f"{what} {path} must hold a mapping of sections, got {type(raw).__name__}")
    return raw


def load_params(path: str | Path = "params.yaml", profile: str | Path | None = None) -> Params:
    """Load ``path`` (merged with ``profile`` if given) and validate it."""
    raw = read_yaml_mapping(path, "params file")
    if profile is not None:
        raw = deep_merge(raw, read_yaml_mapping(profile, "profile"))
    return parse_params(raw, str(path) + (f" + {profile}" if profile else ""))
