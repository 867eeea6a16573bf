"""``python -m lopd.launch.watchdog CMD...``: run CMD so that it cannot outlive the job that started it.

The watchdog leads its own process group, runs CMD in that group and waits. If its parent (the Ray
worker) dies — killed, node lost — it is re-parented; it notices within ``POLL_S`` and stops
the whole group (CMD, DVC's stage command, the watchdog). Killing the group from outside (a test,
an operator) stops everything at once. Standard library only: it starts in milliseconds, and
:func:`stop_group` is shared with :mod:`lopd.launch.job` from here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 10.0  # SIGTERM, then SIGKILL


def stop_group(pgid: int, proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """The one way a launcher stops a process group (this watchdog's, and :mod:`lopd.launch.job`'s):
    SIGTERM to group ``pgid`` (0: the caller's own), up to ``grace_s`` for ``proc`` to exit, then
    SIGKILL to the group for its stragglers (with ``pgid`` 0, the caller too) and reap ``proc``.
    A group already gone is not an error."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_group_gone(pgid: int, timeout_s: float = 5.0) -> None:
    """Wait (at most ``timeout_s``) until no process of group ``pgid`` is left: after its leader exits, the
    members it SIGKILLed can still be dying, and a job's end must not be reported before its group is gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _stop_own_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # the watchdog outlives the SIGTERM it sends to its group
    stop_group(0, proc)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m lopd.launch.watchdog CMD [ARGS...]", file=sys.stderr)
        return 2
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    parent = os.getppid()
    proc = subprocess.Popen(argv)

    def on_signal(signum, frame):  # noqa: ARG001
        _stop_own_group(proc)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while proc.poll() is None:
        if os.getppid() != parent:
            _stop_own_group(proc)
        time.sleep(POLL_S)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
