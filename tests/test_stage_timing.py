"""The start-up figure of bench/pipeline.sh reads each stage process's start time
(lopd.cli.process_start_time): it must be the real start, to the clock tick."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from lopd.cli import process_start_time


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
