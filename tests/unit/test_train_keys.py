"""A training setting is defined once (lopd/config/train.py's TrainParams, with its type, range and
description); the groups beside it say where each key goes, and HParams is built from them."""

from __future__ import annotations

from dataclasses import fields

from lopd.config import load_params
from lopd.config.train import (CONTROL_KEYS, MATRIX_KEYS, RUN_KEYS, SCHEDULE_KEYS, SOURCE_KEYS, TRIAL_KEYS,
                               TrainParams)
from lopd.training.trainer import HParams
from tests.conftest import REPO


def test_every_train_key_is_in_exactly_one_group():
    groups = [MATRIX_KEYS, RUN_KEYS, SCHEDULE_KEYS, SOURCE_KEYS]
    keys = list(TrainParams.model_fields)
    assert sorted(k for g in groups for k in g) == sorted(keys), "a train key in no group or in two"
    assert set(CONTROL_KEYS) <= set(RUN_KEYS)
    assert list(RUN_KEYS) == [k for k in keys if k in RUN_KEYS], "RUN_KEYS out of field order (HParams' order)"


def test_hparams_is_built_from_the_run_keys_with_their_types():
    names = [f.name for f in fields(HParams)]
    assert names == [*RUN_KEYS, "max_new_tokens", "max_len", "snapshot_steps"]
    for f in fields(HParams):
        if f.name in RUN_KEYS:
            assert f.type == TrainParams.model_fields[f.name].annotation, f.name
    params = load_params(REPO / "params.yaml")
    hp = HParams.from_params(params, margin=0.25, K=None)
    assert hp.margin == 0.25 and hp.K == params.train.K and hp.steps == params.train.run_steps()
    assert hp.max_len == params.model.max_seq_len and hp.snapshot_steps == ()


def test_a_trial_is_hashed_over_the_keys_it_trains_with():
    """The study name's hash covers what it includes; this set is the complement of what it excluded by
    hand before (so the committed studies keep their names)."""
    excluded_before = {"arms", "seeds", "extra_arms", "extra_seeds", "use_best_params", "per_seed_draws", "beta_rate",
                       "beta_fixed"}
    assert set(TRIAL_KEYS) == set(TrainParams.model_fields) - excluded_before
