"""Install packages into a virtual environment with uv, from the package sources pip is configured with.

    python tools/install.py <venv python> <pip install arguments...>

`make setup` installs torch with pip (``TORCH_SPEC``, so a GPU user's index applies), then everything
else through this script. pip's resolver takes about 85 s for the rest on the 2-core machine; uv takes
under 10 s (docs/benchmarks.md, "The test command"). uv does not read pip's configuration, so the
indexes, find-links, constraints and CA bundle that ``pip config list`` shows (files and ``PIP_*``
variables) are passed to it, with pip's rule for several indexes: the best version over all of them
(``--index-strategy unsafe-best-match``). Packages already installed that satisfy a requirement
(torch) are kept.

If uv cannot be installed (no index serves it), the script says so on stderr and runs pip instead:
slower, the same packages.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys


def pip_config(python: str) -> dict[str, list[str]]:
    """pip's effective settings by option name: ``{"extra-index-url": [...], "find-links": [...], ...}``
    (``pip config list``: ``global.find-links='/opt/wheels'``; ``:env:.find-links`` from ``PIP_*``)."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    files: dict[str, list[str]] = {}
    env: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        values = [v for val in shlex.split(value) for v in val.split()]  # several values: space-separated
        (env if key.startswith(":env:") else files)[key.rsplit(".", 1)[-1]] = values
    return {**files, **env}  # as in pip, a PIP_* variable wins over the files


def uv_command(uv: str, python: str, conf: dict[str, list[str]], args: list[str]) -> tuple[list[str], dict]:
    cmd = [uv, "pip", "install", "--python", python, "--index-strategy", "unsafe-best-match"]
    for url in conf.get("index-url", []):
        cmd += ["--index-url", url]
    for url in conf.get("extra-index-url", []):
        cmd += ["--extra-index-url", url]
    for loc in conf.get("find-links", []):
        if "://" in loc or os.path.exists(loc):  # pip skips a missing local directory; uv would fail on it
            cmd += ["--find-links", loc]
    for c in conf.get("constraint", []):
        cmd += ["--constraint", c]
    env = dict(os.environ)
    if conf.get("cert"):
        env.setdefault("SSL_CERT_FILE", conf["cert"][0])
    return cmd + args, env


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    python, args = argv[0], argv[1:]
    quiet = ["-q"] if "-q" in args else []
    uv = os.path.join(os.path.dirname(python), "uv")
    if not os.path.exists(uv):
        r = subprocess.run([python, "-m", "pip", "install", *quiet, "uv"])
        if r.returncode != 0 or not os.path.exists(uv):
            print("tools/install.py: uv could not be installed; installing with pip instead (slower)", file=sys.stderr)
            return subprocess.run([python, "-m", "pip", "install", *args]).returncode
    cmd, env = uv_command(uv, python, pip_config(python), args)
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
