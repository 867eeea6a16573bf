"""The sandbox's child program.

The parent (:mod:`lopd.sandbox.server`) writes this file and :mod:`lopd.sandbox.plain` (the
codec it shares with the parent), with their bytecode, into a temp dir and starts ``python -I
-S -B child.pyc --server <fd> <netns>`` there once per parent process and network mode: the
**fork server** (:func:`server`). It pays once what does not depend on the program: its own
empty network namespace (``netns`` 1), which every program it forks inherits; the imports a
child needs; what every program shares (:func:`prepare`). Then it waits on the socket ``fd``;
for each program the parent sends the program's temp dir and limits together with the three
pipe ends that become the program's stdin, stdout and stderr. The server forks; the fork
confines itself (:func:`start_child`, then :func:`confine`: its own session, limits and uid)
and runs :func:`run`. The server never reads a payload or runs user code, so every program
starts from the same pristine process. Standard library only; nothing runs at import.

**Protocol of one program.** The first line of the child's stdin is the payload (reply
marker, code, function name, recursion limit), read before the user code exists. The child
defines the code in a fresh ``__main__``, answers sequence number 0 (defined, or why not),
then one request per further line of its original stdin, ``[seq, args, kwargs]`` in plain
data (``args`` ``None`` ends the session; the parent may send them all at once), each with
one line on a private duplicate of its original stdout: ``<marker> <seq>
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


def confine(cpu_s: int, mem_bytes: int, drop: bool) -> None:
    """Rlimits and uid: the first thing a forked child does, before the payload is read.

    Done in the child (forked from the small fork server), never in the parent: forking the
    parent, with torch loaded, costs ~20 ms of page-table copying per program and stalls its
    other threads. The network namespace is not here: the fork server enters one at start
    (:func:`server`), and every program inherits it.
    """
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
def make_channel(dumps, loads, refusals: list):
    """``(payload, reply, next_request)`` over private duplicates of fds 1 and 0, which are then
    pointed at stderr and ``/dev/null`` for the user code. ``payload`` is the first line of
    stdin, decoded; its marker heads every reply."""
    out_fd, in_fd = os.dup(1), os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    from builtins import BaseException, bytearray, bytes

    write, read, int_repr = os.write, os.read, int.__repr__
    pending = bytearray()

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

    line = next_request()
    if line is None:  # the parent went away before sending the payload
        os._exit(0)
    payload = loads(line)
    head = "\n" + payload["marker"] + " "

    def reply(seq: int, status: str, value) -> None:
        if refusals:
            status, value = "refused", refusals[0][:200]
        try:
            body = dumps(value)
        except BaseException as e:  # not plain data, an int too long, a recursion too deep
            status, body = "error", dumps("unusable return value (" + describe(e) + ")")
        write(out_fd, (head + int_repr(seq) + " " + status + " " + body + "\n").encode())

    return payload, reply, next_request


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


def run(cpu_s: int, mem_bytes: int, drop: bool) -> None:
    """One program, in a fork of the server whose cwd is already the program's temp dir:
    confine, read the payload, install the hook, define the code, answer calls. Never returns."""
    import builtins
    import types
    from builtins import BaseException

    confine(cpu_s, mem_bytes, drop)
    tmp = os.path.realpath(os.getcwd())
    (dumps, loads), shared_roots = _PREPARED or (make_codec(), None)
    hook, refusals = make_guard(tmp, read_roots(tmp, shared_roots))
    payload, reply, next_request = make_channel(dumps, loads, refusals)
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


def start_child(fds, tmp: str, limits, reset_signals: bool) -> None:
    """In a fresh fork of the server: own session and process group (the parent kills the
    group), default signal dispositions (``reset_signals``: the server reaps on SIGCHLD, see
    :class:`_ForkServer`), ``fds`` as 0/1/2 and no other descriptor, cwd and ``$HOME`` the
    program's temp dir; then :func:`run`. Never returns."""
    os.setsid()
    if reset_signals:
        import signal

        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, 1 << 20)  # the server's socket, its pidfds or wake-up pipe, the received fds
    os.chdir(tmp)
    os.environ["HOME"] = tmp
    run(*limits)


def server(ctl_fd: int, netns: bool) -> None:
    """The fork server's loop (single-threaded, so ``fork`` is safe). Messages on the
    ``SOCK_SEQPACKET`` socket ``ctl_fd``, one per packet, ASCII:

    - in: ``spawn <id> <cpu_s> <mem_bytes> <drop> <tmp>`` with three fds attached
      (the program's stdin, stdout, stderr); out: ``spawned <id> <pid>`` or ``failed <id> <why>``;
    - in: ``kill <pid>``: SIGKILL the program's process group, only while the pid is still its
      unreaped child (a reaped pid may already be someone else's);
    - out: ``exit <pid> <wait status>`` when a program ends.

    With ``netns``, the server first moves itself into a fresh, empty network namespace: paid
    once, not per program. Its programs share that namespace, and nothing else in it: it has
    only a downed loopback, and the audit hook refuses every socket (each program still gets its
    own process, limits, temp dir and process group).

    When the parent's end closes (it exited or was killed), every live program is killed and
    the server exits: it never outlives its parent's use of it.
    """
    import _thread  # noqa: F401  (preloaded: each child imports it; a fork then finds it loaded)
    import posix  # noqa: F401
    import select
    import socket
    import stat  # noqa: F401
    import types  # noqa: F401

    if netns:
        bind_unshare()()
    prepare()
    fs = _ForkServer(socket.socket(fileno=ctl_fd), select.poll())
    fs.ctl.send(b"ready %d" % os.getpid())
    try:
        while True:
            for fd, _ in fs.poller.poll():
                if fd == fs.ctl.fileno():
                    msg, fds, _, _ = socket.recv_fds(fs.ctl, 65536, 3)
                    if not msg:
                        raise BrokenPipeError  # the parent is gone
                    fs.handle(msg, fds)
                else:
                    fs.reap(fd)
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
    """The fork server's state: its control socket, its poller and its live programs.

    A program's end is seen through a pidfd (Linux 5.3+), polled beside the socket: the server
    has no signal handler, so a fork starts with default dispositions and need not reset them.
    Where ``pidfd_open`` is unavailable it reaps on SIGCHLD instead, through a wake-up pipe,
    and each fork resets that handler (``reset_signals``)."""

    def __init__(self, ctl, poller):
        self.ctl, self.poller, self.live = ctl, poller, set()
        import select

        self.pidfds: dict[int, int] = {}  # pidfd -> pid
        self.pollin = select.POLLIN
        poller.register(ctl, self.pollin)
        try:
            os.close(os.pidfd_open(os.getpid()))
            self.wake_r = None
        except (AttributeError, OSError):
            import signal

            self.wake_r, wake_w = os.pipe()
            os.set_blocking(self.wake_r, False)
            os.set_blocking(wake_w, False)
            signal.set_wakeup_fd(wake_w)
            signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes wake_w
            poller.register(self.wake_r, self.pollin)

    def reap(self, fd: int) -> None:
        """``fd`` is readable: a pidfd (its program ended) or the SIGCHLD wake-up pipe."""
        if fd == self.wake_r:
            _drain(fd)
            while self.live:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    return
                if pid == 0:
                    return
                self._ended(pid, status)
            return
        pid = self.pidfds.pop(fd)
        self.poller.unregister(fd)
        os.close(fd)
        self._ended(pid, os.waitpid(pid, 0)[1])

    def _ended(self, pid: int, status: int) -> None:
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
        words = msg.decode().split(" ", 5)
        if words[0] == "kill":
            self.kill(int(words[1]))
            return
        if words[0] != "spawn" or len(words) != 6 or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            ident = words[1] if len(words) > 1 else "?"
            self.ctl.send(b"failed " + ident.encode() + b" malformed request")
            return
        ident, tmp = words[1], words[5]
        limits = (int(words[2]), int(words[3]), words[4] == "1")
        pid = os.fork()
        if pid == 0:
            try:
                start_child(fds, tmp, limits, self.wake_r is not None)  # never returns
            except BaseException:
                sys.excepthook(*sys.exc_info())  # to the program's stderr, which the parent reads
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        self.live.add(pid)
        if self.wake_r is None:
            pidfd = os.pidfd_open(pid)
            self.pidfds[pidfd] = pid
            self.poller.register(pidfd, self.pollin)
        self.ctl.send(b"spawned %s %d" % (ident.encode(), pid))


if __name__ == "__main__":
    if sys.argv[1:2] != ["--server"] or len(sys.argv) != 4 or sys.argv[3] not in ("0", "1"):
        raise SystemExit("usage: child.pyc --server <socket fd> <netns 0|1> (started by lopd.sandbox.server)")
    server(int(sys.argv[2]), sys.argv[3] == "1")
