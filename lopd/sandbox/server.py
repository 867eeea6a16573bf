"""The parent's handle on the sandbox's fork server (:func:`lopd.sandbox.child.server`).

One server per parent process and network mode, started on first use: ``python -I -S -B
child.pyc --server <fd> <netns>`` with a scrubbed environment, in its own session (and, with
``netns``, its own empty network namespace, entered once at start), holding the other end of a
``SOCK_SEQPACKET`` socket. A program costs the server one ``fork`` instead of an interpreter
start-up, the child's imports and a namespace of its own (``python bench/sandbox.py``,
``python bench/scoring.py``). The server never runs user code: each fork confines itself and
runs exactly one program, so no program sees another's state.

Lifetime: the server exits when this process's end of the socket closes (normal exit, a
crash, SIGKILL), killing its live programs first. A process forked from this one does not
inherit the handle (its copy of the socket is closed at fork) and starts its own server.
"""

from __future__ import annotations

import atexit
import functools
import importlib.resources
import importlib.util
import itertools
import marshal
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
             "PYTHONHASHSEED": "0"}  # + HOME, set to each program's temp dir
_START_TIMEOUT_S = 30.0
_REPLY_TIMEOUT_S = 30.0


class ServerDied(RuntimeError):
    """The fork server is gone (its process ended or its socket broke)."""


class Program:
    """One forked program: its pid, and its wait status once the server has reaped it
    (``status`` stays ``None`` if the server died first)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.status: int | None = None
        self.exited = threading.Event()

    @property
    def returncode(self) -> int | None:
        """Like ``Popen.returncode``: the exit code, or minus the signal that killed it."""
        return None if self.status is None else os.waitstatus_to_exitcode(self.status)


CHILD_MODULES = ("audit.py", "plain.py")  # what child.py imports from its own directory
CHILD_FILES = ("child.py", *CHILD_MODULES)


@functools.lru_cache(maxsize=None)
def child_source(name: str = "child.py") -> bytes:
    """One file of the child program (``lopd/sandbox/<name>``), read as package data."""
    return importlib.resources.files("lopd.sandbox").joinpath(name).read_bytes()


@functools.lru_cache(maxsize=None)
def child_bytecode(name: str = "child.py") -> bytes:
    """``child_source(name)`` compiled by this interpreter (the server's), as an unchecked
    hash-based ``.pyc``: the server loads it rather than compiling the source."""
    src = child_source(name)
    code = compile(src, name, "exec", dont_inherit=True)  # the source's own __future__ flags only
    flags = (0b01).to_bytes(4, "little")  # hash-based, source not checked (it is written beside it)
    return importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(src) + marshal.dumps(code)


def server_files() -> dict[str, bytes]:
    """What the server's directory holds, relative path -> bytes: the package's ``child.py``,
    ``audit.py`` and ``plain.py`` as they are, and the bytecode compiled from exactly those bytes
    (``child.pyc``, which the server runs, and the ``__pycache__`` entries its imports of
    ``audit`` and ``plain`` find)."""
    files = {name: child_source(name) for name in CHILD_FILES}
    files["child.pyc"] = child_bytecode("child.py")
    for name in CHILD_MODULES:
        files[importlib.util.cache_from_source(name, optimization="")] = child_bytecode(name)
    return files


class ForkServer:
    def __init__(self, netns: bool):
        self.netns = netns
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        workdir = tempfile.mkdtemp(prefix="lopd-sbx-server-")
        try:
            for rel, data in server_files().items():
                path = os.path.join(workdir, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as fh:
                    fh.write(data)
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "child.pyc", "--server", str(theirs.fileno()), str(int(netns))],
                cwd=workdir, env={**CHILD_ENV, "HOME": workdir}, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True)
            theirs.close()
            ours.settimeout(_START_TIMEOUT_S)
            try:
                hello = ours.recv(64)
            except TimeoutError:
                hello = b"(no answer in %d s)" % _START_TIMEOUT_S
            except OSError:
                hello = b""
            if not hello.startswith(b"ready "):
                self.proc.kill()
                self.proc.wait()
                raise ServerDied(f"the sandbox's fork server did not start (exit code {self.proc.returncode}, "
                                 f"got {hello[:40]!r}); its error, if any, is on stderr above")
            ours.settimeout(None)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        finally:
            shutil.rmtree(workdir, ignore_errors=True)  # loaded into the server's memory by now
        self.ctl = ours
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[threading.Event, list]] = {}
        self._programs: dict[int, Program] = {}
        self.dead = False
        threading.Thread(target=self._read, name="lopd-sandbox-server", daemon=True).start()

    # ---------------------------------------------------------------- requests
    def spawn(self, tmp: str, cpu_s: int, mem_bytes: int, drop: bool, fds) -> Program:
        """Fork a program with cwd/``$HOME`` ``tmp`` and ``fds`` as its stdin/stdout/stderr, in
        this server's network namespace (``self.netns``)."""
        ident = next(self._ids)
        done, slot = threading.Event(), []
        with self._lock:
            if self.dead:
                raise ServerDied("the sandbox's fork server is gone")
            self._pending[ident] = (done, slot)
        msg = f"spawn {ident} {cpu_s} {mem_bytes} {int(drop)} {tmp}".encode()
        try:
            socket.send_fds(self.ctl, [msg], list(fds))
        except OSError as e:
            self._died()
            raise ServerDied(f"the sandbox's fork server is gone ({e})") from None
        if not done.wait(_REPLY_TIMEOUT_S):
            self._died()  # wedged: treat as gone (drops this request; the next spawn starts a new server)
            raise ServerDied("the sandbox's fork server did not answer in time")
        if isinstance(slot[0], Program):
            return slot[0]
        raise ServerDied(f"the sandbox's fork server refused to start a program: {slot[0]}")

    def kill(self, program: Program) -> None:
        """SIGKILL the program's process group, unless it is already reaped. Race-free: the
        server holds the pid unreaped until it has acted on every earlier request."""
        if program.exited.is_set():
            return
        try:
            self.ctl.send(b"kill %d" % program.pid)
        except OSError:
            self._died()

    def close(self) -> None:
        """Close our end (the server then kills its programs and exits) and reap it."""
        try:
            self.ctl.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    # ---------------------------------------------------------------- replies
    def _read(self) -> None:
        while True:
            try:
                msg = self.ctl.recv(256)
            except OSError:
                msg = b""
            if not msg:
                self._died()
                return
            kind, _, rest = msg.decode().partition(" ")
            a, _, b = rest.partition(" ")
            if kind == "exit":
                with self._lock:
                    program = self._programs.pop(int(a), None)
                if program is not None:
                    program.status = int(b)
                    program.exited.set()
            elif kind in ("spawned", "failed"):
                with self._lock:
                    done, slot = self._pending.pop(int(a), (None, None))
                    if kind == "spawned" and slot is not None:
                        slot.append(Program(int(b)))
                        self._programs[slot[0].pid] = slot[0]
                    elif slot is not None:
                        slot.append(b)
                if done is not None:
                    done.set()

    def _died(self) -> None:
        """The server is gone: wake everyone waiting on it. Its programs, orphaned, are killed
        directly (they are in their own process groups, and not yet reaped by anyone but init)."""
        with self._lock:
            if self.dead:
                return
            self.dead = True
            pending, self._pending = self._pending, {}
            programs, self._programs = self._programs, {}
        for done, slot in pending.values():
            slot.append("the fork server died")
            done.set()
        for program in programs.values():
            for fn in (os.killpg, os.kill):
                try:
                    fn(program.pid, signal.SIGKILL)
                except OSError:
                    pass
            program.exited.set()  # status None: unknown


_SERVERS: dict[bool, ForkServer] = {}  # network namespace or not -> that mode's server
_SERVER_LOCK = threading.Lock()


def fork_server(netns: bool | None = None) -> ForkServer:
    """This process's fork server for ``netns`` (default: what :func:`isolation` allows),
    started (or restarted, if it died) on demand."""
    if netns is None:
        from lopd.sandbox.limits import isolation

        netns = isolation()["netns"]
    with _SERVER_LOCK:
        srv = _SERVERS.get(netns)
        if srv is None or srv.dead or srv.owner != os.getpid():
            if srv is not None and srv.owner == os.getpid():
                srv.close()
            srv = _SERVERS[netns] = ForkServer(netns)
        return srv


def _forget_after_fork() -> None:
    """In a process forked from this one: drop the inherited handles (closing only our copies
    of the sockets: the servers keep serving the parent) and the lock, which may be held."""
    global _SERVER_LOCK
    for srv in _SERVERS.values():
        try:
            srv.ctl.close()
        except OSError:
            pass
    _SERVERS.clear()
    _SERVER_LOCK = threading.Lock()


def _shutdown() -> None:
    for srv in list(_SERVERS.values()):
        if srv.owner == os.getpid():
            srv.close()


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(_shutdown)
