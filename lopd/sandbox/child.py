"""The sandbox's child program.

The parent (:mod:`lopd.sandbox.server`) writes this file and :mod:`lopd.sandbox.plain` (the
codec it shares with the parent), with their bytecode, into a temp dir and starts ``python -I
-S -B child.pyc --server <fd>`` there once per parent process: the **fork server**
(:func:`server`). It imports everything a child needs and builds what every program shares
(:func:`prepare`), then waits on the socket ``fd``; for each program the parent sends the
program's temp dir and limits together with the three pipe ends that become the program's
stdin, stdout and stderr. The server forks; the fork confines
itself (:func:`start_child`, then :func:`confine`) and runs :func:`run`. The server never
reads a payload or runs user code, so every program starts from the same pristine process.
Standard library only; nothing runs at import.

**Protocol of one program.** ``payload.json`` (reply marker, code, function name, recursion
limit) is read and deleted before the user code runs. The child defines the code in a fresh
``__main__``, answers sequence number 0 (defined, or why not), then one request per line of
its original stdin, ``[seq, args, kwargs]`` in plain data (``args`` ``None`` ends the
session), each with one line on a private duplicate of its original stdout: ``<marker> <seq>
<status> <body>``, status ``ok`` (body: the return value), ``error`` (body: the exception, as
a string) or ``refused`` (the audit hook refused something so far, even if the user code
swallowed it). The user code's fd 0 reads ``/dev/null`` and its fd 1 writes to stderr. No
reply decides a score by itself: the parent decodes it as plain data and compares it with
what the child never sees, so even a forged reply can only claim a value the code could have
returned.

The audit hook (:func:`lopd.sandbox.audit.make_guard`, in ``audit.py`` beside this file) is the
in-process barrier; its rules are listed in :mod:`lopd.sandbox`.
"""

from __future__ import annotations

import os
import resource  # imported here, not in confine: confine also runs after a fork (the probe's preexec_fn)
import sys

if __package__:  # imported inside lopd
    from lopd.sandbox.audit import disarm, make_guard, read_roots, std_roots
    from lopd.sandbox.plain import make_codec, type_name
else:  # run as the child program, next to copies of plain.py and audit.py (``-I`` leaves its dir off sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from audit import disarm, make_guard, read_roots, std_roots
    from plain import make_codec, type_name

    del sys.path[0]

# ------------------------------------------------------------------ OS limits
NOBODY = 65534
CLONE_NEWNET = 0x40000000
FSIZE_BYTES = 1 << 20
NOFILE = 32
# what every program would otherwise build after its fork: (the plain-data codec, the shared read roots);
# set by the fork server before it forks (:func:`prepare`), None where run() is reached otherwise
_PREPARED: tuple | None = None


def bind_unshare():
    """A callable doing ``unshare(CLONE_NEWNET)`` (an empty network namespace), resolved now:
    ``os.unshare`` from Python 3.12, ``libc.unshare`` through ctypes before that. Bound once in
    the parent or the fork server, never after a fork."""
    if hasattr(os, "unshare"):
        return lambda: os.unshare(CLONE_NEWNET)
    import ctypes

    fn = ctypes.CDLL(None, use_errno=True).unshare
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int

    def unshare() -> None:
        if fn(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")

    return unshare


def confine(cpu_s: int, mem_bytes: int, netns: bool, drop: bool, unshare=None) -> None:
    """Namespace, rlimits, uid: the first thing a forked child does, before the payload is read.

    Done in the child (forked from the small fork server), never in the parent: forking the
    parent, with torch loaded, costs ~20 ms of page-table copying per program and stalls its
    other threads. ``unshare`` comes from :func:`bind_unshare`, bound before the fork.
    """
    if netns:
        (unshare or bind_unshare())()
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_BYTES, FSIZE_BYTES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if drop:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    # lowered *after* setuid: the per-user process count then makes every fork/clone
    # fail. Root ignores RLIMIT_NPROC, so this only bites once the uid is dropped (or
    # when the parent is not root); the audit hook refuses os.fork regardless.
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def describe(e, _type=type, _str=str, _base=BaseException) -> str:
    """``"<type>: <message>"``, safe against an exception whose ``__str__`` misbehaves."""
    try:
        msg = _str(e)
        msg = msg[:200] if _type(msg) is _str else ""
    except _base:
        msg = ""
    return type_name(_type(e)) + (": " + msg if msg else "")


# ------------------------------------------------------------------ the run
def make_channel(marker: str, dumps, refusals: list):
    """``(reply, next_request)`` over private duplicates of fds 1 and 0, which are then
    pointed at stderr and ``/dev/null`` for the user code."""
    out_fd, in_fd = os.dup(1), os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    from builtins import BaseException, bytearray, bytes

    write, read, int_repr = os.write, os.read, int.__repr__
    head = "\n" + marker + " "
    pending = bytearray()

    def reply(seq: int, status: str, value) -> None:
        if refusals:
            status, value = "refused", refusals[0][:200]
        try:
            body = dumps(value)
        except BaseException as e:  # not plain data, an int too long, a recursion too deep
            status, body = "error", dumps("unusable return value (" + describe(e) + ")")
        write(out_fd, (head + int_repr(seq) + " " + status + " " + body + "\n").encode())

    def next_request():
        while True:
            i = pending.find(b"\n")
            if i >= 0:
                line = bytes(pending[:i])
                del pending[: i + 1]
                return line.decode()
            chunk = read(in_fd, 65536)
            if not chunk:
                return None
            pending.extend(chunk)

    return reply, next_request


def serve(fn, reply, next_request, loads, exit_) -> None:
    """Answer requests until the parent ends the session (or closes the pipe)."""
    from builtins import BaseException

    while True:
        line = next_request()
        if line is None:
            exit_(0)
        seq, args, kwargs = loads(line)
        if args is None:
            reply(seq, "ok", None)
            exit_(0)
        try:
            value = fn(*args, **kwargs)
        except BaseException as e:
            reply(seq, "error", describe(e))
            continue
        reply(seq, "ok", value)


def run(cpu_s: int, mem_bytes: int, netns: bool, drop: bool, unshare) -> None:
    """One program, in a fork of the server whose cwd is already the program's temp dir:
    confine, read the payload, install the hook, define the code, answer calls. Never returns."""
    import builtins
    import types
    from builtins import BaseException

    confine(cpu_s, mem_bytes, netns, drop, unshare)
    tmp = os.path.realpath(os.getcwd())
    (dumps, loads), shared_roots = _PREPARED or (make_codec(), None)
    with open("payload.json", "rb") as fh:
        payload = loads(fh.read().decode())  # the parent wrote it with the same codec (no json import)
    os.remove("payload.json")
    hook, refusals = make_guard(tmp, read_roots(tmp, shared_roots))
    reply, next_request = make_channel(payload["marker"], dumps, refusals)
    code, fn_name, exit_, callable_ = payload["code"], payload["fn"], os._exit, callable
    sys.setrecursionlimit(payload["recursion_limit"])
    del payload
    disarm()
    user = types.ModuleType("__main__")
    user.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = user
    sys.addaudithook(hook)
    try:
        exec(compile(code, "<solution>", "exec"), user.__dict__)
        fn = user.__dict__.get(fn_name)
        if not callable_(fn):
            reply(0, "error", "no callable %s defined" % fn_name)
            exit_(0)
    except BaseException as e:
        reply(0, "error", describe(e))
        exit_(0)
    reply(0, "ok", None)
    serve(fn, reply, next_request, loads, exit_)


# ------------------------------------------------------------------ the fork server
def prepare() -> None:
    """Once in the fork server, before any fork: what each program would otherwise redo after its fork.

    - The compiler's first use in a process costs about 0.9 ms (its lazily built state), measured
      per program at ``bench/scoring.py``; a warm-up compile here leaves the children only their own.
    - The plain-data codec and the standard library's read roots (realpaths of ``sys.path``) are the
      same for every program. Each child gets a copy of them with its fork, as it got the modules.
    """
    global _PREPARED
    compile("def _warm(x):\n    return [x * 2 for _ in range(3)]\n", "<warm>", "exec")
    _PREPARED = (make_codec(), std_roots())


def start_child(fds, tmp: str, limits, unshare) -> None:
    """In a fresh fork of the server: own session and process group (the parent kills the
    group), default signal dispositions, ``fds`` as 0/1/2 and no other descriptor, cwd and
    ``$HOME`` the program's temp dir; then :func:`run`. Never returns."""
    import signal

    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, 1 << 20)  # the server's socket and wake-up pipe, the received fds
    os.chdir(tmp)
    os.environ["HOME"] = tmp
    run(*limits, unshare)


def server(ctl_fd: int) -> None:
    """The fork server's loop (single-threaded, so ``fork`` is safe). Messages on the
    ``SOCK_SEQPACKET`` socket ``ctl_fd``, one per packet, ASCII:

    - in: ``spawn <id> <cpu_s> <mem_bytes> <netns> <drop> <tmp>`` with three fds attached
      (the program's stdin, stdout, stderr); out: ``spawned <id> <pid>`` or ``failed <id> <why>``;
    - in: ``kill <pid>``: SIGKILL the program's process group, only while the pid is still its
      unreaped child (a reaped pid may already be someone else's);
    - out: ``exit <pid> <wait status>`` when a program ends (reaped on SIGCHLD).

    When the parent's end closes (it exited or was killed), every live program is killed and
    the server exits: it never outlives its parent's use of it.
    """
    import _thread  # noqa: F401  (preloaded: each child imports it; a fork then finds it loaded)
    import posix  # noqa: F401
    import select
    import signal
    import socket
    import stat  # noqa: F401
    import types  # noqa: F401

    prepare()
    fs = _ForkServer(socket.socket(fileno=ctl_fd), bind_unshare())
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes wake_w
    fs.ctl.send(b"ready %d" % os.getpid())
    try:
        while True:
            ready = select.select([fs.ctl, wake_r], [], [])[0]
            if wake_r in ready:
                _drain(wake_r)
                fs.reap()
            if fs.ctl in ready:
                msg, fds, _, _ = socket.recv_fds(fs.ctl, 65536, 3)
                if not msg:
                    break  # the parent is gone
                fs.handle(msg, fds)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone
    for pid in list(fs.live):
        fs.kill(pid)
    os._exit(0)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


class _ForkServer:
    """The fork server's state: its control socket, the bound ``unshare`` and its live programs."""

    def __init__(self, ctl, unshare):
        self.ctl, self.unshare, self.live = ctl, unshare, set()

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.live.discard(pid)
            self.ctl.send(b"exit %d %d" % (pid, status))

    def kill(self, pid: int) -> None:
        import signal

        if pid in self.live:
            for fn in (os.killpg, os.kill):
                try:
                    fn(pid, signal.SIGKILL)
                except OSError:
                    pass

    def handle(self, msg: bytes, fds: list) -> None:
        """One request: ``kill`` a program, or ``spawn`` one in a fork (see :func:`server`)."""
        words = msg.decode().split(" ", 6)
        if words[0] == "kill":
            self.kill(int(words[1]))
            return
        if words[0] != "spawn" or len(words) != 7 or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            ident = words[1] if len(words) > 1 else "?"
            self.ctl.send(b"failed " + ident.encode() + b" malformed request")
            return
        ident, tmp = words[1], words[6]
        limits = (int(words[2]), int(words[3]), words[4] == "1", words[5] == "1")
        pid = os.fork()
        if pid == 0:
            try:
                start_child(fds, tmp, limits, self.unshare)  # never returns
            except BaseException:
                sys.excepthook(*sys.exc_info())  # to the program's stderr, which the parent reads
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        self.live.add(pid)
        self.ctl.send(b"spawned %s %d" % (ident.encode(), pid))


if __name__ == "__main__":
    if sys.argv[1:2] != ["--server"] or len(sys.argv) != 3:
        raise SystemExit("usage: child.pyc --server <socket fd> (started by lopd.sandbox.server)")
    server(int(sys.argv[2]))
