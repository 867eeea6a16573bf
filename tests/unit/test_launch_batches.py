"""``lopd launch --batch``: which ready stages go now and which share a job (:func:`lopd.launch.driver.next_jobs`),
each stage's priority (:func:`lopd.launch.driver.stage_levels`) and how many jobs of a kind the cluster runs at
once (:func:`lopd.launch.driver.slots_per_kind`). Hand-built plans, no DVC, no Ray."""

from __future__ import annotations

from lopd.config import LaunchResources
from lopd.launch.driver import next_jobs, slots_per_kind, stage_levels
from lopd.launch.plan import Job, Plan

CPU1 = {"default": LaunchResources(num_cpus=1, num_gpus=0)}


def _job(name: str, upstream: tuple[str, ...] = (), in_main: bool = False) -> Job:
    return Job(name=name, kind=name.split("@")[0], lockfile="dvc.lock", lock_key=name, upstream=upstream,
               in_main=in_main, checkout=(), copy_inputs=())


def _plan(*jobs: Job) -> Plan:
    return Plan(jobs={j.name: j for j in jobs}, launch={j.name for j in jobs}, order=[j.name for j in jobs],
                lockfiles=["dvc.lock"])


def test_levels_count_the_longest_chain_to_the_end():
    plan = _plan(_job("base"), _job("draw@0", ("base",)), _job("cold", ("base",)), _job("hpo", ("cold",)),
                 _job("confirm", ("draw@0", "hpo")))
    assert stage_levels(plan) == {"base": 4.0, "cold": 3.0, "hpo": 2.0, "draw@0": 2.0, "confirm": 1.0}


def test_the_longest_chain_goes_first_and_no_more_than_the_free_cpus():
    draws = [f"draw@{s}" for s in range(4)]
    plan = _plan(*map(_job, draws), _job("cold"))
    level = {**{d: 4.0 for d in draws}, "cold": 9.0}
    slots = {"draw": 2, "cold": 2}
    # cold is ready last but outranks the draws; with 2 free CPUs one draw job goes beside it
    assert next_jobs(plan, [*draws, "cold"], slots, level, CPU1, {"CPU": 2, "GPU": 0}) == [("cold",), tuple(draws[:2])]
    assert next_jobs(plan, [*draws, "cold"], slots, level, CPU1, {"CPU": 1, "GPU": 0}) == [("cold",)]
    assert next_jobs(plan, draws, slots, level, CPU1, {"CPU": 0, "GPU": 0}) == []


def test_a_job_takes_a_share_of_what_is_left_of_its_kind():
    """Guided self-scheduling: each job takes ceil(n / slots) of the n stages of its kind still ready, so the
    jobs shrink as the kind runs out and the last ones balance the slots."""
    draws = [f"draw@{s}" for s in range(7)]
    plan = _plan(*map(_job, draws))
    level = {d: 1.0 for d in draws}
    got = next_jobs(plan, draws, {"draw": 2}, level, CPU1, {"CPU": 2, "GPU": 0})
    assert got == [tuple(draws[:4]), tuple(draws[4:6])]
    assert next_jobs(plan, draws[6:], {"draw": 2}, level, CPU1, {"CPU": 1, "GPU": 0}) == [(draws[6],)]


def test_a_main_workspace_stage_is_its_own_job_and_a_job_that_does_not_fit_is_passed_over():
    plan = _plan(_job("search", in_main=True), _job("train@a"), _job("train@b"), _job("note"))
    level = {"search": 5.0, "train@a": 4.0, "train@b": 4.0, "note": 1.0}
    res = {**CPU1, "train": LaunchResources(num_cpus=1, num_gpus=2)}
    got = next_jobs(plan, ["search", "train@a", "train@b", "note"], {"train": 1, "search": 2, "note": 2}, level, res,
                    {"CPU": 2, "GPU": 1})
    # the trains need 2 GPUs of the 1 free: passed over, and the lower `note` fills the second CPU
    assert got == [("search",), ("note",)]


def test_slots_follow_the_scarcer_resource():
    plan = _plan(_job("train@a"), _job("evaluate@a"), _job("prepare"))
    res = {**CPU1, "train": LaunchResources(num_cpus=1, num_gpus=2), "evaluate": LaunchResources(num_cpus=4, num_gpus=0)}
    got = slots_per_kind(plan, res, {"CPU": 2.0, "GPU": 4.0})
    # train: 2 by CPU, 2 by GPU; evaluate: 4 CPUs of 2 -> 0, floored at 1 job; prepare: the default, 2 by CPU
    assert got == {"train": 2, "evaluate": 1, "prepare": 2}
