"""The local MLflow server: start on a free loopback port, log through it over HTTP, stop it."""

from __future__ import annotations

import os
import socket
import time

import pytest

from lopd.config import TrackingParams
from lopd.errors import BadInput
from lopd.tracking_server import server_command, start_server, stop_server, wait_ready


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    """Whether any process (the server or one of its workers) is left in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_server_command_is_loopback_only(tmp_path):
    cmd = server_command(5123, backend="sqlite:///x.db", artifacts=str(tmp_path / "a"))
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == "5123"
    assert "--serve-artifacts" in cmd and cmd[cmd.index("--artifacts-destination") + 1] == str(tmp_path / "a")
    with pytest.raises(BadInput):
        server_command(5123, host="0.0.0.0")


def test_tracker_logs_through_http_server(tmp_path):
    from mlflow.tracking import MlflowClient

    from lopd.tracking import Tracker

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, tmp_path)
    try:
        try:
            wait_ready(url, timeout=60, proc=proc)
        except (TimeoutError, RuntimeError) as e:
            log = (tmp_path / "mlflow-server.log").read_text(errors="replace")[-3000:]
            pytest.fail(f"{e}\n{log}")
        tp = TrackingParams(uri=url, experiment="server-test", on_failure="fail")
        tr = Tracker(tp, "http-run", {"stage": "test", "arm": "lopd", "seed": 0})
        assert tr.ok, tr.error
        for step in range(3):
            tr.log_metrics({"reward": 0.1 * step, "beta": float(step)}, step)
        tr.log_params({"lr": 0.01})
        tr.end()
        assert tr.ok, tr.error

        client = MlflowClient(tracking_uri=url)
        run = client.get_run(tr.run_id)
        assert run.info.status == "FINISHED"
        assert run.data.params["lr"] == "0.01"
        assert run.data.tags["arm"] == "lopd"
        hist = client.get_metric_history(tr.run_id, "reward")
        assert sorted((m.step, round(m.value, 6)) for m in hist) == [(0, 0.0), (1, 0.1), (2, 0.2)]
        assert (tmp_path / "mlflow.db").exists()  # the store lives in the server's workdir
    finally:
        rc = stop_server(proc, timeout=20)
    assert rc is not None
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(proc.pid), "server (or a worker of it) still alive after stop"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
