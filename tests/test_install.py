"""tools/install.py hands uv the package sources pip is configured with (uv reads none of pip's files)."""

from __future__ import annotations

import importlib.util
import subprocess

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("install", REPO / "tools" / "install.py")
install = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install)

PIP_CONFIG_LIST = """:env:.find-links='/from/env'
:env:.default-timeout='180'
global.cert='/etc/ssl/certs/ca.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_pip_config_reads_files_and_env_and_env_wins(monkeypatch):
    def fake_run(cmd, **kw):
        assert cmd[1:] == ["-m", "pip", "config", "list"]
        return subprocess.CompletedProcess(cmd, 0, stdout=PIP_CONFIG_LIST, stderr="")

    monkeypatch.setattr(install.subprocess, "run", fake_run)
    conf = install.pip_config("python")
    assert conf["extra-index-url"] == ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
    assert conf["find-links"] == ["/from/env"]  # PIP_FIND_LINKS over the file's, as pip reads them
    assert conf["constraint"] == ["/etc/xdg/pip/constraints.txt"] and conf["cert"] == ["/etc/ssl/certs/ca.crt"]


def test_uv_command_passes_every_source_and_pips_multi_index_rule(tmp_path, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    conf = {"index-url": ["https://pypi.example/simple"], "extra-index-url": ["file:///a", "file:///b"],
            "find-links": [str(wheels), str(tmp_path / "missing"), "https://links.example/"],
            "constraint": ["/c.txt"], "cert": ["/ca.crt"]}
    cmd, env = install.uv_command("uv", "py", conf, ["-q", "-e", ".[test]"])
    assert cmd == ["uv", "pip", "install", "--python", "py", "--index-strategy", "unsafe-best-match",
                   "--index-url", "https://pypi.example/simple", "--extra-index-url", "file:///a",
                   "--extra-index-url", "file:///b", "--find-links", str(wheels), "--find-links",
                   "https://links.example/", "--constraint", "/c.txt", "-q", "-e", ".[test]"]
    assert env["SSL_CERT_FILE"] == "/ca.crt"  # a missing local find-links directory is skipped, as pip does
