"""The start-up figure of bench/pipeline.sh reads each stage process's start time
(lopd.utils.process_start_time): it must be the real start, to the clock tick."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from lopd.utils import pid_started_before, process_start_time


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_process_start_time_is_the_real_start():
    tick = 1 / os.sysconf("SC_CLK_TCK")
    for _ in range(3):
        before = time.time()
        proc = subprocess.Popen(["sleep", "0.5"])
        after = time.time()
        try:
            start = process_start_time(proc.pid)
        finally:
            proc.kill()
            proc.wait()
        # /proc/stat's btime is whole seconds: taken as the boot time it put starts up to 1 s early
        assert before - 2 * tick <= start <= after + 2 * tick, (before, start, after)
    assert process_start_time() <= time.time()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_a_dead_or_zombie_process_has_no_start_and_did_not_write():
    zombie = subprocess.Popen(["true"])
    deadline = time.time() + 10
    while time.time() < deadline:  # exited, not yet reaped: a zombie
        with open(f"/proc/{zombie.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    assert process_start_time(zombie.pid) is None
    assert not pid_started_before(zombie.pid, time.time())
    zombie.wait()  # reaped: gone
    assert process_start_time(zombie.pid) is None
    assert not pid_started_before(zombie.pid, time.time())
    assert pid_started_before(os.getpid(), time.time())
    assert not pid_started_before(os.getpid(), process_start_time() - 5)  # a later process than the writer
