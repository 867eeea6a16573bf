"""One training loop (:func:`lopd.training.loop.fit`) for a run alone and a population: both
validate and checkpoint at the same steps, and call back and record the same rows.

Each stepper's validation and checkpoint calls are spied on (``Trainer.validate``/``Trainer.save``
for a run alone, ``Population.validate``/``Population.save`` for a population, which never call
the trainer's), and compared with each other and with the schedule ``val_every`` and
``checkpoint_every`` set: step 0, every ``val_every`` steps and the last step for a validation;
every ``checkpoint_every`` steps and the last step for a checkpoint.
"""

from __future__ import annotations

from lopd.arms import ARMS
from lopd.population.trainer import Member, Population
from lopd.training.trainer import HParams, Trainer

STEPS, VAL_EVERY, CKPT_EVERY = 5, 2, 3
EXPECTED = {"validate": [0, 2, 4, 5], "save": [3, 5]}


def _spy(monkeypatch, cls, calls: dict) -> None:
    for name in ("validate", "save"):
        original = getattr(cls, name)

        def spy(self, *a, _original=original, _name=name, **k):
            calls.setdefault(_name, []).append(self.step)
            return _original(self, *a, **k)
        monkeypatch.setattr(cls, name, spy)


def test_a_run_alone_and_a_population_validate_and_checkpoint_at_the_same_steps(resources, workspace, tmp_path,
                                                                               monkeypatch):
    hp = HParams.from_params(workspace.params(), steps=STEPS, val_every=VAL_EVERY, checkpoint_every=CKPT_EVERY)
    alone_calls: dict[str, list[int]] = {}
    pop_calls: dict[str, list[int]] = {}
    alone_vals: list[tuple[int, float]] = []
    pop_vals: list[tuple[int, float]] = []

    _spy(monkeypatch, Trainer, alone_calls)
    alone = Trainer(resources, ARMS["sft"], hp, seed=3, ckpt_dir=tmp_path / "alone",
                    on_val=lambda s, v: alone_vals.append((s, v)))
    alone.fit()
    monkeypatch.undo()

    _spy(monkeypatch, Population, pop_calls)
    pop = Population(resources, ARMS["sft"], [Member(hp, 3, on_val=lambda s, v: pop_vals.append((s, v)))],
                     ckpt_dir=tmp_path / "pop")
    pop.fit()

    assert alone_calls == EXPECTED, f"a run alone: {alone_calls}"
    assert pop_calls == EXPECTED, f"a population: {pop_calls}"
    # the validation callback and the history's val_reward column follow the same steps
    assert [s for s, _ in alone_vals] == [s for s, _ in pop_vals] == EXPECTED["validate"][1:]
    for tr in (alone, pop.trainers[0]):
        assert [r["step"] for r in tr.history if r["val_reward"] is not None] == EXPECTED["validate"]
        assert [r["step"] for r in tr.history] == list(range(STEPS + 1))
