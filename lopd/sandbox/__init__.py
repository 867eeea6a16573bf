"""Run untrusted generated Python code; bring back only what its function returned, as
plain data.

``run_calls(code, fn_name, calls)`` defines ``code`` in a fresh child interpreter, calls
``fn_name(*args)`` for every ``args`` in ``calls`` and returns the return values; a
:class:`Session` does the same one call at a time, so a caller can choose each call's
arguments after seeing the previous answers (HumanEval's ``check`` runs in the parent, and
each of its calls to ``candidate`` is answered by the child). Values cross the process
boundary only as **plain data** (``None``/``bool``/``int``/``float``/``str`` and lists,
tuples, dicts, sets of plain data, with exact types: a subclass of ``int`` is refused, not
converted; one codec, :mod:`lopd.sandbox.plain`, used on both sides). Expected
outputs and tests never reach the child: callers compare in their own process, so generated
code cannot fake success; at worst it can forge the values it would have had to compute.

Barriers, outermost first (each one is enough for some attacks; together they overlap):

1. **Separate process**: a fresh fork of this process's fork server
   (:mod:`lopd.sandbox.server`: ``sys.executable -I -S -B child.pyc --server``, compiled from
   :mod:`lopd.sandbox.child` and :mod:`lopd.sandbox.plain`, which has imported what a child
   needs and never runs user code itself), one fork per program. Its cwd and ``$HOME`` are a
   fresh ``tempfile.mkdtemp()`` directory, removed afterwards whatever happens. The child gets
   its own session / process group; on a wall clock timeout, on output past
   ``max_output_bytes``, or when the session ends, the whole group is SIGKILLed (by the server,
   which alone can tell whether the pid is still its unreaped child). The caller's thread
   polls the three pipes (non-blocking, the deadline as the poll's timeout) whenever it waits
   for an answer, so a flood cannot deadlock the parent and no thread is started per program.
2. **Scrubbed environment**: only ``PATH``, ``HOME``, ``LANG``, ``PYTHONDONTWRITEBYTECODE``,
   ``PYTHONHASHSEED`` (``-I`` makes the interpreter ignore the ``PYTHON*`` ones). The child
   keeps only fds 0-2 (its three pipes); it closes every other one before it confines itself.
3. **Resource limits** (:mod:`lopd.sandbox.limits`): RLIMIT_CPU (timeout+1 s), RLIMIT_AS
   (``mem_mb``), RLIMIT_FSIZE (1 MiB), RLIMIT_NOFILE (32), RLIMIT_CORE (0), RLIMIT_NPROC (0
   once the child runs as an unprivileged user, so fork/clone - threads included - fail).
4. **OS isolation, when available** (probed once per parent process and cached; see
   :func:`isolation`): if the parent is root, the child runs in a fresh, empty network
   namespace (``unshare(CLONE_NEWNET)``; only a downed loopback exists there), entered once by
   the fork server and shared by the programs it forks (the audit hook refuses every socket,
   so none can reach another through it), and drops to
   uid/gid 65534 (``nobody``), so file permissions forbid writing anywhere but the temp dir,
   reading root-only files and signalling the parent. The uid drop needs the interpreter
   and its standard library to be readable by ``nobody`` (not so when Python lives under a
   0700 ``/root``, e.g. pyenv); the namespace needs root. Whatever is unavailable, the
   audit hook below is the barrier for it.
5. **Audit hook** (installed by the child before the user code is compiled; hooks cannot be
   removed; every builtin and path primitive it uses is bound before the user code exists,
   so patching ``builtins``, ``os`` or ``os.path`` cannot loosen it). It refuses:
   ``socket.*``, ``ctypes.*``, ``subprocess.Popen``, ``os.system``, ``os.exec*``,
   ``os.posix_spawn``, ``os.spawn*``, ``os.fork``/``os.forkpty``, ``os.kill``/``os.killpg``,
   ``resource.setrlimit``, sub-interpreters, imports of ``_posixsubprocess``/``ctypes``/
   sub-interpreter modules, frame introspection (``sys._getframe`` answers ``ValueError`` so
   stdlib callers degrade gracefully; ``tb_frame``/``gi_frame``/``f_back``..., ``gc`` walks,
   ``sys._current_frames``, ``sys.settrace``), any write/create ``open`` or
   ``os.remove``/``rename``/``mkdir``/``chmod``/``truncate``/``shutil.rmtree``... of a path
   outside the temp dir, ``os.chdir`` outside it, symlinks and hard links, device nodes and
   fifos (``os.mknod``, ``os.mkfifo``: where the uid is not dropped, a device node would read
   around the open check), reads and directory listings outside the temp dir and the standard
   library (installed packages, ``site-packages``, excluded: they may hold a benchmark's
   tests), and path arguments that are neither exact ``str``/
   ``bytes`` nor ``int``. ``signal.signal`` is removed (a handler receives the interrupted
   frame). A refusal raises ``PermissionError`` *before* the action happens and is
   recorded; if the user code swallows it the run is still reported as ``"refused"``.
6. **Reply channel**: user code's stdout goes to stderr; replies go through a private
   duplicate of the original stdout, one line each, prefixed with a per-run nonce handed
   over as the first line of the child's stdin, read before the user code exists (whose
   fd 0 is ``/dev/null``). The parent
   accepts only the reply to the call it made (sequence number) and decodes it as plain
   data; nothing else from the child is trusted.

Statuses: ``"ok"`` (outputs valid), ``"error"`` (exception in the user code, including
``RecursionError``/``MemoryError``/``SystemExit``, output that is not plain data, or a crash
with a non-zero exit), ``"timeout"`` (wall clock or CPU limit), ``"killed"`` (killed by a
signal, or for flooding its output), ``"refused"`` (the audit hook refused something),
``"no_output"`` (exited cleanly without answering, e.g. ``os._exit(0)``).
"""

from __future__ import annotations

from lopd.sandbox.limits import isolation
from lopd.sandbox.results import STATUSES, CallError, NotPlainData, SandboxResult, SessionOver
from lopd.sandbox.session import Session, dumps_plain, loads_plain, run_calls

__all__ = ["STATUSES", "CallError", "NotPlainData", "SandboxResult", "Session", "SessionOver",
           "dumps_plain", "loads_plain", "isolation", "run_calls"]
