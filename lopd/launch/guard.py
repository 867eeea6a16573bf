"""``python -m lopd.launch.guard CMD...``: run CMD so that it cannot outlive the job that started it.

The guard leads its own process group, runs CMD in that group and waits. If its parent (the Ray
worker) dies — killed, node lost — it is re-parented; it notices within ``POLL_S`` and stops
the whole group (CMD, DVC's stage command, the guard). Killing the group from outside (a test,
an operator) stops everything at once. Standard library only: it starts in milliseconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 10.0  # SIGTERM, then SIGKILL


def _stop_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # the guard outlives the SIGTERM it sends to its group
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(0, signal.SIGKILL)  # stragglers, and the guard itself


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m lopd.launch.guard CMD [ARGS...]", file=sys.stderr)
        return 2
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    parent = os.getppid()
    proc = subprocess.Popen(argv)

    def on_signal(signum, frame):  # noqa: ARG001
        _stop_group(proc)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while proc.poll() is None:
        if os.getppid() != parent:
            _stop_group(proc)
        time.sleep(POLL_S)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
