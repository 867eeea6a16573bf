"""Typed, validated parameters.

``params.yaml`` is the only knob file: one section per stage plus shared sections
(``model``, ``envs``, ``tracking``). :func:`load_params` reads it (optionally merged with a
profile), validates every key and value, and raises :class:`BadInput` naming the offending
key, its description and the allowed values (:mod:`lopd.config.messages`). Stage entry points
turn :class:`BadInput` into exit status 2 before they write anything.

One module per group of sections (each section model documents every key with
``Field(description=...)``; ``params.yaml`` alone holds the values): :mod:`~lopd.config.shared`
(model, envs, tracking), :mod:`~lopd.config.stages` (base, evaluate, bank, cold_start, probe),
:mod:`~lopd.config.train`, :mod:`~lopd.config.hpo` (hpo, sensitivity),
:mod:`~lopd.config.report`, :mod:`~lopd.config.launch`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from lopd.config import section as _section
from lopd.config.confirm import ConfirmParams
from lopd.config.launch import LaunchParams, LaunchResources
from lopd.config.messages import format_validation_error
from lopd.config.report import DesignParams, ReportParams, RuleParams
from lopd.config.hpo import HpoParams, SensitivityParams
from lopd.config.section import Section, record_reads, recorded_reads, unrecorded
from lopd.config.shared import EnvParams, ModelParams, TrackingParams
from lopd.arms import ARMS as ARM_REGISTRY
from lopd.config.stages import ARMS, BankParams, BaseParams, ColdStartParams, EvalParams, ProbeParams
from lopd.config.train import TrainParams
from lopd.errors import BadInput

__all__ = ["ARMS", "BankParams", "ConfirmParams", "BaseParams", "ColdStartParams", "DesignParams", "EnvParams", "EvalParams",
           "HpoParams", "LaunchParams", "LaunchResources", "ModelParams", "Params", "ProbeParams", "ReportParams",
           "RuleParams", "Section", "SensitivityParams", "TrackingParams", "TrainParams", "deep_merge",
           "format_params_error", "load_params", "parse_params", "read_yaml_mapping", "record_reads", "recorded_reads",
           "unrecorded"]


class Params(Section):
    """The whole ``params.yaml``: one section per stage, plus model, envs and tracking."""

    model: ModelParams = Field(description="shared: the backbone (a local HF model or a tiny one built from config)")
    envs: EnvParams = Field(description="shared: task generation (prepare) and its worlds")
    tracking: TrackingParams = Field(description="shared: where MLflow records runs")
    base: BaseParams = Field(description="base policy: pretrained on noisy scripted demos in the pretraining worlds")
    evaluate: EvalParams = Field(description="test-split evaluation of every trained student")
    bank: BankParams = Field(description="experience bank: successful base rollouts on train")
    cold_start: ColdStartParams = Field(description="composer SFT giving φ0")
    probe: ProbeParams = Field(description="the premise gate on val, at the selected K and n_ret, with φ0")
    train: TrainParams = Field(description="final runs: every arm × every seed")
    hpo: HpoParams = Field(description="Optuna TPE over m, K, n_ret, lr on the validation split only")
    sensitivity: SensitivityParams = Field(description="one-at-a-time validation grid around the selected point")
    report: ReportParams = Field(description="tables, figures, audits and the pre-registered verdict")
    confirm: ConfirmParams = Field(description="the confirmatory run: the rule at every point of S, fresh seeds, "
                                               "its own sealed split, registered before it is read")
    launch: LaunchParams = Field(description="`lopd launch`: out-of-date stages as Ray jobs; read by no stage")

    @model_validator(mode="after")
    def _cross(self):
        if self.train.K > self.cold_start.k_max:
            raise ValueError(f"train.K ({self.train.K}) must be <= cold_start.k_max ({self.cold_start.k_max})")
        bad_g = [g for g in self.hpo.group_size_choices if self.train.tasks_per_step % g]
        if bad_g:
            raise ValueError(f"hpo.group_size_choices {bad_g} must divide train.tasks_per_step ({self.train.tasks_per_step})")
        if max(self.hpo.k_choices) > self.cold_start.k_max:
            raise ValueError(f"hpo.k_choices must be <= cold_start.k_max ({self.cold_start.k_max})")
        if self.train.n_ret > self.cold_start.n_ret_max or self.hpo.n_ret_max > self.cold_start.n_ret_max:
            raise ValueError(f"train.n_ret and hpo.n_ret_max must be <= cold_start.n_ret_max ({self.cold_start.n_ret_max})")
        pilot = {*self.train.seeds, *self.train.extra_seeds}
        if pilot & set(self.confirm.seeds):
            raise ValueError(f"confirm.seeds must be fresh: {sorted(pilot & set(self.confirm.seeds))} are seeds of the "
                             "pilot (train.seeds + train.extra_seeds)")
        eb = self.confirm.efficiency_baseline
        if eb is not None and (eb not in ARM_REGISTRY or not ARM_REGISTRY[eb].trains or eb == "lopd"):
            raise ValueError(f"confirm.efficiency_baseline {eb!r} must be a training arm other than lopd")
        return self

    def section_hash(self, *names: str) -> str:
        """A short hash of whole sections, for MLflow tags (not recorded as reads: a tag is not an output)."""
        with unrecorded():
            d = {n: getattr(self, n).model_dump() for n in (names or type(self).model_fields)}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


_section.SECTION_NAMES.update({f.annotation.__name__: name for name, f in Params.model_fields.items()})


def format_params_error(e: ValidationError, source: str, within: tuple = ()) -> str:
    """The message of a params ``ValidationError`` (:func:`lopd.config.messages.format_validation_error`
    against :class:`Params`); ``within``: where the validated model sits (``("launch",)``)."""
    return format_validation_error(e, source, Params, within)


def deep_merge(base: dict, over: dict) -> dict:
    """``base`` with ``over`` laid on it: mappings merge key by key, anything else (lists too) is replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# keys renamed so that one word means one thing (docs/architecture.md, the glossary): old -> new
RENAMED_KEYS = {"hpo.confirm_top": "hpo.rerun_top", "hpo.confirm_seeds": "hpo.rerun_seeds",
                "confirm.points": "confirm.slots"}


def renamed_keys(raw: dict[str, Any]) -> list[str]:
    """One line per old key ``raw`` still uses, naming its new key."""
    out = []
    for old, new in RENAMED_KEYS.items():
        sec, key = old.split(".")
        if isinstance(raw.get(sec), dict) and key in raw[sec]:
            out.append(f"{old} was renamed {new}")
    return out


def parse_params(raw: dict[str, Any], source: str = "params") -> Params:
    if not isinstance(raw, dict):
        raise BadInput(f"{source}: expected a mapping of sections, got {type(raw).__name__}")
    if old := renamed_keys(raw):
        raise BadInput(f"{source}: " + "; ".join(old) + ": rename the key(s) in the file")
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        raise BadInput(format_params_error(e, source)) from None


class ParamsLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``5e-05`` and ``1.0e5`` as floats as YAML 1.2 does. DVC writes
    params.yaml with ruamel (YAML 1.2) when ``dvc exp run -S`` sets a value, and a float it writes
    without a point or an exponent sign is a string to YAML 1.1, which strict validation would refuse."""


ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def read_yaml_mapping(path: str | Path, what: str = "params file") -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; every failure is a :class:`BadInput` naming the file."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{what} not found: {path}")
    try:
        raw = yaml.load(path.read_text(), Loader=ParamsLoader)  # noqa: S506 - a SafeLoader
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
