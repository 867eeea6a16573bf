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


def test_a_dump_records_as_read_only_the_keys_it_dumps():
    """The declared = read recording (lopd/config/section.py) counts a ``model_dump``'s keys: with
    ``include`` only those, with ``exclude`` all but those (the trial hash dumps TRIAL_KEYS only)."""
    from lopd.config import record_reads

    train = load_params(REPO / "params.yaml").train
    for kwargs, want in (({"include": set(TRIAL_KEYS)}, set(TRIAL_KEYS)),
                         ({"exclude": set(MATRIX_KEYS)}, set(TrainParams.model_fields) - set(MATRIX_KEYS))):
        reads: set[str] = set()
        record_reads(reads)
        try:
            train.model_dump(**kwargs)
        finally:
            record_reads(None)
        assert reads == {f"train.{k}" for k in want}, kwargs
