"""OS-level limits for the sandbox's child: rlimits, and, where the machine allows, an empty
network namespace and an unprivileged uid (probed once per parent process, cached)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading

from lopd.sandbox.child import NOBODY, bind_unshare

_ISO_LOCK = threading.Lock()
_ISO: dict | None = None
_UNSHARE = None


def unshare_fn():
    """A callable doing ``unshare(CLONE_NEWNET)``, resolved once in this process (not after fork)."""
    global _UNSHARE
    if _UNSHARE is None:
        _UNSHARE = bind_unshare()
    return _UNSHARE


def limit_args(timeout_s: float, mem_mb: int) -> tuple[int, int]:
    """(RLIMIT_CPU seconds, RLIMIT_AS bytes) for a child with this wall-clock timeout and memory."""
    return max(1, int(timeout_s) + 1), int(mem_mb) * 1024 * 1024


def make_preexec(timeout_s: float, mem_mb: int, netns: bool, drop: bool, unshare=None):
    """A ``preexec_fn`` entering an empty network namespace (``netns``, as the fork server does at
    start) and applying :func:`lopd.sandbox.child.confine` (used by the one-off probe; the
    sandbox's child confines itself, see ``confine``)."""
    from lopd.sandbox.child import confine

    cpu, mem = limit_args(timeout_s, mem_mb)

    def preexec() -> None:
        if netns:
            (unshare or bind_unshare())()
        confine(cpu, mem, drop)

    return preexec


def _probe(netns: bool, drop: bool) -> bool:
    d = tempfile.mkdtemp(prefix="lopd-probe-")
    try:
        if drop:
            os.chown(d, NOBODY, NOBODY)
        pre = make_preexec(5.0, 256, netns, drop, unshare_fn() if netns else None)
        r = subprocess.run(
            [sys.executable, "-I", "-S", "-c", "import os; print(os.getuid())"],
            cwd=d, env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=10, preexec_fn=pre, start_new_session=True,
        )
        want = str(NOBODY) if drop else str(os.getuid())
        return r.returncode == 0 and r.stdout.strip() == want.encode()
    except Exception:
        return False
    finally:
        shutil.rmtree(d, ignore_errors=True)


def isolation() -> dict:
    """Which OS-level barriers this machine allows: ``{"netns": bool, "drop_uid": bool}``.

    Probed once (a few tiny child processes) and cached for the life of the process.
    """
    global _ISO
    with _ISO_LOCK:
        if _ISO is None:
            is_root = hasattr(os, "geteuid") and os.geteuid() == 0
            netns = drop = False
            if is_root:
                try:
                    unshare_fn()
                    netns = _probe(True, False)
                except Exception:
                    netns = False
                drop = _probe(netns, True)
                if not drop and netns:
                    # prefer keeping at least one barrier
                    drop = _probe(False, True)
                    if drop:
                        netns = False
            _ISO = {"netns": netns, "drop_uid": drop}
        return dict(_ISO)
