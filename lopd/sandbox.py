"""Run untrusted generated Python code and return what its function calls returned.

``run_calls(code, fn_name, calls)`` defines ``code`` in a fresh child interpreter, calls
``fn_name(*args)`` for every ``args`` in ``calls`` and returns the JSON-decoded return
values. Expected outputs never reach the child: the caller compares the outputs itself, so
generated code cannot fake success (at worst it can forge the outputs it would have had to
compute anyway).

Barriers, outermost first (each one is enough for some attacks; together they overlap):

1. **Separate process** (``sys.executable -I -S`` running a small harness written to a fresh
   ``tempfile.mkdtemp()`` directory, which is the child's cwd and ``$HOME`` and is removed
   afterwards whatever happens). The child gets its own session / process group; on a wall
   clock timeout, on a stdout/stderr flood past ``max_output_bytes``, or when the run ends,
   the whole group is SIGKILLed. Pipes are drained by reader threads, so a flood cannot
   deadlock the parent.
2. **Scrubbed environment**: only ``PATH``, ``HOME``, ``LANG``, ``PYTHONDONTWRITEBYTECODE``,
   ``PYTHONHASHSEED`` (note that ``-I`` makes the interpreter ignore the ``PYTHON*`` ones).
   Only fds 0-2 are inherited; stdin is ``/dev/null``.
3. **Resource limits** (``preexec_fn``): RLIMIT_CPU (timeout+1 s), RLIMIT_AS (``mem_mb``),
   RLIMIT_FSIZE (1 MiB), RLIMIT_NOFILE (32), RLIMIT_CORE (0), RLIMIT_NPROC (0 once the
   child runs as an unprivileged user, so fork/clone - threads included - fail).
4. **OS isolation, when available** (probed once per parent process and cached; see
   :func:`isolation`): if the parent is root, the child is moved into a fresh, empty network
   namespace (``unshare(CLONE_NEWNET)``, the syscall behind ``unshare --net``; only a
   downed loopback exists there, so no packet can leave) and drops to uid/gid 65534
   (``nobody``), so file permissions forbid writing anywhere but the temp dir, reading
   root-only files (``/proc/<parent>/environ``, ``/root``) and signalling the parent.
   The uid drop needs the interpreter and its standard library to be readable by
   ``nobody`` (not so when Python lives under a 0700 ``/root``, e.g. pyenv); the network
   namespace needs root (CAP_SYS_ADMIN). Whatever is unavailable, the audit hook below is
   the barrier for it.
5. **Audit hook** (``sys.addaudithook`` installed by the harness before the user code is
   compiled; hooks cannot be removed). It refuses: ``socket.*``, ``ctypes.*``,
   ``subprocess.Popen``, ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.spawn*``,
   ``os.fork``/``os.forkpty``, ``os.kill``/``os.killpg``, ``resource.setrlimit``,
   sub-interpreters, imports of ``_posixsubprocess``/``ctypes``/sub-interpreter modules,
   frame introspection that could reach the harness's secrets (``sys._getframe`` answers
   ``ValueError`` so stdlib callers degrade gracefully; ``tb_frame``/``gi_frame``, ``gc``
   walks, ``sys._current_frames``, ``sys.settrace``), any write/append/create ``open`` or
   ``os.remove``/``unlink``/``rmdir``/``rename``/``mkdir``/``chmod``/``truncate``/
   ``shutil.rmtree``... of a path outside the temp dir, ``os.chdir`` outside it, symlinks
   and hard links, reads outside the temp dir and the standard library, and path arguments
   that are neither ``str``/``bytes``/``int`` (a ``PathLike`` could answer differently to the
   hook and to the real call). A refusal raises ``PermissionError`` *before* the action
   happens and is recorded; if the user code swallows the exception the run is still
   reported as ``"refused"``.
6. **Result channel**: the harness prints one final line ``<MARKER> <json>`` through a
   duplicate of its original stdout, then ``os._exit``. ``MARKER`` is a random nonce made by
   the parent per run and handed over in a payload file that the harness deletes before the
   user code runs (it is not in argv or the environment); the parent accepts only the last
   line starting with it, and checks the shape of what it decodes.

Statuses: ``"ok"`` (outputs valid), ``"error"`` (exception in the user code, including
``RecursionError``/``MemoryError``/``SystemExit``, unserialisable output, or a crash with a
non-zero exit), ``"timeout"`` (wall clock or CPU limit), ``"killed"`` (killed by a signal, or
for flooding its output), ``"refused"`` (the audit hook refused something), ``"no_output"``
(exited cleanly without a result line, e.g. ``os._exit(0)``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = ["SandboxResult", "run_calls", "isolation"]

STATUSES = ("ok", "timeout", "error", "killed", "refused", "no_output")

_NOBODY = 65534
_CLONE_NEWNET = 0x40000000
_FSIZE_BYTES = 1 << 20
_NOFILE = 32
_RECURSION_LIMIT = 1000
_STDERR_CAP = 16384


@dataclass
class SandboxResult:
    status: str  # "ok" | "timeout" | "error" | "killed" | "refused" | "no_output"
    outputs: list | None  # JSON-decoded return values of each call, in order, when ok
    detail: str  # short human-readable reason


# --------------------------------------------------------------------------------------
# The harness: runs in the child. Keep it self-contained (stdlib only, nothing at module
# level that user code could use: it runs as __main__, which is replaced before exec).
# --------------------------------------------------------------------------------------
_HARNESS = r'''
import sys, os, json

def _main():
    tmp = os.path.realpath(os.getcwd())
    with open("payload.json", "rb") as fh:
        payload = json.loads(fh.read())
    os.remove("payload.json")
    marker = payload["marker"]
    code = payload["code"]
    fn_name = payload["fn"]
    calls = payload["calls"]
    out_fd = os.dup(1)
    write = os.write
    dumps = json.dumps
    exit_ = os._exit
    realpath = os.path.realpath
    isdir = os.path.isdir
    fsdecode = os.fsdecode
    import _thread
    get_ident = _thread.get_ident

    refusals = []
    busy = set()
    sep = os.sep
    read_roots = {tmp, "/dev/null", "/dev/urandom", "/dev/zero", "/etc/localtime",
                  "/usr/share/zoneinfo"}
    for p in list(sys.path) + [os.path.dirname(os.__file__)]:
        if p:
            read_roots.add(realpath(p))
    read_roots = tuple(sorted(read_roots))

    def under(real, roots):
        for r in roots:
            if real == r or real.startswith(r + sep):
                return True
        return False

    def resolve(p):
        if isinstance(p, int) and not isinstance(p, bool):
            return None  # an already-open descriptor
        if type(p) not in (str, bytes):
            raise TypeError("path argument of type %s" % type(p).__name__)
        return realpath(fsdecode(p))

    def inside(p):
        real = resolve(p)
        return real is None or under(real, (tmp,))

    deny_prefix = ("socket.", "ctypes.", "subprocess.", "os.exec", "os.spawn",
                   "os.posix_spawn", "pty.", "winreg.", "_winapi.", "msvcrt.",
                   "cpython.PyInterpreterState", "cpython.run_", "resource.",
                   "urllib.", "http.", "ftplib.", "smtplib.", "poplib.", "imaplib.",
                   "nntplib.", "telnetlib.", "webbrowser.", "syslog.")
    deny_exact = {"os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg",
                  "os.startfile", "os.symlink", "os.link", "os.chroot", "os.setxattr",
                  "os.removexattr", "gc.get_objects", "gc.get_referrers",
                  "gc.get_referents", "sys._current_frames", "sys._current_exceptions",
                  "sys.settrace", "sys.setprofile", "sys.addaudithook", "signal.pthread_kill",
                  "os.putenv", "os.unsetenv", "fcntl.ioctl", "mmap.__new__"}
    deny_import = {"_posixsubprocess", "subprocess", "ctypes", "_ctypes",
                   "_xxsubinterpreters", "_xxinterpchannels", "_interpreters",
                   "_interpchannels", "_interpqueues", "multiprocessing",
                   "_multiprocessing", "_posixshmem", "resource"}
    frame_attrs = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals",
                   "f_globals", "gi_code", "cr_code", "ag_code"}
    # event -> (number of leading path arguments, indices of dir_fd arguments)
    path_events = {"os.remove": (1, (1,)), "os.rmdir": (1, (1,)), "os.mkdir": (1, (2,)),
                   "os.chmod": (1, (2,)), "os.chown": (1, (3,)), "os.truncate": (1, ()),
                   "os.utime": (1, (3,)), "os.chflags": (1, ()), "os.lchflags": (1, ()),
                   "os.lchmod": (1, ()), "os.mkfifo": (1, (2,)), "os.mknod": (1, (3,)),
                   "os.rename": (2, (2, 3)), "os.chdir": (1, ()),
                   "shutil.rmtree": (1, ()), "shutil.copyfile": (2, ()),
                   "shutil.copymode": (2, ()), "shutil.copystat": (2, ()),
                   "shutil.move": (2, ()), "shutil.copytree": (2, ()),
                   "shutil.make_archive": (1, ()), "shutil.unpack_archive": (2, ())}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

    def refuse(event, why):
        refusals.append("%s: %s" % (event, why))
        raise PermissionError("sandbox refused %s (%s)" % (event, why))

    def hook(event, args):
        me = get_ident()
        if me in busy:
            return
        busy.add(me)
        try:
            check(event, args)
        finally:
            busy.discard(me)

    def check(event, args):
        if event == "sys._getframe":
            raise ValueError("call stack is not deep enough")
        if event == "object.__getattr__":
            if len(args) > 1 and args[1] in frame_attrs:
                refuse(event, str(args[1]))
            return
        if event in deny_exact or event.startswith(deny_prefix):
            refuse(event, "not allowed")
        if event == "import":
            name = args[0] if args else ""
            if isinstance(name, str) and name.split(".")[0] in deny_import:
                refuse(event, name)
            return
        if event == "open":
            path = args[0] if args else None
            mode = args[1] if len(args) > 1 else None
            flags = args[2] if len(args) > 2 else 0
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            try:
                real = resolve(path)
            except Exception as e:
                refuse(event, "bad path: %s" % e)
            if real is None:
                return
            if under(real, (tmp,)):
                return
            if writing:
                refuse(event, "write outside the sandbox: %s" % real)
            if not under(real, read_roots) or isdir(real):
                refuse(event, "read outside the sandbox: %s" % real)
            return
        spec = path_events.get(event)
        if spec:
            n, dir_fds = spec
            for p in args[:n]:
                if isinstance(p, int):
                    refuse(event, "descriptor argument")
                try:
                    ok = inside(p)
                except Exception as e:
                    refuse(event, "bad path: %s" % e)
                if not ok:
                    refuse(event, "outside the sandbox")
            # a dir_fd could point outside the sandbox
            for i in dir_fds:
                if i < len(args) and args[i] is not None and args[i] != -100:
                    refuse(event, "dir_fd")

    for name in list(sys.modules):
        if name.split(".")[0] in deny_import:
            del sys.modules[name]
    for mod in (os, sys.modules.get("posix")):
        for attr in ("pidfd_open",):
            if mod is not None and hasattr(mod, attr):
                delattr(mod, attr)
    sys.setrecursionlimit(payload.get("recursion_limit", 1000))
    del payload

    def finish(status, outputs, detail):
        try:
            body = dumps({"status": status, "outputs": outputs, "detail": detail},
                         default=lambda o: {"__unserializable__": type(o).__name__})
        except BaseException as e:
            body = dumps({"status": "error", "outputs": None,
                          "detail": "unserialisable output: %s" % type(e).__name__})
        if refusals:
            # built by hand: the user code may have tampered with the json module
            why = "".join(c for c in refusals[0][:200] if c.isalnum() or c in "._:/ -")
            body = '{"status": "refused", "outputs": null, "detail": "%s"}' % why
        try:
            write(out_fd, ("\n" + marker + " " + body + "\n").encode())
        finally:
            exit_(0)

    import builtins, types
    main_mod = types.ModuleType("__main__")
    ns = main_mod.__dict__
    ns["__builtins__"] = builtins
    sys.modules["__main__"] = main_mod
    sys.addaudithook(hook)

    outputs = []
    try:
        exec(compile(code, "<solution>", "exec"), ns)
        fn = ns.get(fn_name)
        if not callable(fn):
            finish("error", None, "no callable %r defined" % fn_name)
        for args in calls:
            outputs.append(fn(*args))
    except BaseException as e:
        try:
            msg = "%s: %s" % (type(e).__name__, str(e)[:200])
        except BaseException:
            msg = "exception"
        finish("error", None, msg)
    finish("ok", outputs, "")

_main()
'''


# --------------------------------------------------------------------------------------
# Isolation probe (cached)
# --------------------------------------------------------------------------------------
_ISO_LOCK = threading.Lock()
_ISO: dict | None = None
_LIBC_UNSHARE = None


def _unshare_fn():
    """A callable doing ``unshare(CLONE_NEWNET)``, resolved in the parent (not after fork)."""
    global _LIBC_UNSHARE
    if hasattr(os, "unshare"):
        return lambda: os.unshare(_CLONE_NEWNET)
    if _LIBC_UNSHARE is None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.unshare
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int

        def call() -> None:
            if fn(_CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")

        _LIBC_UNSHARE = call
    return _LIBC_UNSHARE


def _make_preexec(timeout_s: float, mem_mb: int, netns: bool, drop: bool, unshare=None):
    import resource

    cpu = max(1, int(timeout_s) + 1)
    mem = int(mem_mb) * 1024 * 1024

    def preexec() -> None:
        if netns:
            unshare()
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (_FSIZE_BYTES, _FSIZE_BYTES))
        resource.setrlimit(resource.RLIMIT_NOFILE, (_NOFILE, _NOFILE))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if drop:
            os.setgroups([])
            os.setgid(_NOBODY)
            os.setuid(_NOBODY)
        # lowered *after* setuid: the per-user process count then makes every fork/clone
        # fail. Root ignores RLIMIT_NPROC, so this only bites once the uid is dropped (or
        # when the parent is not root); the audit hook refuses os.fork regardless.
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))

    return preexec


def _probe(netns: bool, drop: bool) -> bool:
    d = tempfile.mkdtemp(prefix="lopd-probe-")
    try:
        if drop:
            os.chown(d, _NOBODY, _NOBODY)
        pre = _make_preexec(5.0, 256, netns, drop, _unshare_fn() if netns else None)
        r = subprocess.run(
            [sys.executable, "-I", "-S", "-c", "import os; print(os.getuid())"],
            cwd=d, env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=10, preexec_fn=pre, start_new_session=True,
        )
        return r.returncode == 0 and r.stdout.strip() == (str(_NOBODY) if drop else str(os.getuid())).encode()
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
                    _unshare_fn()
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


# --------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------
def _kill_group(proc: subprocess.Popen) -> None:
    for fn in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            fn()
        except (ProcessLookupError, PermissionError, OSError):
            pass


class _Reader(threading.Thread):
    def __init__(self, stream, cap: int, on_flood, keep_tail: bool = False):
        super().__init__(daemon=True)
        self.stream, self.cap, self.on_flood, self.keep_tail = stream, cap, on_flood, keep_tail
        self.buf = bytearray()
        self.flooded = False

    def run(self) -> None:
        try:
            while True:
                chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
                if not chunk:
                    break
                self.buf += chunk
                if len(self.buf) > self.cap:
                    if self.keep_tail:
                        del self.buf[: len(self.buf) - self.cap]
                    elif not self.flooded:
                        self.flooded = True
                        del self.buf[self.cap:]
                        self.on_flood()
                    else:
                        del self.buf[self.cap:]
        except (OSError, ValueError):
            pass


def _last_line(stderr: bytes) -> str:
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_calls(code: str, fn_name: str, calls: list[list], *, timeout_s: float = 2.0,
              mem_mb: int = 256, max_output_bytes: int = 65536) -> SandboxResult:
    """Define ``code`` in a sandboxed child, call ``fn_name(*args)`` for each of ``calls``."""
    iso = isolation()
    marker = "@@LOPD-" + secrets.token_hex(16)
    tmp = tempfile.mkdtemp(prefix="lopd-sbx-")
    proc = None
    try:
        harness = os.path.join(tmp, "_harness.py")
        with open(harness, "w") as fh:
            fh.write(_HARNESS)
        payload = {"marker": marker, "code": code, "fn": fn_name,
                   "calls": [list(a) for a in calls], "recursion_limit": _RECURSION_LIMIT}
        with open(os.path.join(tmp, "payload.json"), "w") as fh:
            json.dump(payload, fh)
        del payload
        if iso["drop_uid"]:
            for p in (tmp, harness, os.path.join(tmp, "payload.json")):
                os.chown(p, _NOBODY, _NOBODY)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        pre = _make_preexec(timeout_s, mem_mb, iso["netns"], iso["drop_uid"],
                            _unshare_fn() if iso["netns"] else None)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", harness],
            cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, close_fds=True, start_new_session=True, preexec_fn=pre,
        )
        flood = threading.Event()

        def on_flood() -> None:
            flood.set()
            _kill_group(proc)

        out_r = _Reader(proc.stdout, max_output_bytes, on_flood)
        err_r = _Reader(proc.stderr, _STDERR_CAP, on_flood, keep_tail=True)
        out_r.start()
        err_r.start()
        # Popen.wait(timeout) polls with sleeps (up to 50 ms of latency per call); a waiter
        # thread wakes the join the moment the child exits.
        waiter = threading.Thread(target=proc.wait, daemon=True)
        waiter.start()
        waiter.join(timeout=timeout_s)
        timed_out = waiter.is_alive()
        _kill_group(proc)  # the run is over either way; nothing may outlive it
        proc.wait()
        out_r.join(timeout=2.0)
        err_r.join(timeout=2.0)
        stdout, stderr = bytes(out_r.buf), bytes(err_r.buf)
        rc = proc.returncode

        if timed_out:
            return SandboxResult("timeout", None, f"wall clock limit {timeout_s:g}s")
        if flood.is_set():
            return SandboxResult("killed", None, f"output limit {max_output_bytes} bytes exceeded")
        result = None
        for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
            if line.startswith(marker + " "):
                result = line[len(marker) + 1:]
                break
        if result is None:
            if rc is not None and rc < 0:
                try:
                    name = signal.Signals(-rc).name
                except ValueError:
                    name = f"signal {-rc}"
                if -rc == signal.SIGXCPU:
                    return SandboxResult("timeout", None, f"cpu limit ({name})")
                return SandboxResult("killed", None, name)
            if rc == 0:
                return SandboxResult("no_output", None, "exited without a result")
            return SandboxResult("error", None, _last_line(stderr) or f"exit code {rc}")
        try:
            obj = json.loads(result)
            status, outputs, detail = obj["status"], obj["outputs"], str(obj.get("detail", ""))[:300]
        except Exception:
            return SandboxResult("error", None, "malformed result line")
        if status not in STATUSES:
            return SandboxResult("error", None, "malformed result status")
        if status == "ok":
            if not isinstance(outputs, list) or len(outputs) != len(calls):
                return SandboxResult("error", None, "malformed result outputs")
            return SandboxResult("ok", outputs, detail)
        return SandboxResult(status, None, detail)
    finally:
        if proc is not None and proc.returncode is None:
            _kill_group(proc)
            try:
                proc.wait(timeout=5)
            except Exception:
                pass
        for s in (getattr(proc, "stdout", None), getattr(proc, "stderr", None)):
            try:
                if s is not None:
                    s.close()
            except Exception:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
