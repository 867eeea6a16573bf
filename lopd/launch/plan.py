"""The plan of ``lopd launch``: which stages are out of date, in which order, and what each
job must restore before DVC runs it. Read from DVC's own stage graph and status."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from lopd.errors import BadInput


@dataclass(frozen=True)
class Job:
    name: str  # DVC's address of the stage, e.g. "train@lopd-0"
    kind: str  # the stage name before "@": the key of launch.resources
    lockfile: str  # repo-relative dvc.lock holding its entry
    lock_key: str  # its key in that lock file
    upstream: tuple[str, ...]  # stages whose outputs it reads (DVC's graph edges)
    in_main: bool  # DVC cannot run-cache it: it runs in the main workspace
    checkout: tuple[str, ...]  # upstream stages whose cached outputs `dvc checkout` restores
    copy_inputs: tuple[tuple[str, str | None], ...]  # (path, producing stage or None): copied if missing

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", self.name)


@dataclass
class Plan:
    jobs: dict[str, Job]  # every pipeline stage in scope
    launch: set[str]  # the out-of-date ones
    order: list[str]  # topological, upstream first
    lockfiles: list[str]
    keep: set[str] = field(default_factory=set)  # launched stages whose worktree serves uncached outputs

    @property
    def kinds(self) -> set[str]:
        return {j.kind for j in self.jobs.values()}


def needs_main_workspace(stage) -> bool:
    """Whether DVC writes no run-cache entry for the stage, so the fan-in could not restore it
    and it must run in the main workspace itself. DVC skips a stage without cmd, deps or outs,
    an ``always_changed`` one, one with a ``persist`` or non-local output
    (``dvc.stage.cache._can_hash``), and one with a ``cache: false`` output that is not a metric
    or plot (``Stage.run`` saves with ``run_cache=False`` then)."""
    if stage.always_changed or not (stage.cmd and stage.deps and stage.outs):
        return True
    return any(o.persist or o.protocol != "local" or not o.is_in_repo
               or not (o.use_cache or o.is_metric or o.is_plot) for o in stage.outs)


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _classify_inputs(stage, upstream, root: str) -> tuple[list[str], list[tuple[str, str | None]]]:
    """Upstream stages to check out, and inputs to copy when missing: outputs with ``cache: false``
    (no ``dvc checkout`` restores them) and files no stage produces (``None``)."""
    checkout, copy = [], []
    for dep in stage.deps:
        if dep.protocol != "local":
            continue
        rel = os.path.relpath(dep.fs_path, root)
        if rel.startswith(".."):
            continue  # outside the repository: the same absolute path everywhere
        producers = [(u, o) for u in upstream for o in u.outs
                     if _overlaps(rel, os.path.relpath(o.fs_path, root))]
        for u, o in producers:
            if u.addressing not in checkout:
                checkout.append(u.addressing)
            if not o.use_cache:
                copy.append((os.path.relpath(o.fs_path, root), u.addressing))
        if not producers:
            copy.append((rel, None))
    return checkout, copy


def read_plan(root: Path, targets: list[str]) -> Plan:
    """The stages in scope (``targets`` and their upstream, or all), their graph and which are
    out of date: those ``dvc status`` reports and everything downstream of them."""
    import networkx as nx
    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    old = os.getcwd()
    os.chdir(root)  # DVC addresses stages relative to the working directory
    try:
        with Repo(str(root)) as repo:
            g = repo.index.graph  # edge: stage -> a stage it depends on
            try:
                scope = set(g.nodes) if not targets else set().union(
                    *({s, *nx.descendants(g, s)} for t in targets for s in repo.stage.collect(t)))
                changed = set(repo.status(targets=targets or None, with_deps=bool(targets)))
            except DvcException as e:
                raise BadInput(f"dvc cannot read the pipeline: {e}") from None
            return _build(g, scope, changed, str(root), PipelineStage)
    finally:
        os.chdir(old)


def _build(g, scope: set, changed: set[str], root: str, pipeline_cls) -> Plan:
    import networkx as nx

    stale = {s for s in scope if s.addressing in changed}
    for s in list(stale):
        stale |= set(nx.ancestors(g, s)) & scope  # ancestors in DVC's edge direction = downstream
    data = sorted(s.addressing for s in stale if not isinstance(s, pipeline_cls))
    if data:
        raise BadInput(f"out of date outside the pipeline stages: {data}; run `dvc add`/`dvc update` first")
    jobs = {}
    for s in scope:
        if not isinstance(s, pipeline_cls):
            continue
        upstream = [u for u in g.successors(s)]
        checkout, copy = _classify_inputs(s, upstream, root)
        jobs[s.addressing] = Job(
            name=s.addressing, kind=s.name.split("@")[0], lockfile=os.path.relpath(
                os.path.splitext(s.path)[0] + ".lock", root), lock_key=s.name,
            upstream=tuple(sorted(u.addressing for u in upstream)), in_main=needs_main_workspace(s),
            checkout=tuple(checkout), copy_inputs=tuple(copy))
    order = [s.addressing for s in reversed(list(nx.topological_sort(g))) if s.addressing in jobs]
    launch = {s.addressing for s in stale if not s.frozen}
    keep = {p for n in launch if not jobs[n].in_main for _, p in jobs[n].copy_inputs
            if p in launch and not jobs[p].in_main}
    return Plan(jobs=jobs, launch=launch, order=order, lockfiles=sorted({j.lockfile for j in jobs.values()}),
                keep=keep)


def ready_stages(plan: Plan, pending: set[str], done: set[str], main_busy: bool) -> list[str]:
    """Pending stages whose launched upstream stages all finished, upstream first; at most one
    main-workspace stage at a time (DVC's lock allows one ``dvc repro`` per workspace)."""
    out = []
    for name in plan.order:
        if name not in pending:
            continue
        job = plan.jobs[name]
        if any(u in plan.launch and u not in done for u in job.upstream):
            continue
        if job.in_main:
            if main_busy:
                continue
            main_busy = True
        out.append(name)
    return out
