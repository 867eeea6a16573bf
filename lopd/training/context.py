"""The teacher's privileged context: what the frozen teacher is conditioned on, per arm.

* ``text``    — the raw token ids of the ``n_ret`` retrieved trajectories (OPSD with text context);
* ``latent``  — ``c_φ``: the composer's ``K`` latent vectors per retrieved trajectory (LOPD); a
  frozen composer's (lopd_frozen) are ``c_φ0``, computed once per task before training and reused;
* ``learned`` — one learned context of ``n_ret·K`` vectors shared by every task, no retrieval
  (``lopd_nocontent``): separates "any success-conditioned context" from retrieved *content*;
  it starts at the mean of ``c_φ0`` over the train tasks and is anchored there.

Retrieval follows the arm's bank mode (relevant / shuffled / unrelated) and is cached per task.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lopd.envs.base import Task


@dataclass
class TeacherContext:
    """The prefix the teacher reads before the student's tokens."""

    prefix: torch.Tensor  # [B, P, H] embeddings
    mask: torch.Tensor  # [B, P] attention mask of the prefix
    latent: bool  # True: ``prefix`` are latents (position ids restart after them)
    c_phi: torch.Tensor | None = None  # the trainable context (latent / learned), for the anchor and margin
    c_phi0: torch.Tensor | None = None  # its anchor: the cold-started composer's output on the same tasks


class ContextBuilder:
    """Builds :class:`TeacherContext` for a batch of tasks under one arm's switches."""

    def __init__(self, res, arm, hp, seed: int, composer=None):  # res: trainer.Resources (it imports this module)
        self.res, self.arm, self.hp, self.seed = res, arm, hp, seed
        self.bb = res.bb
        self.composer = composer
        self.learned: torch.nn.Parameter | None = None
        self._ids: dict[str, list[list[int]]] = {}
        self._c0: dict[str, torch.Tensor] = {}

    def experiences_for(self, task: Task) -> list[list[int]]:
        """Token ids of the ``n_ret`` experiences retrieved for ``task`` under the arm's bank mode
        (the learned context is initialised from relevant retrieval, then retrieves nothing)."""
        if task.task_id not in self._ids:
            mode = "relevant" if self.arm.context == "learned" else self.arm.bank_mode
            q = self.res.task_emb[task.task_id]
            exps = self.res.bank.retrieve(task, q, self.hp.n_ret, mode, seed=self.seed)
            self._ids[task.task_id] = [self.bb.fmt.experience_ids(e.messages) for e in exps]
        return self._ids[task.task_id]

    def prime(self, tasks: list[Task]) -> None:
        """Compute ``c_φ0`` of every task once, before training (the anchor's target)."""
        if self.composer is None:
            return
        with torch.no_grad():
            for i in range(0, len(tasks), 64):
                chunk = tasks[i:i + 64]
                for t, c in zip(chunk, self.composer([self.experiences_for(t) for t in chunk], self.hp.K)):
                    self._c0[t.task_id] = c.detach().clone()
        if self.arm.context == "learned":
            mean = torch.stack([self._c0[t.task_id] for t in tasks]).mean(0)
            self.learned = torch.nn.Parameter(mean.clone())
            self._learned0 = mean

    def phi_params(self) -> list[torch.nn.Parameter]:
        """What φ is for this arm: the composer's parameters, or the learned context."""
        if not self.arm.train_composer:
            return []
        if self.arm.context == "learned":
            return [self.learned]
        return self.composer.phi_params() if self.composer is not None else []

    def build(self, tasks: list[Task], latents: torch.Tensor | None = None) -> TeacherContext:
        """The teacher's context for ``tasks``; ``latents``: the composer's output on them, where the
        caller already ran it (a population runs every member's composer in one pass)."""
        if self.arm.context == "text":
            return self._text(tasks)
        if self.arm.context == "learned":
            c = self.learned.unsqueeze(0).expand(len(tasks), -1, -1)
            c0 = self._learned0.unsqueeze(0).expand(len(tasks), -1, -1)
        else:
            c0 = torch.stack([self._anchor(t) for t in tasks])
            if self.arm.train_composer:
                c = latents if latents is not None else self.composer([self.experiences_for(t) for t in tasks], self.hp.K)
            else:  # a frozen composer (lopd_frozen) is φ0 for good: its latents are c_φ0, computed once in prime()
                c = c0
        mask = torch.ones(c.shape[:2], dtype=torch.long, device=c.device)
        return TeacherContext(prefix=c, mask=mask, latent=True, c_phi=c, c_phi0=c0)

    def _text(self, tasks: list[Task]) -> TeacherContext:
        from lopd.model.chat import pad_sequences

        ctx = [self.bb.fmt.join_context(self.experiences_for(t)) for t in tasks]
        ids, mask = pad_sequences(ctx, self.bb.fmt.pad_id, self.bb.device, left=True)
        with torch.no_grad():
            emb = self.bb.embed(ids)
        return TeacherContext(prefix=emb, mask=mask, latent=False)

    def _anchor(self, task: Task) -> torch.Tensor:
        if task.task_id not in self._c0:
            raise RuntimeError(f"c_phi0 of task {task.task_id} was not primed before training")
        return self._c0[task.task_id]

    # checkpoint state of the learned context (the composer saves its own)
    def state(self) -> dict[str, torch.Tensor]:
        return {"learned": self.learned.detach().clone()} if self.learned is not None else {}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.learned is not None and "learned" in state:
            with torch.no_grad():
                self.learned.copy_(state["learned"])
