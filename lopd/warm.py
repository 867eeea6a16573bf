"""A warm worker: import torch, transformers, peft and MLflow once per ``dvc repro``, fork per stage.

Why: every DVC stage is a new process, and importing the ML stack costs ~5.7 s of CPU; with ~150
stages that was ~40% of a pipeline. Under ``dvc repro`` the ``lopd`` command is a thin client:

* it finds its *owner* — the ``dvc`` process that ran it (the first ancestor that is not a shell);
* it connects to the warm server of that owner (an abstract Unix socket named after the owner's
  pid and the repository root), starting it if absent (the first stage pays the imports once);
* it sends its argv, working directory and environment, and its stdin/stdout/stderr as file
  descriptors; the server forks a child that runs the stage *exactly* as ``lopd`` would in-process
  (same params, same code, the client's env and cwd) and returns its exit status.

Guarantees kept:

* The server never outlives ``dvc repro``: it exits as soon as its owner is gone (polled every
  0.5 s) and is in the owner's process group, so killing that group kills it and every stage child.
* A killed client kills its stage: the child watches the connection and exits when it closes.
* Nothing the stage writes depends on the server (it forks before any torch computation, so
  no OpenMP pool is inherited; each stage seeds and sets its thread count as in-process).
* ``LOPD_WARM=0`` disables it; it is only used under DVC (``DVC_ROOT`` set) and never under
  ``torchrun`` (``RANK`` set). While recording reads (``LOPD_RECORD_DIR``) it preloads the
  libraries only, so each stage imports (and records) its own ``lopd`` modules.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

SHELLS = {"sh", "bash", "dash", "zsh", "fish", "ksh"}
START_TIMEOUT_S = 180.0
POLL_S = 0.5
MAX_FDS = 3  # a client sends its stdin, stdout and stderr


# --------------------------------------------------------------------------- owner and address
def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def find_owner(pid: int | None = None) -> int:
    """The first ancestor of ``pid`` (default: this process) that is not a shell: the dvc process."""
    p = _ppid(pid or os.getpid())
    while p > 1 and _comm(p) in SHELLS:
        p = _ppid(p)
    return p


def address(owner: int, root: str) -> str:
    key = hashlib.sha256(f"{os.getuid()}:{owner}:{os.path.realpath(root)}".encode()).hexdigest()[:16]
    return f"\0lopd-warm-{key}"  # abstract namespace: nothing on disk to clean up after a kill


def wanted(argv: list[str] | None) -> bool:
    env = os.environ
    return (argv is None and env.get("LOPD_WARM", "1") != "0" and "DVC_ROOT" in env and "RANK" not in env
            and sys.platform.startswith("linux"))


# --------------------------------------------------------------------------- wire format
def _send_msg(sock: socket.socket, obj, fds: list[int] | None = None) -> None:
    """A 4-byte big-endian length, then that many bytes of JSON; ``fds`` ride with the length
    (``SCM_RIGHTS``, :func:`socket.send_fds`)."""
    data = json.dumps(obj).encode()
    head = struct.pack("!I", len(data))
    if fds:
        socket.send_fds(sock, [head], fds)
        sock.sendall(data)
    else:
        sock.sendall(head + data)


def _recv_exact(sock: socket.socket, n: int, buf: bytes = b"") -> bytes:
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return buf


def _recv_msg(sock: socket.socket, fds: list[int] | None = None):
    """One message of :func:`_send_msg`; with ``fds`` given, the descriptors sent with it are appended."""
    if fds is None:
        head = _recv_exact(sock, 4)
    else:
        first, got, _, _ = socket.recv_fds(sock, 4, MAX_FDS)
        fds.extend(got)
        if not first:
            raise ConnectionError("connection closed")
        head = _recv_exact(sock, 4, first)
    (n,) = struct.unpack("!I", head)
    return json.loads(_recv_exact(sock, n))


# --------------------------------------------------------------------------- client
def _connect(addr: str) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(addr)
        return s
    except OSError:
        s.close()
        return None


def _start_server(owner: int, root: str) -> None:
    """Start the server in this process group (a group kill takes it down too), detached from our stdio."""
    subprocess.Popen([sys.executable, "-m", "lopd.warm", str(owner), root], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


def run_client(argv: list[str]) -> int:
    """Run ``lopd argv`` in a fork of the warm server; returns the stage's exit status."""
    owner, root = find_owner(), os.environ["DVC_ROOT"]
    addr = address(owner, root)
    sock = _connect(addr)
    if sock is None:
        _start_server(owner, root)
        deadline = time.monotonic() + START_TIMEOUT_S
        while sock is None and time.monotonic() < deadline:
            time.sleep(0.05)
            sock = _connect(addr)
        if sock is None:
            print("lopd: the warm worker did not start; running in this process (LOPD_WARM=0 skips it)",
                  file=sys.stderr)
            return -1
    env = dict(os.environ)
    if env.get("LOPD_RECORD_DIR"):  # the stage's record shows this command's modules too (lopd.cli, ...)
        from lopd.dispatch import CLIENT_MODULES_ENV, imported_lopd_files

        env[CLIENT_MODULES_ENV] = os.pathsep.join(imported_lopd_files())
    with sock:
        _send_msg(sock, {"argv": argv, "cwd": os.getcwd(), "env": env},
                  [sys.stdin.fileno() if not sys.stdin.closed else os.open(os.devnull, os.O_RDONLY),
                   sys.stdout.fileno(), sys.stderr.fileno()])
        try:
            reply = _recv_msg(sock)
        except (ConnectionError, OSError):
            print("lopd: the stage process died without an exit status (killed?)", file=sys.stderr)
            return 1
    return int(reply["rc"])


# --------------------------------------------------------------------------- server
LIBRARIES = ("torch", "transformers", "peft", "safetensors.torch", "numpy", "scipy.stats", "optuna", "mlflow",
             "matplotlib")
OWN_MODULES = ("lopd.dispatch", "lopd.training.trainer", "lopd.model.backbone", "lopd.model.composer", "lopd.bank",
               "lopd.engine.evaluation", "lopd.training.run", "lopd.hpo.study", "lopd.training.cold_start", "lopd.training.base_policy",
               "lopd.tracking")


def _preload(own: bool = True) -> None:
    """Import what stages import, without running any torch computation (fork-safe). ``own=False``
    (while recording reads): the libraries only, so that each stage still imports, and records,
    exactly the ``lopd`` modules it needs (this module and the ``lopd`` package aside, which every
    stage's ``lopd`` command imports first anyway)."""
    mods = list(LIBRARIES)
    if own:
        from lopd.stages.registry import stage_modules

        mods = [*stage_modules(), *mods, *OWN_MODULES]
    for mod in mods:
        try:
            __import__(mod)
        except ImportError:
            pass  # an optional library: the stage that needs it imports it (and fails clearly) itself
    try:  # the model class itself is lazily imported by transformers
        from transformers import Qwen3ForCausalLM  # noqa: F401
    except ImportError:
        pass


def _open_tracking(root: str) -> None:
    """Open the MLflow store and find the experiment's parent run once (fork-safe: lopd.tracking
    drains MLflow's writer threads and closes pooled connections before every fork). Any failure
    is left to the stages' own trackers, which report it under ``tracking.on_failure``."""
    try:
        from pathlib import Path

        from lopd.config import load_params
        from lopd.tracking import preload

        preload(load_params(Path(root) / "params.yaml"))
    except Exception:  # noqa: BLE001 - each stage reports its own tracking failure
        pass


def _write_preload_timing(root: str, owner: int, t0: float, cpu: float) -> None:
    """Side file for ``bench/pipeline.sh``: the warm worker's one-time import cost."""
    from pathlib import Path

    from lopd.utils import write_json

    write_json(Path(root) / ".lopd" / "timing" / f"warm-worker-{owner}.json",
               {"stage": "warm-worker", "kind": "warm-worker", "t_process": t0, "t_work": time.time(),
                "t_end": time.time(), "cpu_startup": cpu, "cpu_work": 0.0})


def _watch_connection(conn: socket.socket) -> None:
    """In the stage child: exit at once when the client goes away (it was killed)."""
    try:
        while conn.recv(1):
            pass
    except OSError:
        pass
    os._exit(137)


def _child(conn: socket.socket) -> None:
    fds: list[int] = []
    try:
        req = _recv_msg(conn, fds)
    except (ConnectionError, OSError, ValueError):
        os._exit(1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # stages wait on their own subprocesses (sandbox)
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"], LOPD_IN_WARM="1")
    sys.argv = ["lopd", *req["argv"]]
    threading.Thread(target=_watch_connection, args=(conn,), daemon=True).start()
    rc = 1
    try:
        from lopd.dispatch import run_in_process

        rc = run_in_process(req["argv"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - report like an uncaught exception in a fresh process
        import traceback

        traceback.print_exc()
        rc = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    try:
        _send_msg(conn, {"rc": rc})
    except OSError:
        pass
    os._exit(rc)


def serve(owner: int, root: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(address(owner, root))
    except OSError:
        return  # another server for this owner is already up
    t0, cpu0 = time.time(), time.process_time()
    recording = bool(os.environ.get("LOPD_RECORD_DIR"))  # the environment of the client that started us
    _preload(own=not recording)
    if not recording:  # both import lopd modules that a stage's record must not show unless it imports them
        _open_tracking(root)
        _write_preload_timing(root, owner, t0, time.process_time() - cpu0)
    sock.listen(16)
    sock.settimeout(POLL_S)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    while True:
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            return  # dvc is gone: so are we
        except PermissionError:
            pass
        try:
            conn, _ = sock.accept()
        except socket.timeout:
            continue
        if os.fork() == 0:
            sock.close()
            _child(conn)
        conn.close()


if __name__ == "__main__":
    from lopd.compat.kernels import pin_kernels

    pin_kernels()  # inherited from the client already; set again so that no import below can see another value
    serve(int(sys.argv[1]), sys.argv[2])
