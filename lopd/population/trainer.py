"""The members of one arm trained in lock-step on one backbone, every pass batched over the members.

A member is a run: a seed, or a search trial with its own m, K, n_ret and learning rate. Each is a
:class:`~lopd.training.trainer.Trainer` on its own view of the backbone
(:meth:`lopd.model.backbone.Backbone.member_views`), so it owns what a run owns: its student adapter, its
composer, its optimisers and their clipping, β and the anchor, its random streams (task order,
rollout seeds), its history. What the population adds is that one step runs

1. one rollout batch over every member's tasks, row ``n`` through its member's student adapter
   (the lean decoder reads every member's adapter and routes each token, :mod:`lopd.engine.fused_linear`;
   the Hugging Face forward routed by :mod:`lopd.model.members` where the lean decoder does not cover the
   model; each row's tokens are drawn from the counter-based stream keyed by the seeds its member drew,
   as alone);
2. one student forward over every member's rollouts; for the distillation arms one composer
   forward over every member's retrieved experiences (each member's block then compresses its own
   rows, at its own K) and one teacher forward over every rollout given its member's context
   (prefixes padded to one width, masked);
3. each member's loss on its slices (the arm's objective, unchanged), one backward over their sum
   (the members' parameters are disjoint, so each gets exactly its own loss's gradient), and each
   member's own clipping and optimiser step, β update and feasibility watch.

Validation batches the members too (:func:`lopd.engine.evaluation.evaluate_members`: each member's
rollouts drawn with its own seeds, as alone). The population saves one
checkpoint holding every member (written atomically), so a kill never leaves members at different
steps and a resumed population continues bit-identically.

**Independence.** A member's run does not depend on who shares its batch, up to the last bits of
the batched kernels (``tests/integration/test_population.py`` compares a member alone with the same member in
a population of five).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from lopd.engine.evaluation import evaluate_members
from lopd.engine.rollout import RowMembers, rollout_batch
from lopd.engine.sampling import seeds_from_generator
from lopd.errors import BadInput
from lopd.faults import kill_point
from lopd.model.composer import encode_distinct
from lopd.model.members import adapter_name
from lopd.training.checkpoint import (load_checkpoint, load_trainer_state, prefixed, save_checkpoint,
                                      trainer_state, trainer_tensors)
from lopd.training.loop import fit as run_loop
from lopd.training.trainer import HParams, Resources, Trainer

# what every member of one population shares (they step, validate and checkpoint together, and
# their rollouts share one batch)
SHARED = ("steps", "tasks_per_step", "group_size", "temperature", "val_every", "val_tasks", "val_samples_per_task",
          "checkpoint_every", "max_new_tokens", "max_len", "recompute_context_passes", "snapshot_steps")


@dataclass
class Member:
    """One run of a population: its hyper-parameters and seed, and where its metrics go."""

    hp: HParams
    seed: int
    tracker: Any = None
    on_val: Callable[[int, float], None] | None = None
    # its own upstream draw (bank, φ0 and the tasks' embeddings: a final run's per-seed draw); None = the
    # population's. Its backbone, tasks and environments are the population's whatever it holds.
    res: Resources | None = None


class MemberPasses:
    """A member's slices of the population's batched passes (what :class:`~lopd.training.arm_loss.Passes`
    computes for a run alone)."""

    def __init__(self, student: torch.Tensor, ctx=None, teacher: torch.Tensor | None = None):
        self._student, self._ctx, self._teacher = student, ctx, teacher

    def student_logits(self) -> torch.Tensor:
        return self._student

    def context_and_teacher(self):
        return self._ctx, self._teacher


def _pad(t: torch.Tensor, width: int, value, left: bool = False) -> torch.Tensor:
    """``t`` (N, W, ...) padded along dim 1 to ``width`` with ``value`` (on the right, or the left)."""
    if t.shape[1] == width:
        return t
    pad = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), value)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


class Population:
    """Train ``members`` (all of arm ``arm``) together; :meth:`fit` returns when all are done."""

    def __init__(self, res: Resources, arm, members: list[Member], *, ckpt_dir: Path | None = None,
                 progress: Callable[[int, list[dict]], None] | None = None):
        if not members:
            raise BadInput("a population needs at least one member")
        for name in SHARED:
            values = {getattr(m.hp, name) for m in members}
            if len(values) > 1:
                raise BadInput(f"the members of one population must share train.{name} (got {sorted(values)})")
        self.res, self.arm, self.bb = res, arm, res.bb
        self.ckpt_dir, self.progress = ckpt_dir, progress
        self.n = len(members)
        for m in members:
            if m.res is not None and ([t.task_id for t in m.res.train_tasks], [t.task_id for t in m.res.val_tasks]) \
                    != ([t.task_id for t in res.train_tasks], [t.task_id for t in res.val_tasks]):
                raise BadInput(f"member seed {m.seed}: its resources hold other train/val tasks than the population's")
        views = res.bb.member_views(self.n)
        self.trainers = [Trainer(replace(m.res or res, bb=views[i], envs=res.envs, train_tasks=res.train_tasks,
                                         val_tasks=res.val_tasks, student_init=res.student_init),
                                 arm, m.hp, m.seed, tracker=m.tracker, on_val=m.on_val)
                         for i, m in enumerate(members)]
        self.hp = members[0].hp
        self.last_timing: dict[str, float] = {}

    @property
    def step(self) -> int:
        return self.trainers[0].step

    # ------------------------------------------------------------------ one step
    @contextmanager
    def _route(self, owner: list[int]) -> Iterator[Callable[[list[int]], None]]:
        """Route a rollout batch's rows (row ``n`` of member ``owner[n]``) through their members'
        student adapters; yields the engine's ``on_rows`` (its live rows change as rows finish)."""
        owner = torch.tensor(owner, dtype=torch.long)
        with self.bb.member_rows("student", owner, self.n) as routing:
            def on_rows(live: list[int]) -> None:
                routing.set_rows(owner[torch.tensor(live, dtype=torch.long)])
            yield on_rows

    def _student_adapters(self) -> list[str]:
        return [adapter_name("student", i) for i in range(self.n)]

    def _rollouts(self) -> list[dict]:
        """Every member's batch of the step, from one rollout batch."""
        trs, bb, hp = self.trainers, self.bb, self.hp
        tasks = [tr.sample_tasks() for tr in trs]
        seeds = [s for tr, ts in zip(trs, tasks) for s in seeds_from_generator(len(ts), tr.gen)]
        bb.mode("student")
        bb.model.eval()
        owner = [i for i, ts in enumerate(tasks) for _ in ts]
        with self._route(owner) as on_rows:
            rollouts = rollout_batch(bb.model, bb.fmt, self.res.envs, [t for ts in tasks for t in ts],
                                     max_new_tokens=hp.max_new_tokens, max_len=hp.max_len, greedy=False,
                                     temperature=hp.temperature, seeds=seeds, on_rows=on_rows,
                                     members=RowMembers(self._student_adapters(), owner))
        bb.model.train()
        batches, at = [], 0
        for tr, ts in zip(trs, tasks):
            batches.append(tr.batch_of(ts, rollouts[at:at + len(ts)]))
            at += len(ts)
        return batches

    def validate(self, tasks: list | None = None) -> list[float]:
        """Every member's validation (as :meth:`Trainer.validate` alone), the members' rollouts batched."""
        trs, hp = self.trainers, self.hp
        tasks = trs[0].validation_tasks(tasks)
        ev = self.res.params.evaluate
        self.bb.mode("student")
        results = evaluate_members(self.bb.model, self.bb.fmt, self.res.envs, tasks,
                                   seeds=[tr.validation_seed() for tr in trs], max_new_tokens=hp.max_new_tokens,
                                   max_len=hp.max_len, batch_size=ev.batch_size * self.n, greedy=ev.greedy,
                                   temperature=ev.temperature, samples_per_task=hp.val_samples_per_task,
                                   route=self._route, adapters=self._student_adapters())
        return [tr.took_validation(tasks, r) for tr, r in zip(trs, results)]

    def _passes(self, batches: list[dict]) -> list[MemberPasses]:
        """The step's forward passes over every member's rows at once, sliced back per member."""
        bb, arm = self.bb, self.arm
        T = max(b["ids"].shape[1] for b in batches)
        ids = torch.cat([_pad(b["ids"], T, bb.fmt.pad_id) for b in batches])
        attn = torch.cat([_pad(b["attn"], T, 0) for b in batches])
        owner = torch.cat([torch.full((b["ids"].shape[0],), i, dtype=torch.long) for i, b in enumerate(batches)])
        rows, at = [], 0
        for b in batches:
            rows.append(slice(at, at + b["ids"].shape[0]))
            at += b["ids"].shape[0]
        with bb.member_rows("student", owner, self.n):
            student = bb.logits(ids, attn, "student")[:, :-1]
        if arm.objective != "kd":
            return [MemberPasses(student[r, :b["ids"].shape[1] - 1]) for r, b in zip(rows, batches)]
        # the context passes under activation checkpointing, as a run alone (Passes.context_and_teacher)
        with bb.recompute_in_backward(self.trainers[0].hp.recompute_context_passes):
            ctxs = self._contexts(batches)
            latent = ctxs[0].latent
            prefix = mask = shift = None
            if ctxs[0].prefix is not None:
                P = max(c.prefix.shape[1] for c in ctxs)
                left = not latent  # a latent prefix is a bag at position 0; text is left-padded, as alone
                prefix = torch.cat([_pad(c.prefix, P, 0.0, left) for c in ctxs])
                mask = torch.cat([_pad(c.mask, P, 0, left) for c in ctxs])
                if not latent:
                    shift = torch.cat([torch.full((c.prefix.shape[0],), P - c.prefix.shape[1], dtype=torch.long)
                                       for c in ctxs])
            with torch.set_grad_enabled(latent and arm.train_composer):
                teacher = bb.teacher_logits(prefix, mask, ids, attn, latent_prefix=latent,
                                            prefix_shift=shift)[:, :-1]
        return [MemberPasses(student[r, :b["ids"].shape[1] - 1], c, teacher[r, :b["ids"].shape[1] - 1])
                for r, b, c in zip(rows, batches, ctxs)]

    def _contexts(self, batches: list[dict]) -> list:
        """Each member's teacher context; the composers' encoder pass runs once for all members."""
        trs, bb = self.trainers, self.bb
        if not (self.arm.context == "latent" and trs[0].composer is not None and self.arm.train_composer):
            return [tr.context.build(b["tasks"]) for tr, b in zip(trs, batches)]  # no composer pass to batch
        exps = [[tr.context.experiences_for(t) for t in b["tasks"]] for tr, b in zip(trs, batches)]
        flat = [x for e in exps for per_task in e for x in per_task]
        owner = [i for i, e in enumerate(exps) for per_task in e for _ in per_task]
        # each member's distinct experiences once, packed by length (lopd.model.composer.encode_distinct);
        # distinct rows come member by member, as the members' rows do in ``flat``
        h, mask, inverse = encode_distinct(bb, flat, owner, self.n)
        ctxs, at, d0 = [], 0, 0
        for tr, b, e in zip(trs, batches, exps):
            n_ret = tr.composer.n_ret(e)
            n = len(e) * n_ret
            inv = inverse[at:at + n]
            d1 = int(inv.max()) + 1
            c = tr.composer.compress(h[d0:d1], mask[d0:d1], n_ret, tr.hp.K, inv - d0)
            ctxs.append(tr.context.build(b["tasks"], latents=c))
            at, d0 = at + n, d1
        return ctxs

    def train_step(self) -> list[dict]:
        """One step of every member; returns each member's row."""
        t0 = time.time()
        batches = self._rollouts()
        t1 = time.time()
        outs = [tr.objective(b, p) for tr, b, p in zip(self.trainers, batches, self._passes(batches))]
        takes = [tr.takes_step(out.loss, m) for tr, (out, m) in zip(self.trainers, outs)]
        losses = [out.loss for (out, _), take in zip(outs, takes) if take and out.loss is not None]
        t2 = time.time()
        for tr, take in zip(self.trainers, takes):
            if take:
                tr.zero_grad()
        if losses:
            sum(losses[1:], losses[0]).backward()  # disjoint parameters: each member gets its own loss's gradient
        kill_point("step", detail=f"step {self.step + 1}")  # fault injection: gradients taken, no update yet
        for tr, take in zip(self.trainers, takes):
            if take:
                tr.optimiser_step()
        # where the step's time went (bench/population.py), and how many token positions the passes ran
        self.last_timing = {"rollouts": t1 - t0, "forward": t2 - t1, "backward": time.time() - t2,
                            "tokens": sum(b["ids"].numel() for b in batches)}
        return [tr.end_step(m, t0) for tr, (_, m) in zip(self.trainers, outs)]

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> None:
        """One checkpoint of every member (atomic: members never resume at different steps)."""
        if self.ckpt_dir is None:
            return
        tensors = {f"m{i}.{k}": v for i, tr in enumerate(self.trainers) for k, v in trainer_tensors(tr).items()}
        state = {"members": [trainer_state(tr) for tr in self.trainers], "seeds": [tr.seed for tr in self.trainers]}
        save_checkpoint(self.ckpt_dir, tensors, state)
        for tr in self.trainers:
            if tr.tracker is not None:
                tr.tracker.flush()

    def restore(self) -> int:
        """Resume from the population's checkpoint if there is one; the step it resumed at."""
        if self.ckpt_dir is None or not (Path(self.ckpt_dir) / "meta.json").exists():
            return 0
        tensors, state = load_checkpoint(self.ckpt_dir)
        seeds = [tr.seed for tr in self.trainers]
        if state.get("seeds") != seeds:
            raise BadInput(f"checkpoint {self.ckpt_dir} holds members with seeds {state.get('seeds')}, this population "
                           f"has {seeds}; delete the checkpoint to restart")
        for i, (tr, st) in enumerate(zip(self.trainers, state["members"])):
            load_trainer_state(tr, prefixed(tensors, f"m{i}."), st)
        return self.step

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict:
        """Train every member for ``hp.steps`` steps (resuming from the checkpoint if one exists): the
        one loop (:func:`lopd.training.loop.fit`) with this population as its stepper."""
        return run_loop(self, self.progress)
