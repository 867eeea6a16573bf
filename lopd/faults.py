"""Fault injection: kill the whole process group at a named point of a named stage.

``LOPD_KILL_AT=<stage>:<point>[:<n>]`` makes the process that reaches ``point`` for the ``n``-th
time (default 1) while running DVC stage ``stage`` (its ``DVC_STAGE``; a shell pattern such as
``evaluate@*`` matches any item) SIGKILL its own process group: ``dvc repro``, the warm worker and
every stage child die at once, as under a power cut or an OOM kill. The kill-anywhere tests use it
so that every kill lands where it says, every time, with no timing.

Points (each a call of :func:`kill_point` in the code that does it):

* ``write``: just after an output file is renamed into place (:func:`lopd.utils.atomic_output`; side
  files under ``.lopd/``, such as the lock guard's snapshot and the timing files, do not count);
* ``checkpoint``: just after a checkpoint directory is swapped into place
  (:func:`lopd.training.checkpoint.save_checkpoint`);
* ``step``: inside a training step, after the backward pass and before any optimiser step
  (a run alone and a population, so also a search batch);
* ``mlflow_close``: as a stage's MLflow run (or the report's experiment parent) is about to be
  marked FINISHED: the run stays RUNNING, as when a kill lands in MLflow's own write;
* ``lock``: while ``lopd repro`` has DVC rewrite ``dvc.lock`` after the stage: half of the new
  lock is on disk (written and fsynced) when the group dies (``lopd.workflow.lockguard.arm_lock_kill``).

Before dying it appends one line to ``$LOPD_KILL_LOG`` (if set) and prints it to stderr, so a test
can tell that the point was reached. Unset (the default), every call is one dictionary lookup.
"""

from __future__ import annotations

import fnmatch
import os
import re
import signal
import sys
import time
from dataclasses import dataclass

ENV = "LOPD_KILL_AT"
LOG_ENV = "LOPD_KILL_LOG"
POINTS = ("write", "checkpoint", "step", "mlflow_close", "lock")

_hits: dict[str, int] = {}


@dataclass(frozen=True)
class KillSpec:
    stage: str   # a DVC stage name or shell pattern
    point: str
    nth: int = 1

    @classmethod
    def parse(cls, text: str) -> "KillSpec":
        m = re.fullmatch(rf"(.+):({'|'.join(POINTS)})(?::([1-9][0-9]*))?", text)
        if m is None:
            raise ValueError(f"{ENV}={text!r}: expected <stage>:<point>[:<n>] with point one of "
                             f"{', '.join(POINTS)} and n >= 1")
        return cls(m[1], m[2], int(m[3] or 1))

    def matches(self, stage: str | None, point: str) -> bool:
        return point == self.point and stage is not None and fnmatch.fnmatchcase(stage, self.stage)


def spec() -> KillSpec | None:
    """The parsed ``LOPD_KILL_AT``, None when unset; a malformed value is bad input (exit 2)."""
    from lopd.errors import BadInput

    text = os.environ.get(ENV)
    try:
        return KillSpec.parse(text) if text else None
    except ValueError as e:
        raise BadInput(str(e)) from None


def kill_group(where: str) -> None:
    """Record ``where`` (log file, stderr), then SIGKILL this process's whole group."""
    line = f"{time.time():.3f} pid {os.getpid()} pgid {os.getpgrp()} killed at {where}"
    if log := os.environ.get(LOG_ENV):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    print(f"lopd: {ENV}: {line}", file=sys.stderr, flush=True)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def hit(point: str) -> int:
    """Count one more hit of ``point`` in this process; the count so far."""
    _hits[point] = _hits.get(point, 0) + 1
    return _hits[point]


def kill_point(point: str, stage: str | None = None, detail: str = "") -> None:
    """Die here if ``LOPD_KILL_AT`` names this point of this stage (default: ``$DVC_STAGE``) and this
    is its ``n``-th hit in this process. ``detail`` (e.g. an MLflow run id) goes into the log line."""
    if ENV not in os.environ:
        return
    s, stage = spec(), stage or os.environ.get("DVC_STAGE")
    if not s.matches(stage, point):
        return
    if hit(point) == s.nth:
        kill_group(f"{stage}:{point}:{s.nth}" + (f" {detail}" if detail else ""))
