"""The sandbox child's audit hook: the in-process barrier around user code (its rules are listed in
:mod:`lopd.sandbox`).

Part of the child program: the fork server's directory holds this file beside ``child.py`` and
``plain.py`` (:func:`lopd.sandbox.server.server_files`), and the server imports it before it forks,
so a program never imports anything after its hook is installed. Standard library only; nothing
runs at import.
"""

from __future__ import annotations

import os
import sys

if __package__:  # imported inside lopd
    from lopd.sandbox.plain import type_name
else:  # imported by the child program, next to a copy of plain.py
    from plain import type_name

# ------------------------------------------------------------------ audit policy
DENY_PREFIX = ("socket.", "ctypes.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn",
               "pty.", "winreg.", "_winapi.", "msvcrt.", "cpython.PyInterpreterState",
               "cpython.run_", "resource.", "urllib.", "http.", "ftplib.", "smtplib.",
               "poplib.", "imaplib.", "nntplib.", "telnetlib.", "webbrowser.", "syslog.",
               "sys.monitoring.")
DENY_EXACT = {"os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.startfile",
              "os.symlink", "os.link", "os.chroot", "os.setxattr", "os.removexattr",

              "gc.get_objects", "gc.get_referrers", "gc.get_referents",
              "sys._current_frames", "sys._current_exceptions", "sys.settrace",
              "sys.setprofile", "sys.addaudithook", "signal.pthread_kill", "os.putenv",
              "os.unsetenv", "fcntl.ioctl", "mmap.__new__"}
# ``_signal``: a fresh copy would bring back ``signal.signal`` (removed below): a signal
# handler is handed the interrupted frame, the harness's included. ``posix``: a fresh copy would bring back
# ``mknod``, ``mkfifo`` and ``pidfd_open`` (removed below).
DENY_IMPORT = {"_posixsubprocess", "subprocess", "ctypes", "_ctypes", "_xxsubinterpreters",
               "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues",
               "multiprocessing", "_multiprocessing", "_posixshmem", "resource", "_signal", "posix"}
# modules the child has already imported whose *fresh* import is refused (a fresh copy would bring back what
# disarm() removed from them); the copies already loaded stay
KEEP_LOADED = {"_signal", "posix"}
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals",
               "f_globals", "gi_code", "cr_code", "ag_code"}
# event -> (number of leading path arguments, indices of dir_fd arguments)
PATH_EVENTS = {"os.remove": (1, (1,)), "os.rmdir": (1, (1,)), "os.mkdir": (1, (2,)),
               "os.chmod": (1, (2,)), "os.chown": (1, (3,)), "os.truncate": (1, ()),
               "os.utime": (1, (3,)), "os.chflags": (1, ()), "os.lchflags": (1, ()),
               "os.lchmod": (1, ()),
               "os.rename": (2, (2, 3)), "os.chdir": (1, ()), "shutil.rmtree": (1, ()),
               "shutil.copyfile": (2, ()), "shutil.copymode": (2, ()),
               "shutil.copystat": (2, ()), "shutil.move": (2, ()), "shutil.copytree": (2, ()),
               "shutil.make_archive": (1, ()), "shutil.unpack_archive": (2, ())}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# installed packages may hold a benchmark's tests (HumanEval's data file, for one)
HIDDEN_DIRS = ("site-packages", "dist-packages")


# ------------------------------------------------------------------ audit hook
def make_resolver():
    """``realpath(p)`` for an exact ``str``/``bytes`` path, built from C functions bound now:
    the user code may later patch ``os.path``, ``posixpath`` or ``os``, but not these.
    Returns ``None`` for a symlink loop."""
    import posix
    import stat

    from builtins import OSError, list, reversed, str, type

    lstat, readlink, getcwd, is_link = posix.lstat, posix.readlink, posix.getcwd, stat.S_ISLNK
    fs_encoding = sys.getfilesystemencoding()

    def realpath(p):
        if type(p) is not str:
            p = p.decode(fs_encoding, "surrogateescape")
        if not p.startswith("/"):
            p = getcwd() + "/" + p
        todo = list(reversed(p.split("/")))
        done: list = []
        hops = 0
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if done:
                    done.pop()
                continue
            here = "/" + "/".join(done + [name])
            try:
                link = is_link(lstat(here).st_mode)
            except OSError:
                link = False
            if not link:
                done.append(name)
                continue
            hops += 1
            if hops > 40:
                return None
            target = readlink(here)
            if target.startswith("/"):
                done = []
            todo.extend(reversed(target.split("/")))
        return "/" + "/".join(done)

    return realpath


def make_path_checks(tmp: str, read_roots: tuple, refuse):
    """``(check_open, check_list, check_paths)`` for the ``open`` event, directory listings and the
    :data:`PATH_EVENTS`."""
    import posix
    import stat

    from builtins import Exception, any, bool, bytes, int, len, str, type

    realpath, stat_, is_dir = make_resolver(), posix.stat, stat.S_ISDIR
    # the policy is bound here too: the user code can reach this module (sys.modules), not these
    write_flags, hidden_dirs, name_of = WRITE_FLAGS, tuple(HIDDEN_DIRS), type_name

    def under(real, roots):
        return real is not None and any(real == r or real.startswith(r + "/") for r in roots)

    def resolve(event, p):
        """The real path of ``p``; ``None`` for a descriptor; refuses any other type (a
        ``PathLike`` or ``str`` subclass could answer the hook and the call differently)."""
        if type(p) is int:
            return None
        if type(p) is not str and type(p) is not bytes:
            refuse(event, "path argument of type %s" % name_of(type(p)))
        real = realpath(p)
        if real is None:
            refuse(event, "symlink loop")
        return real

    def is_directory(real):
        try:
            return is_dir(stat_(real).st_mode)
        except Exception:
            return False

    def check_open(event, args):
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        writing = (type(mode) is str and any(c in mode for c in "wax+")) or (
            type(flags) is int and flags & write_flags)
        real = resolve(event, args[0] if args else None)
        if real is None or under(real, (tmp,)):
            return
        if writing:
            refuse(event, "write outside the sandbox: %s" % real)
        hidden = any(d in real.split("/") for d in hidden_dirs)
        if hidden or not under(real, read_roots) or is_directory(real):
            refuse(event, "read outside the sandbox: %s" % real)

    def check_list(event, args):
        """A directory listing is a read: inside the temp dir or the read roots only (names in a split's
        directory, or anywhere else, are not the program's to see)."""
        p = args[0] if args else None
        real = resolve(event, "." if p is None else p)  # no argument: the working directory, the temp dir
        if real is None or under(real, (tmp,)):
            return  # a descriptor: opening it went through check_open
        if any(d in real.split("/") for d in hidden_dirs) or not under(real, read_roots):
            refuse(event, "list outside the sandbox: %s" % real)

    def check_paths(event, args, n, dir_fds):
        for p in args[:n]:
            if type(p) is int or type(p) is bool:
                refuse(event, "descriptor argument")
            if not under(resolve(event, p), (tmp,)):
                refuse(event, "outside the sandbox")
        for i in dir_fds:  # a dir_fd could point outside the sandbox
            if i < len(args) and args[i] is not None and args[i] != -100:
                refuse(event, "dir_fd")

    return check_open, check_list, check_paths


def make_guard(tmp: str, read_roots: tuple):
    """``(hook, refusals)``: an audit hook enforcing the policy above, and the list it
    appends every refusal to (a refusal raises ``PermissionError`` before the action).
    Every builtin it uses is bound here: patching ``builtins`` cannot loosen it."""
    import _thread

    from builtins import PermissionError, ValueError, len, set, str, type

    get_ident = _thread.get_ident
    # the policy is bound here, as frozen copies: the user code can reach this module (sys.modules)
    # and its sets, not these
    frame_attrs, deny_exact, deny_prefix = frozenset(FRAME_ATTRS), frozenset(DENY_EXACT), tuple(DENY_PREFIX)
    deny_import, path_events = frozenset(DENY_IMPORT), dict(PATH_EVENTS)
    refusals: list = []
    busy = set()

    def refuse(event, why):
        refusals.append("%s: %s" % (event, why))
        raise PermissionError("sandbox refused %s (%s)" % (event, why))

    check_open, check_list, check_paths = make_path_checks(tmp, read_roots, refuse)

    def check(event, args):
        if event == "sys._getframe":
            raise ValueError("call stack is not deep enough")  # stdlib callers degrade gracefully
        if event == "object.__getattr__":
            if len(args) > 1 and args[1] in frame_attrs:
                refuse(event, str(args[1]))
        elif event in deny_exact or event.startswith(deny_prefix):
            refuse(event, "not allowed")
        elif event == "import":
            name = args[0] if args else ""
            if type(name) is str and name.split(".")[0] in deny_import:
                refuse(event, name)
        elif event == "open":
            check_open(event, args)
        elif event in ("os.listdir", "os.scandir"):
            check_list(event, args)
        elif event in path_events:
            check_paths(event, args, *path_events[event])

    def hook(event, args):
        me = get_ident()
        if me in busy:
            return
        busy.add(me)
        try:
            check(event, args)
        finally:
            busy.discard(me)

    return hook, refusals


def std_roots() -> frozenset:
    """The read roots every program shares: a few device/zone files and the standard library (the
    interpreter's ``sys.path``, resolved). The fork server computes them once, before it forks."""
    roots = {"/dev/null", "/dev/urandom", "/dev/zero", "/etc/localtime", "/usr/share/zoneinfo"}
    roots.update(os.path.realpath(p) for p in list(sys.path) + [os.path.dirname(os.__file__)] if p)
    return frozenset(roots)


def read_roots(tmp: str, shared: frozenset | None = None) -> tuple:
    """Where reads are allowed: the temp dir and :func:`std_roots` (``shared``, when already computed)."""
    return tuple(sorted((std_roots() if shared is None else shared) | {tmp}))


def disarm() -> None:
    """Take away what the hook cannot police: denied modules already imported, pidfd_open,
    mknod and mkfifo (no audit event), and signal handlers (a handler is handed the interrupted frame: the harness's secrets)."""
    for name in list(sys.modules):
        if name.split(".")[0] in DENY_IMPORT - KEEP_LOADED:
            del sys.modules[name]
    import signal

    # mknod and mkfifo raise no audit event; a device node or a fifo serves no program, and where the child
    # keeps uid 0 (no drop to nobody) a device node made in the temp dir would read around the open check
    for mod in (os, sys.modules.get("posix")):
        for attr in ("pidfd_open", "mknod", "mkfifo"):
            if mod is not None and hasattr(mod, attr):
                delattr(mod, attr)
    for mod in (signal, sys.modules["_signal"]):
        for attr in ("signal", "set_wakeup_fd"):
            if hasattr(mod, attr):
                delattr(mod, attr)
