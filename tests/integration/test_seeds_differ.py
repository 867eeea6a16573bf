"""Seeds that differ: two training seeds of one arm sample different rollouts, and two upstream draws
hold different experience banks and φ0.

A multi-seed result whose seeds replay one random stream is one run reported several times (a
rollout generator that ignores its seed does exactly that). These tests fail if the seed stops
reaching the rollouts, on the path the final runs take (a population, each seed its own member)
and on a run alone, or if a per-seed draw reuses another draw's bank or cold start.
"""

from __future__ import annotations

import pytest
import torch

from lopd.arms import ARMS
from lopd.population.trainer import Member, Population
from lopd.training.trainer import HParams, Trainer


def _first_step_tokens(monkeypatch) -> dict:
    """Each trainer's first step batch (its sampled token ids), by trainer identity."""
    seen: dict[int, torch.Tensor] = {}
    batch_of = Trainer.batch_of

    def spy(self, tasks, rollouts):
        b = batch_of(self, tasks, rollouts)
        seen.setdefault(id(self), b["ids"].clone())
        return b
    monkeypatch.setattr(Trainer, "batch_of", spy)
    return seen


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("arm", ["lopd", "grpo"])
def test_two_seeds_of_an_arm_sample_different_first_step_rollouts(resources, workspace, monkeypatch, arm):
    hp = HParams.from_params(workspace.params(), steps=1)
    seen = _first_step_tokens(monkeypatch)
    alone = []
    for seed in (0, 1):
        tr = Trainer(resources, ARMS[arm], hp, seed=seed)
        tr.prepare()
        tr.train_step()
        alone.append(seen[id(tr)])
    assert not _same(*alone), f"{arm}: seeds 0 and 1 sampled the same first-step rollouts alone"

    pop = Population(resources, ARMS[arm], [Member(hp, 0), Member(hp, 1)])
    for tr in pop.trainers:
        tr.prepare()
    pop.train_step()
    members = [seen[id(tr)] for tr in pop.trainers]
    assert not _same(*members), f"{arm}: seeds 0 and 1 sampled the same first-step rollouts in a population"
    # and each seed's stream is its own: the member samples what the seed samples alone (its first
    # step's tokens, as tests/integration/test_population.py checks at length)
    assert all(_same(m, a) for m, a in zip(members, alone))


def test_two_upstream_draws_hold_different_banks_and_phi0(workspace, resources):
    """The workspace ran the bank and cold start once per training seed (``--draw s``), as the
    pipeline's per-seed draws do: draws 0 and 1, loaded as a final run's member loads its own
    (:func:`lopd.stages.common.with_draw`), differ in the experiences they hold and in φ0."""
    from lopd.stages.common import with_draw

    paths = workspace.paths
    banks = [(paths.bank_draw(d) / "bank.jsonl").read_bytes() for d in (0, 1)]
    assert banks[0] != banks[1], "draws 0 and 1 wrote the same bank file"
    draws = [with_draw(paths, resources, d) for d in (0, 1)]
    held = [[(e.task_id, tuple(map(tuple, e.messages))) for e in r.bank.entries] for r in draws]
    assert held[0] != held[1], "draws 0 and 1 hold the same experiences"
    phi0 = [r.phi0 for r in draws]
    assert phi0[0].keys() == phi0[1].keys()
    assert any(not torch.equal(phi0[0][k], phi0[1][k]) for k in phi0[0]), "draws 0 and 1 hold the same φ0"
