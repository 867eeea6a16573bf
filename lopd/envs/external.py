"""External benchmark data (evaluation-only domains).

BFCL: the ``bfcl-eval`` wheel on PyPI ships the Berkeley Function Calling Leaderboard data
as JSON lines. The package itself is *not* installed (it pins an older numpy); its wheel is
only downloaded (``pip download --no-deps``, pinned version) and the few data files we
use are unzipped into ``data/external/bfcl/``::

    <dest>/BFCL_v4_simple_python.json
    <dest>/BFCL_v4_multiple.json
    <dest>/possible_answer/BFCL_v4_simple_python.json
    <dest>/possible_answer/BFCL_v4_multiple.json
    <dest>/MANIFEST.json            (wheel name and version, SHA-256 of every file)

Command line (what ``make external-data`` runs)::

    python -m lopd.envs.external [DEST]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from lopd.errors import BadInput
from lopd.utils import hash_files, sha256_file, swap_dir

BFCL_PACKAGE = "bfcl-eval"
BFCL_VERSION = "2026.3.23"
BFCL_DEFAULT_DIR = Path("data/external/bfcl")
BFCL_ENV_VAR = "LOPD_BFCL_DIR"
# BFCL category (our name) -> file stem inside bfcl_eval/data/
BFCL_CATEGORIES = {"simple": "BFCL_v4_simple_python", "multiple": "BFCL_v4_multiple"}
FETCH_COMMAND = "make external-data  (or: python -m lopd.envs.external data/external/bfcl)"

_NETWORK_MARKERS = (
    "NewConnectionError", "ConnectionError", "Max retries exceeded", "Name or service not known",
    "Temporary failure in name resolution", "Network is unreachable", "No route to host",
    "Connection refused", "Connection reset", "ReadTimeoutError", "timed out", "ProxyError",
    "SSLError", "getaddrinfo failed",
    # the pinned version exists on PyPI: "none" means no index could be read (offline, or
    # pip told not to retry so it printed no connection error)
    "(from versions: none)",
)


class FetchError(BadInput):
    """``pip download`` failed; ``network`` says whether it looks like a network failure."""

    def __init__(self, message: str, network: bool):
        super().__init__(message)
        self.network = network


def bfcl_files(root: Path) -> list[Path]:
    """The data files (relative to ``root``) that a complete BFCL directory holds."""
    rel = []
    for stem in BFCL_CATEGORIES.values():
        rel += [Path(f"{stem}.json"), Path("possible_answer") / f"{stem}.json"]
    return rel


def fetch_bfcl(dest: Path = BFCL_DEFAULT_DIR, *, timeout_s: float = 600.0) -> Path:
    """Download the pinned ``bfcl-eval`` wheel (no dependencies, nothing installed) and
    extract the supported categories' question and possible-answer files into ``dest``.

    The directory is replaced atomically (built next to ``dest``, then renamed), so a
    failed fetch never leaves a half-written one. Returns ``dest``.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lopd-bfcl-dl-") as dl:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", dl, f"{BFCL_PACKAGE}=={BFCL_VERSION}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise FetchError(f"pip download timed out after {timeout_s:g}s: {' '.join(cmd)}", True) from e
        if proc.returncode != 0:
            err = (proc.stderr or "") + (proc.stdout or "")
            network = any(m in err for m in _NETWORK_MARKERS)
            tail = "\n".join(err.strip().splitlines()[-8:])
            raise FetchError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{tail}", network)
        wheels = sorted(Path(dl).glob("bfcl_eval-*.whl"))
        if len(wheels) != 1:
            raise FetchError(f"expected one bfcl_eval wheel in the download, found {wheels}", False)
        wheel = wheels[0]

        staging = Path(tempfile.mkdtemp(prefix=".bfcl-staging-", dir=dest.parent))
        try:
            os.chmod(staging, 0o755)  # mkdtemp makes it 0700
            with zipfile.ZipFile(wheel) as zf:
                names = set(zf.namelist())
                for rel in bfcl_files(staging):
                    member = f"bfcl_eval/data/{rel.as_posix()}"
                    if member not in names:
                        raise FetchError(f"{wheel.name} has no {member}", False)
                    out = staging / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(member) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
            manifest = {
                "package": BFCL_PACKAGE, "version": BFCL_VERSION, "wheel": wheel.name,
                "wheel_sha256": sha256_file(wheel),
                "files": hash_files(staging, [rel.as_posix() for rel in bfcl_files(staging)]),
            }
            (staging / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
            swap_dir(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return dest


def bfcl_dir(path: str | Path | None = None) -> Path:
    """The BFCL data directory: ``path``, else ``$LOPD_BFCL_DIR``, else ``data/external/bfcl``
    (relative to the working directory, i.e. the repository root for DVC stages).

    Raises :class:`BadInput` naming the fetch command when it is missing or incomplete.
    """
    if path is None:
        path = os.environ.get(BFCL_ENV_VAR) or BFCL_DEFAULT_DIR
    d = Path(path)
    missing = [str(rel) for rel in bfcl_files(d) if not (d / rel).is_file()]
    if missing:
        raise BadInput(
            f"BFCL data not found in {d} (missing {', '.join(missing)}); fetch it with: "
            f"{FETCH_COMMAND}, or point ${BFCL_ENV_VAR} at a directory holding it"
        )
    return d


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dest = Path(args[0]) if args else BFCL_DEFAULT_DIR
    try:
        out = fetch_bfcl(dest)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"BFCL {BFCL_VERSION} data in {out} ({size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
