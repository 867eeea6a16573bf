"""One run's training step, the same for every arm: each arm (:mod:`lopd.arms`) is a set of switches on it.
*When* steps, validations and checkpoints happen is the training loop's (:mod:`lopd.training.loop`).

One step:

1. roll the student out on a batch of train tasks (``G`` rollouts per task for GRPO, one
   otherwise; every arm consumes ``train.tasks_per_step`` rollouts per step, so equal steps
   are equal rollout budgets);
2. by objective —
   * ``sft``: NLL of the student's own successful rollouts (reward = 1);
   * ``grpo``: group-normalised advantages, token-level policy-gradient surrogate, no KL;
   * ``kd``: retrieve experiences, condition the frozen teacher on them (latents ``c_φ`` from
     the composer, or raw text for ``opsd_text``), and minimise the reverse KL
     ``KL(π_S ‖ π_T)`` over the teacher's top-M support plus a tail bucket at every
     student-generated token. For LOPD ``φ`` also minimises ``β·(m − Δ(φ))`` and the anchor
     ``λ‖c_φ − c_φ0‖²``; after the step ``β ← max(0, β + η_β (m − Δ))``;
3. log ``reward, kd_loss, delta_phi, beta, margin_sat_frac, anchor, tail_mass,
   rollouts_used`` (and ``val_reward`` every ``val_every`` steps) to ``history`` and MLflow;
4. checkpoint every ``checkpoint_every`` steps (resumable after a kill).

Gradient routing: the teacher is the base model with adapters disabled (base weights are
frozen), so θ (student LoRA) only receives the distillation gradient, and the margin and
anchor terms — functions of the teacher's log-probs given ``c_φ`` and of ``c_φ`` itself —
only reach φ. One backward pass over ``kd + β(m−Δ) + anchor`` therefore gives each
parameter group exactly its objective's gradient.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from lopd.training import objectives as obj
from lopd.arms import ArmSpec
from lopd.bank import ExperienceBank
from lopd.config.train import RUN_KEYS, TrainParams
from lopd.envs.base import Task, stratified
from lopd.errors import BadInput, RunFailed
from lopd.faults import kill_point
from lopd.engine.evaluation import evaluate_policy
from lopd.model.backbone import Backbone
from lopd.model.composer import Composer
from lopd.engine.rollout import collate, rollout_batch
from lopd.training.checkpoint import restore_trainer, save_trainer
from lopd.training.arm_loss import OBJECTIVES, Passes, StepLoss
from lopd.training.context import ContextBuilder
from lopd.training.loop import Alone, fit as run_loop

if TYPE_CHECKING:
    from lopd.config import Params


HISTORY_COLUMNS = ["step", "rollouts_used", "reward", "loss", "kd_loss", "delta_phi", "beta", "margin_sat_frac",
                   "anchor", "tail_mass", "n_supervised", "val_reward", "seconds"]


def _from_params(cls, params: Params, **over) -> "HParams":
    """Every ``train`` key of :data:`lopd.config.train.RUN_KEYS` from ``params.train`` (``steps``: the run's
    steps, :meth:`TrainParams.run_steps`), the generation limits from ``evaluate`` and ``model``, then
    ``over`` (its None values ignored)."""
    tp = params.train
    d = {k: getattr(tp, k) for k in RUN_KEYS}
    d.update(max_new_tokens=params.evaluate.max_new_tokens, max_len=params.model.max_seq_len)
    d["steps"] = tp.run_steps()
    d.update({k: v for k, v in over.items() if v is not None})
    return cls(**d)


# The hyper-parameters of one run: the ``train`` keys of RUN_KEYS, each defined once (type, range and
# description) in lopd.config.train.TrainParams and typed here from it, with the selected m, K, n_ret applied;
# plus the generation limits of ``evaluate`` and ``model``, and the steps after which the student's adapter is
# kept (a registered efficiency curve; () = none).
HParams = make_dataclass(
    "HParams",
    [(k, TrainParams.model_fields[k].annotation) for k in RUN_KEYS]
    + [("max_new_tokens", int), ("max_len", int), ("snapshot_steps", tuple, field(default=()))],
    namespace={"from_params": classmethod(_from_params),
               "__doc__": "The hyper-parameters of one run (lopd.config.train.RUN_KEYS, typed from TrainParams), "
                          "the generation limits, and the snapshot steps."})
HParams.__module__ = __name__  # (make_dataclass's module= is Python >= 3.12): pickles and reprs resolve here


@dataclass
class Resources:
    """What every run of a process shares: the backbone, the bank, the tasks, φ0."""

    params: Any
    bb: Backbone
    bank: ExperienceBank | None
    train_tasks: list[Task]
    val_tasks: list[Task]
    envs: dict
    phi0: dict[str, torch.Tensor] | None
    k_max: int
    task_emb: dict[str, np.ndarray] = field(default_factory=dict)
    student_init: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self):
        if not self.student_init:  # a population member's copy keeps the shared one
            self.student_init = self.bb.adapter_state("student")


class Trainer:
    def __init__(self, res: Resources, arm: ArmSpec, hp: HParams, seed: int, *, tracker=None,
                 ckpt_dir: Path | None = None, on_val: Callable[[int, float], None] | None = None,
                 progress: Callable[[int, dict], None] | None = None, world=None):
        self.res, self.arm, self.hp, self.seed = res, arm, hp, seed
        self.bb = res.bb
        self.tracker, self.ckpt_dir, self.on_val, self.progress = tracker, ckpt_dir, on_val, progress
        self.world = world  # optional distributed helper (lopd.training.distributed)
        self._check(res, arm, hp)
        # fresh adapters for this run: the same initial student for every arm (pairing by seed needs it)
        torch.manual_seed(seed)
        self.bb.load_adapter_state("student", res.student_init)
        self.composer: Composer | None = None
        if arm.context in ("latent", "learned"):
            self.composer = Composer(self.bb, res.k_max)
            self.composer.load_state(res.phi0)
            for p in self.composer.phi_params():
                p.requires_grad_(arm.train_composer and arm.context == "latent")
        self.context = ContextBuilder(res, arm, hp, seed, self.composer)
        self.theta = self.bb.adapter_params("student")
        self.opt_theta = torch.optim.AdamW(self.theta, lr=hp.lr_student, weight_decay=0.0)
        self.phi: list = []
        self.opt_phi = None
        self.beta = (hp.beta_fixed if arm.beta_schedule == "fixed" else hp.beta_init) if arm.margin else 0.0
        self.margin = hp.margin if arm.margin else 0.0
        self.step = 0
        self.rollouts_used = 0
        self.history: list[dict] = []
        sample_seed = world.rank_seed(seed) if world is not None else seed  # ranks roll out different tasks
        # the task order depends on the seed only: every (non-grouped) arm sees the same tasks per step
        self.py_rng = random.Random(sample_seed)
        self.gen = torch.Generator().manual_seed(sample_seed)
        self.infeasible_streak = 0
        self.infeasible = False
        self.last_val: float | None = None
        self.last_val_per_task: list[float] = []  # per val task: mean reward over its samples (last validate)
        # step -> (rollouts used by then, the student's adapter then): hp.snapshot_steps' snapshots
        self.snapshots: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}

    @staticmethod
    def _check(res: Resources, arm: ArmSpec, hp: HParams) -> None:
        if arm.objective == "kd" and arm.context in ("latent", "text"):
            if res.bank is None:
                raise RunFailed(f"arm {arm.name} needs the experience bank")
            if hp.n_ret > len(res.bank):
                raise BadInput(f"n_ret={hp.n_ret} is larger than the experience bank ({len(res.bank)} experiences)")
        if arm.context in ("latent", "learned") and res.phi0 is None:
            raise RunFailed(f"arm {arm.name} needs the cold-started composer φ0")
        if arm.grouped and hp.tasks_per_step % hp.group_size:
            raise BadInput(f"train.tasks_per_step ({hp.tasks_per_step}) must be a multiple of train.group_size "
                           f"({hp.group_size}) for GRPO")

    def prepare(self, tasks: list[Task] | None = None) -> None:
        """Compute ``c_φ0`` of the train tasks (the anchor), then φ's optimiser (the learned context
        of ``lopd_nocontent`` exists only after that). :meth:`fit` calls it; benches call it alone."""
        self.context.prime(self.res.train_tasks if tasks is None else tasks)
        self.phi = self.context.phi_params()
        self.opt_phi = torch.optim.AdamW(self.phi, lr=self.hp.lr_composer, weight_decay=0.0) if self.phi else None

    def experiences_for(self, task: Task) -> list[list[int]]:
        """Token ids of the experiences the teacher of ``task`` reads (the arm's bank mode)."""
        return self.context.experiences_for(task)

    # ------------------------------------------------------------------ one step
    def sample_tasks(self) -> list[Task]:
        hp = self.hp
        if self.arm.grouped:
            base = self.py_rng.sample(self.res.train_tasks, hp.tasks_per_step // hp.group_size)
            return [t for t in base for _ in range(hp.group_size)]
        return self.py_rng.sample(self.res.train_tasks, hp.tasks_per_step)

    def _rollout_batch(self) -> dict:
        hp, bb = self.hp, self.bb
        tasks = self.sample_tasks()
        bb.mode("student")
        bb.model.eval()
        rollouts = rollout_batch(bb.model, bb.fmt, self.res.envs, tasks, max_new_tokens=hp.max_new_tokens,
                                 max_len=hp.max_len, greedy=False, temperature=hp.temperature, generator=self.gen)
        bb.model.train()
        return self.batch_of(tasks, rollouts)

    def batch_of(self, tasks: list[Task], rollouts: list) -> dict:
        """The step's training batch from its rollouts (counted against the rollout budget)."""
        self.rollouts_used += len(rollouts)
        ids, attn, mask = collate(rollouts, self.bb.fmt.pad_id, self.bb.device)
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32, device=self.bb.device)
        return {"tasks": tasks, "ids": ids, "attn": attn, "mask": mask, "targets": ids[:, 1:], "rewards": rewards}

    def train_step(self) -> dict:
        t0 = time.time()
        batch = self._rollout_batch()
        out, m = self.objective(batch, Passes(self, batch))
        self._apply(out.loss, m)
        return self.end_step(m, t0)

    def objective(self, batch: dict, passes: Passes) -> tuple[StepLoss, dict]:
        """The arm's loss on ``batch`` and the step's metrics so far."""
        m: dict[str, float] = {"reward": float(batch["rewards"].mean()), "n_supervised": float(batch["mask"].sum())}
        out = OBJECTIVES[self.arm.objective](self, batch, passes)
        m.update(out.metrics)
        m["loss"] = float(out.loss.detach()) if out.loss is not None else 0.0
        return out, m

    def end_step(self, m: dict, t0: float) -> dict:
        """After the optimiser step: β's dual update, the feasibility watch, the step's row."""
        self._dual_update(m)
        m["beta"] = self.beta
        self._feasibility(m)
        self.step += 1
        m.update(step=self.step, rollouts_used=self.rollouts_used, seconds=time.time() - t0)
        m.pop("delta_weight", None)
        return m

    def takes_step(self, loss: torch.Tensor | None, m: dict) -> bool:
        """Whether this step updates the weights (decided together across ranks); a non-finite
        loss stops the run."""
        take_step = loss is not None
        bad = loss is not None and not bool(torch.isfinite(loss.detach()))
        if self.world is not None:  # every rank issues the same collectives
            take_step, bad = self.world.any_true(take_step), self.world.any_true(bad)
        if bad:
            raise RunFailed(f"non-finite loss ({m['loss']}) at step {self.step + 1} of {self.arm.name} seed "
                            f"{self.seed}; last good checkpoint kept in {self.ckpt_dir}")
        return take_step

    def zero_grad(self) -> None:
        self.opt_theta.zero_grad(set_to_none=True)
        if self.opt_phi:
            self.opt_phi.zero_grad(set_to_none=True)

    def optimiser_step(self) -> None:
        """Clip θ's and φ's gradients (each to norm 1) and step their optimisers."""
        if self.world is not None:
            self.world.all_reduce_grads(self.theta + self.phi)
        torch.nn.utils.clip_grad_norm_(self.theta, 1.0)
        self.opt_theta.step()
        if self.opt_phi:
            torch.nn.utils.clip_grad_norm_(self.phi, 1.0)
            self.opt_phi.step()

    def _apply(self, loss: torch.Tensor | None, m: dict) -> None:
        """One optimiser step on θ (and φ), decided together across ranks."""
        if not self.takes_step(loss, m):
            return
        self.zero_grad()
        if loss is not None:
            loss.backward()
        kill_point("step", detail=f"step {self.step + 1}")  # fault injection: gradients taken, no update yet
        self.optimiser_step()

    def beta_rate(self) -> float:
        """lopd_ramp's slope: ``train.beta_rate``, or η_β·m when null."""
        return self.hp.beta_rate if self.hp.beta_rate is not None else self.hp.eta_beta * self.margin

    def _dual_update(self, m: dict) -> None:
        """β after the primal step, by the arm's schedule: dual ascent on φ's constraint Δ(φ) ≥ m; an
        open-loop ramp (lopd_ramp, Δ not read); or unchanged (lopd_fixbeta)."""
        if not (self.arm.margin and self.arm.train_composer) or self.arm.beta_schedule == "fixed":
            return
        if self.arm.beta_schedule == "ramp":  # after step t = self.step + 1, whatever Δ did
            self.beta = obj.ramp_beta(self.hp.beta_init, self.beta_rate(), self.step + 1)
            return
        d, w = m.get("delta_phi", float("nan")), m.get("delta_weight", 0.0)
        if self.world is not None:  # Δ over every rank's rewarded tokens (all ranks call this)
            d, w = self.world.weighted_mean(d, w)
            m["delta_phi"] = d
        if w > 0:
            self.beta = obj.dual_update(self.beta, self.margin, d, self.hp.eta_beta)

    def _feasibility(self, m: dict) -> None:
        if not (self.arm.margin and self.arm.train_composer):
            return
        d = m.get("delta_phi")
        below = d is not None and not math.isnan(d) and d < self.margin
        self.infeasible_streak = self.infeasible_streak + 1 if below else 0
        if self.beta > self.hp.beta_max or self.infeasible_streak >= self.hp.infeasible_patience:
            if not self.infeasible and self.tracker is not None:
                self.tracker.set_tag("infeasible_margin", "true")
            self.infeasible = True

    # ------------------------------------------------------------------ validation
    def validation_tasks(self, tasks: list[Task] | None = None) -> list[Task]:
        return tasks if tasks is not None else stratified(self.res.val_tasks, self.hp.val_tasks)

    def validation_seed(self) -> int:
        # the same sampling seeds for every run of one seed (common random numbers across search trials)
        return 10_000 + self.seed

    def validate(self, tasks: list[Task] | None = None) -> float:
        tasks = self.validation_tasks(tasks)
        ev = self.res.params.evaluate
        self.bb.mode("student")
        res = evaluate_policy(self.bb.model, self.bb.fmt, self.res.envs, tasks, max_new_tokens=self.hp.max_new_tokens,
                              max_len=self.hp.max_len, batch_size=ev.batch_size, greedy=ev.greedy,
                              temperature=ev.temperature, seed=self.validation_seed(),
                              samples_per_task=self.hp.val_samples_per_task)
        return self.took_validation(tasks, res)

    def took_validation(self, tasks: list[Task], res: dict) -> float:
        """Keep a validation's per-task rewards; its mean reward."""
        self.last_val_per_task = [float(r["reward"]) for r in res["per_task"]]
        self.bb.model.train()
        return res["mean"] if tasks is not None and len(tasks) else float("nan")

    # ------------------------------------------------------------------ checkpoints
    def save(self, extra: dict | None = None) -> None:
        if self.ckpt_dir is None or (self.world is not None and not self.world.is_main):
            return
        save_trainer(self, self.ckpt_dir, extra)
        if self.tracker is not None:
            self.tracker.flush()  # what a kill would lose from MLflow is at most one checkpoint interval

    def restore(self) -> dict | None:
        if self.ckpt_dir is None or not (Path(self.ckpt_dir) / "meta.json").exists():
            return None
        state = restore_trainer(self, self.ckpt_dir)
        if self.world is not None and not self.world.is_main:  # the checkpoint holds rank 0's RNG only
            s = self.world.rank_seed(self.seed) + 7919 * self.step
            self.py_rng.seed(s)
            self.gen.manual_seed(s)
        return state

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict:
        """Train for ``hp.steps`` steps (resuming from the checkpoint if one exists): the one loop
        (:func:`lopd.training.loop.fit`) stepping this run alone."""
        progress = None if self.progress is None else (lambda step, rows: self.progress(step, rows[0]))
        return run_loop(Alone(self), progress)

    def record(self, row: dict) -> None:
        """Append ``row`` to the history (its columns only) and log its metrics to MLflow."""
        row = {k: row.get(k) for k in HISTORY_COLUMNS}
        row["seconds"] = round(row["seconds"], 3) if row.get("seconds") is not None else None
        self.history.append(row)
        if self.tracker is not None:
            from lopd.tracking.names import HISTORY_METRICS as metric_names

            self.tracker.log_metrics({metric_names[k]: v for k, v in row.items() if k in metric_names}, row["step"])
