"""Every path the pipeline reads or writes, rooted at the repository — never at the working directory.

The root is the directory that holds the params file (``params.yaml`` sits at the repository
root, and a test workspace keeps its own params file at its own root), so a stage behaves the
same from any working directory. ``LOPD_ROOT`` overrides it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


NOT_RUN = "not_run.json"
REGISTRATION_MARKER = "registration.json"  # beside confirmatory runs: the registration they were trained under


@dataclass(frozen=True)
class Paths:
    root: Path

    @classmethod
    def for_params(cls, params_file: str | Path) -> "Paths":
        env = os.environ.get("LOPD_ROOT")
        return cls(Path(env).resolve() if env else Path(params_file).resolve().parent)

    # --- DVC outputs (content is a deterministic function of the declared deps) -----------------
    @property
    def splits(self) -> Path:
        return self.root / "data" / "splits"

    @property
    def base(self) -> Path:
        return self.root / "models" / "base"

    @property
    def bank(self) -> Path:
        return self.root / "models" / "bank"

    @property
    def cold_start(self) -> Path:
        return self.root / "models" / "cold_start"

    def bank_draw(self, draw: int) -> Path:
        """The experience bank of upstream draw ``draw`` (= the training seed of the final runs)."""
        return self.root / "models" / "draws" / f"bank-{draw}"

    def cold_start_draw(self, draw: int) -> Path:
        """φ0 cold-started on :meth:`bank_draw` ``(draw)``."""
        return self.root / "models" / "draws" / f"cold_start-{draw}"

    def upstream(self, draw: int | None) -> tuple[Path, Path]:
        """(bank, φ0) directories of upstream draw ``draw``; ``None``: the shared draw."""
        if draw is None:
            return self.bank, self.cold_start
        return self.bank_draw(draw), self.cold_start_draw(draw)

    # --- the confirmation (lopd.confirmation) -----------------------------------------------------
    @property
    def confirm_split(self) -> Path:
        """The sealed confirmatory split and its manifest (stage ``confirm_split``)."""
        return self.root / "data" / "confirm"

    @property
    def registration(self) -> Path:
        """``registration.json`` (stage ``register``): what the confirmation tests, before its split is read."""
        return self.root / "registration" / "registration.json"

    def confirm_draw(self, seed: int) -> tuple[Path, Path]:
        """(bank, φ0) directories of the confirmation's training seed ``seed`` (stage ``confirm_draw@seed``),
        shared by every point of S."""
        d = self.root / "models" / "confirm_draws" / f"seed-{seed}"
        return d / "bank", d / "cold_start"

    def confirm_runs(self, slot: int) -> Path:
        """Every run of slot ``slot`` of S (stage ``confirm_train@slot``): ``<arm>/seed-<s>``."""
        return self.root / "confirm" / "runs" / f"p{slot}"

    @property
    def confirm_eval(self) -> Path:
        """The confirmatory evaluation (stage ``confirm_evaluate``): ``<point>/<arm>/seed-<s>``, base under ``shared``."""
        return self.root / "confirm" / "eval"

    @property
    def hpo(self) -> Path:
        return self.root / "hpo"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def eval(self) -> Path:
        return self.results / "eval"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    # --- not DVC outputs ---------------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        """Mid-run checkpoints (a killed run resumes from here; removed when the run completes)."""
        return self.root / "checkpoints"

    @property
    def meta(self) -> Path:
        """Side files: run ids, timings, host names — everything that must not enter a DVC output."""
        return self.root / ".lopd" / "meta"

    def meta_file(self, stage: str) -> Path:
        return self.meta / f"{stage.replace('@', '-')}.json"

    def arm_runs(self, arm: str) -> Path:
        """Every training seed of ``arm`` (stage ``train@{arm}``'s output): ``seed-<s>/`` each."""
        return self.runs / arm

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.arm_runs(arm) / f"seed-{seed}"

    def not_run(self, arm: str) -> Path:
        """What ``train@{arm}`` writes instead of seeds when the arm cannot run by design (lopd_binding when no
        search trial's margin binds): ``{"arm", "reason"}``; ``evaluate@{arm}`` then writes its own beside
        its outputs and reads no test task."""
        return self.arm_runs(arm) / NOT_RUN

    def arm_evals(self, arm: str) -> Path:
        """Every seed's test evaluation of ``arm`` (stage ``evaluate@{arm}``'s output)."""
        return self.eval / arm

    def eval_dir(self, arm: str, seed: int) -> Path:
        return self.arm_evals(arm) / f"seed-{seed}"
