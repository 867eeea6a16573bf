"""The ``launch`` section: ``lopd launch`` (lopd/launch/main.py) runs out-of-date stages as Ray jobs.
Read by no stage."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from lopd.config.section import Section


class LaunchResources(Section):
    """What one Ray job reserves (Ray sets CUDA_VISIBLE_DEVICES to the GPUs it grants)."""

    num_cpus: float = Field(ge=0, description="logical CPUs one job reserves")
    num_gpus: float = Field(ge=0, description="GPUs one job reserves (a real model's run spans its GPUs)")


class LaunchParams(Section):
    """``lopd launch`` (lopd/launch/main.py): the out-of-date stages as Ray jobs. Read by no stage."""

    resources: dict[str, LaunchResources] = Field(
        description="per job, by stage name (the part before '@'); `default` for every stage not listed")
    max_retries: int = Field(ge=0, description="attempts after the first, per job; a job still failing is "
                                               "reported with its log path")
    worktree_root: str | None = Field(description="where job worktrees go; null = <repo>/.dvc/tmp/launch (on a "
                                                  "cluster: a path on the shared filesystem)")
    shared_paths: list[str] = Field(description="repository paths linked (not copied) into every job's worktree: "
                                                "state and inputs in neither git nor DVC")
    keep_worktrees: bool = Field(description="keep each finished job's worktree (debugging)")

    @field_validator("resources")
    @classmethod
    def _has_default(cls, v):
        if "default" not in v:
            raise ValueError("launch.resources needs a `default` entry (the resources of every stage not listed)")
        return v

    @field_validator("shared_paths")
    @classmethod
    def _relative(cls, v):
        bad = [p for p in v if Path(p).is_absolute() or ".." in Path(p).parts]
        if bad:
            raise ValueError(f"launch.shared_paths must be paths inside the repository, got {bad}")
        return v
