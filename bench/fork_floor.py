"""The floor under a sandboxed program's cost: what one fresh process costs the machine before any confinement.

    python bench/fork_floor.py [--runs 400] [--repeats 3] [--cold] [--preload signal]

The sandbox's rule is one fresh process per program (``lopd/sandbox``: the fork server forks a child that confines
itself and runs exactly one program). This bench measures what that rule alone costs, with none of the sandbox's
work: in a process started like the fork server (``python -I -S -B``, the modules the server preloads imported),
``--runs`` times one after another,

* ``fork+exit``: ``os.fork()``, the child calls ``os._exit(0)`` at once, the parent reaps it (``waitpid``);
* ``+ python``: the child first builds a 50-entry dict (bytecode that allocates), touching the interpreter's
  pages and paying their copy-on-write faults;
* ``+ compile``: the child also compiles, defines and calls a two-line function (what every program does to
  its code), with the compiler warmed in the parent before any fork as the fork server's ``prepare`` does, and
  (``--cold``) without that warm-up;
* ``+ confine``: before that, the sandbox's own first steps: a session of its own and its limits
  (``lopd.sandbox.child.confine``, the real function, loaded from the files the fork server runs);
* ``+ make_guard``, ``+ disarm``, ``+ hook on``: then, one step more each, the audit hook over the program's temp
  dir is built (``lopd.sandbox.audit.make_guard`` and ``read_roots``), the harmful functions are taken away
  (``disarm``), and the hook is installed (``sys.addaudithook``), so the compile and the call run under it as a
  program's do;

and prints, for each, the machine's CPU per process (``/proc/stat``: every core, the kernel included) and the
parent's wall time per process, the median over ``--repeats`` rounds, each in a fresh process. Set against
``bench/scoring.py``'s machine CPU per scored program, the first rows say how much of that cost a cheaper sandbox
can remove at all, and the last four how much the child's own confinement takes (what is left is the parent's
pipes, temp dir and round trips, the payload and the replies). ``--preload signal`` imports a module before the
forks beyond the server's own (``disarm`` imports ``signal``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time
import _thread, posix, resource, select, socket, stat, types  # the fork server's preloads

def busy():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")

SRC = "def f(x):\n    return x * 13 + 2\n"

def python_work():
    return len({i: str(i) for i in range(50)})

def compile_work():
    ns = {}
    exec(compile(SRC, "<p>", "exec"), ns)
    return ns["f"](python_work())

def sandbox_steps(upto):  # the child's own steps, in lopd.sandbox.child's order, up to step ``upto``, then the code
    def work():
        os.setsid()  # 0: its own session and limits (start_child, confine)
        child.confine(5, 1 << 30, False)
        if upto >= 1:  # 1: the audit hook over the program's temp dir, built (run)
            tmp = os.path.realpath(os.getcwd())
            hook, _ = audit.make_guard(tmp, audit.read_roots(tmp, child._PREPARED[1]))
        if upto >= 2:  # 2: what the hook cannot police, taken away
            audit.disarm()
        if upto >= 3:  # 3: the hook on
            sys.addaudithook(hook)
        return compile_work()
    return work

WORK = {"bare": None, "python": python_work, "compile": compile_work, "confine": sandbox_steps(0),
        "guard": sandbox_steps(1), "disarm": sandbox_steps(2), "hook": sandbox_steps(3)}

def measure(mode, n):
    work = WORK[mode]
    c0, t0 = busy(), time.perf_counter()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            if work is not None:
                work()
            os._exit(0)
        os.waitpid(pid, 0)
    return (busy() - c0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3

n, warm, files, preload = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3], sys.argv[4].split(",")
for name in filter(None, preload):  # modules loaded before the forks beyond the fork server's own
    __import__(name)
sys.path.insert(0, files)  # the sandbox's child program, as the fork server holds it
import audit, child  # noqa: E402
del sys.path[0]
os.chdir(files)
if warm:  # as the fork server's prepare(): the compiler's first use paid once, before any fork
    child.prepare()
else:
    child._PREPARED = (None, audit.std_roots())
print(json.dumps({mode: measure(mode, n) for mode in WORK}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=400, help="processes per figure and round")
    ap.add_argument("--repeats", type=int, default=3, help="rounds, each in a fresh server-like process")
    ap.add_argument("--cold", action="store_true", help="do not warm the compiler before forking")
    ap.add_argument("--preload", default="", help="comma-separated modules to import before the forks, beyond the "
                                                  "fork server's own (e.g. signal, which disarm imports)")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lopd.sandbox.server import server_files

    rounds = []
    with tempfile.TemporaryDirectory() as files:
        for name, data in server_files().items():
            (Path(files) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(files) / name).write_bytes(data)
        for _ in range(a.repeats):
            out = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", CHILD, str(a.runs), "0" if a.cold else "1",
                                  files, a.preload], capture_output=True, text=True, check=True,
                                 env={"PATH": "/usr/bin:/bin"})
            rounds.append(json.loads(out.stdout))
    print(f"{os.cpu_count()} cores; {a.runs} processes a round, {a.repeats} rounds (median, then the range); "
          f"compiler {'cold' if a.cold else 'warmed before the forks'}; preloaded beyond the server's: "
          f"{a.preload or 'nothing'}")
    print(f"{'':12} {'machine CPU ms':>26} {'parent wall ms':>26}")
    for mode, label in (("bare", "fork+exit"), ("python", "+ python"), ("compile", "+ compile"),
                        ("confine", "+ confine"), ("guard", "+ make_guard"), ("disarm", "+ disarm"),
                        ("hook", "+ hook on")):
        cpu = [r[mode][0] for r in rounds]
        wall = [r[mode][1] for r in rounds]
        print(f"{label:12} {statistics.median(cpu):8.3f} ({min(cpu):.3f}–{max(cpu):.3f})      "
              f"{statistics.median(wall):8.3f} ({min(wall):.3f}–{max(wall):.3f})")


if __name__ == "__main__":
    main()
