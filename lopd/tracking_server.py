"""A local MLflow tracking server (loopback only) over the pipeline's SQLite store.

``lopd mlflow-server --port 5000`` runs, in the foreground::

    mlflow server --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///mlflow.db \\
        --serve-artifacts --artifacts-destination <abs>/mlartifacts --workers 1

Then point the pipeline at it with ``tracking.uri: http://127.0.0.1:5000`` (several
processes — e.g. Optuna workers — can then log concurrently without sharing a SQLite file
lock), or just browse the runs at that address.

Artifacts (MLflow 3 flags): with ``--serve-artifacts`` (MLflow's default) new experiments
get the proxied root ``mlflow-artifacts:/`` and clients upload *through the server*, which
stores the files under ``--artifacts-destination``. ``--default-artifact-root`` is
deliberately not passed: it would make clients write straight to a local path instead of
through the proxy. Experiments created earlier (e.g. by a ``sqlite:///`` run) keep their
own artifact location.

:func:`start_server`, :func:`wait_ready` and :func:`stop_server` are the background
helpers the tests use. Only loopback hosts are accepted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from lopd.errors import BadInput

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def mlflow_executable() -> list[str]:
    """The venv's ``mlflow`` console script (next to this interpreter), else ``python -m mlflow``."""
    exe = Path(sys.executable).parent / "mlflow"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("mlflow")
    return [found] if found else [sys.executable, "-m", "mlflow"]


def server_command(port: int, host: str = "127.0.0.1", backend: str = "sqlite:///mlflow.db",
                   artifacts: str = "mlartifacts", workers: int = 1) -> list[str]:
    if host not in LOOPBACK:
        raise BadInput(f"mlflow server host {host!r}: only loopback is allowed ({', '.join(LOOPBACK)})")
    if not 1 <= int(port) <= 65535:
        raise BadInput(f"mlflow server port {port} outside 1..65535")
    dest = artifacts if "://" in artifacts else str(Path(artifacts).resolve())
    return [*mlflow_executable(), "server", "--host", host, "--port", str(port), "--backend-store-uri", backend,
            "--serve-artifacts", "--artifacts-destination", dest, "--workers", str(workers)]


def _env() -> dict[str, str]:
    # MLflow >= 3.5 also starts "huey" job consumers (GenAI jobs: scorers, trace roll-ups) that
    # outlive the server on SIGINT; the pipeline needs none of them. Set the variable to true
    # in the environment to get them back.
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_ENABLE_ASYNC_LOGGING": "false"}
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return env


def serve(port: int, host: str = "127.0.0.1", backend: str = "sqlite:///mlflow.db",
          artifacts: str = "mlartifacts") -> int:
    """Run the server in the foreground until interrupted; returns its exit status."""
    cmd = server_command(port, host, backend, artifacts)
    print(f"MLflow server on http://{host}:{port} (store {backend}, artifacts {artifacts}); Ctrl-C stops it",
          flush=True)
    proc = subprocess.Popen(cmd, env=_env())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def start_server(port: int, workdir: str | Path, host: str = "127.0.0.1", backend: str | None = None,
                 artifacts: str | None = None) -> subprocess.Popen:
    """Start the server in the background in ``workdir`` (its own process group, so
    :func:`stop_server` ends the server and its workers together). Output goes to
    ``workdir/mlflow-server.log``."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    backend = backend or f"sqlite:///{(workdir / 'mlflow.db').resolve()}"
    artifacts = artifacts or str((workdir / "mlartifacts").resolve())
    log = open(workdir / "mlflow-server.log", "ab")
    try:
        return subprocess.Popen(server_command(port, host, backend, artifacts), cwd=workdir, env=_env(),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()  # the child holds its own descriptor


def wait_ready(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url/health`` until it answers 200; raise ``TimeoutError`` after ``timeout`` s,
    or ``RuntimeError`` at once if ``proc`` exited."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with status {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2) as r:
                if r.status == 200:
                    return
                last = f"HTTP {r.status}"
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.25)
    raise TimeoutError(f"mlflow server at {url} not ready after {timeout} s ({last})")


def stop_server(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """Terminate the server's process group (SIGTERM, then SIGKILL for the server and anything
    left in its group); returns the server's exit status."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=timeout)
    try:  # anything the server left behind in its group (workers, job consumers)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.returncode
