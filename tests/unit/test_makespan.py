"""The makespan estimate's arithmetic on hand-drawn graphs (lopd/launch/makespan.py)."""

from __future__ import annotations

import json

import pytest

from lopd.launch.makespan import critical_path, list_schedule, stage_seconds

DIAMOND = {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}
DIAMOND_S = {"a": 3.0, "b": 2.0, "c": 4.0, "d": 1.0}


def test_the_critical_path_of_a_diamond():
    assert critical_path(DIAMOND_S, DIAMOND) == (8.0, ["a", "c", "d"])


def test_list_schedule_by_hand():
    # one worker: the sum; two: a, then c and b side by side (c first: the longer path), d after c
    assert list_schedule(DIAMOND_S, DIAMOND, 1) == 10.0
    assert list_schedule(DIAMOND_S, DIAMOND, 2) == 8.0
    assert list_schedule(DIAMOND_S, DIAMOND, 64) == 8.0
    # a chain x1 -> x2 (5 + 5) beside y and z (4 each): on two workers x1 and y start (the longest levels),
    # z follows y at 4, x2 follows x1 at 5: 10, the chain's length; on one worker 18
    g = {"x1": (), "x2": ("x1",), "y": (), "z": ()}
    s = {"x1": 5.0, "x2": 5.0, "y": 4.0, "z": 4.0}
    assert list_schedule(s, g, 1) == 18.0 and list_schedule(s, g, 2) == 10.0
    assert critical_path(s, g) == (10.0, ["x1", "x2"])
    with pytest.raises(ValueError):
        list_schedule(s, g, 0)


def test_a_worker_more_never_slows_the_schedule_below_the_critical_path():
    g = {f"s{i}": tuple(f"s{j}" for j in range(i) if (i + j) % 3 == 0) for i in range(12)}
    s = {f"s{i}": float(1 + (i * 7) % 5) for i in range(12)}
    cp, _ = critical_path(s, g)
    spans = [list_schedule(s, g, w) for w in (1, 2, 4, 16)]
    assert spans[0] == sum(s.values()) and all(x >= cp for x in spans) and spans[-1] == cp


def test_stage_seconds_reads_the_timing_side_files(tmp_path):
    (tmp_path / "train-lopd.json").write_text(json.dumps({"stage": "train@lopd", "t_process": 10.0, "t_work": 12.5,
                                                          "t_end": 40.0}))
    (tmp_path / "other.txt").write_text("x")
    assert stage_seconds(tmp_path) == {"train@lopd": 30.0}


def test_an_overhead_per_job_is_added_to_every_stage():
    # the diamond with 1 s more per stage: a 4, b 3, c 5, d 2; on two workers a, then c beside b, d: 11
    assert list_schedule(DIAMOND_S, DIAMOND, 2, overhead=1.0) == 11.0
    assert list_schedule(DIAMOND_S, DIAMOND, 1, overhead=1.0) == 14.0
