"""Small shared helpers, written once: atomic file writes, JSON reading and cleaning, file hashes and
manifests of them, the directory swap, code fingerprints, tables, process start times.

No torch or numpy: every layer may use it, the launcher and the report included."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from lopd.errors import BadInput
from lopd.faults import kill_point


def _clean(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item):
        return _clean(x.item())
    return x


def clean_json(x: Any) -> Any:
    """Plain JSON data: NaN/inf → None, tuples → lists, numpy/torch scalars → Python numbers."""
    return _clean(x)


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """The one way every output file is written: yield a fresh temp path beside ``path`` (named
    ``.<name>.<random>.tmp``), let the caller write it (a library that wants a file name included),
    then fsync it and rename it over ``path``. A kill leaves either the old file or the new one,
    never half a file; a failure removes the temp file and re-raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temp(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if ".lopd" not in path.parts:  # fault injection (LOPD_KILL_AT): a kill after a complete output (not a side file)
        kill_point("write", detail=str(path))


def _new_temp(path: Path) -> Path:
    """A new empty file ``.<name>.<random>.tmp`` beside ``path``, with the permissions a plain
    ``open(path, "w")`` would give (0666 less the umask; ``mkstemp`` would make it 0600)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return tmp
        except FileExistsError:
            continue


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_output`."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (sorted keys, cleaned values) so a killed stage never leaves half a file."""
    atomic_write_text(path, json.dumps(_clean(obj), indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB chunks: the one file hash of every manifest,
    checkpoint, weights file and code fingerprint."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_path(path: str | Path) -> str:
    """SHA-256 of a file, or of a directory's (relative path, file hash) list; ``missing`` if absent."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    if path.is_dir():
        items = [(str(p.relative_to(path)), sha256_file(p)) for p in sorted(path.rglob("*")) if p.is_file()]
        return hashlib.sha256(json.dumps(items).encode()).hexdigest()
    return "missing"


# --------------------------------------------------------------------------- manifests of file hashes
def hash_files(root: str | Path, names: Iterable[str]) -> dict[str, str]:
    """``{name: SHA-256 of root/name}`` in the order of ``names``: the hash table a manifest records for
    the files just written beside it (splits, experience bank, checkpoints)."""
    return {name: sha256_file(Path(root) / name) for name in names}


def write_manifest(path: str | Path, manifest: dict, *, sort_keys: bool = True, end: str = "\n") -> None:
    """Write a manifest atomically as JSON indented by 2: sorted keys and a final newline (splits,
    experience bank), or ``sort_keys=False, end=""`` (a checkpoint's ``meta.json``)."""
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=sort_keys) + end)


def verify_files(root: str | Path, hashes: dict[str, str],
                 problem: Callable[[Path, str | None], str]) -> dict[str, str]:
    """Check each file ``root/name`` against its SHA-256 in ``hashes`` (a manifest's table, as
    :func:`hash_files` made it), in order. The first file missing or not matching is bad input with the
    message ``problem(path, digest)`` (``digest`` is ``None`` for a missing file). Returns the digests."""
    root, digests = Path(root), {}
    for name, expected in hashes.items():
        path = root / name
        digest = sha256_file(path) if path.exists() else None
        if digest is None or digest != expected:
            raise BadInput(problem(path, digest))
        digests[name] = digest
    return digests


def swap_dir(new: str | Path, dest: str | Path) -> None:
    """Put the directory ``new`` (complete, beside ``dest``) in ``dest``'s place: the current ``dest``, if
    any, is renamed aside to ``<dest>.old``, ``new`` renamed to ``dest``, then the old one removed. A kill
    leaves ``dest`` whole, or the previous one as ``<dest>.old`` and ``new`` beside it."""
    import shutil

    new, dest = Path(new), Path(dest)
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.replace(dest, old)
    os.replace(new, dest)
    shutil.rmtree(old, ignore_errors=True)


def copy_checkout(root: str | Path, dst: str | Path, exclude: Iterable[str] = ()) -> Path:
    """Copy a git checkout's source to ``dst``: its tracked files and the untracked ones git does not
    ignore, as they are in the working tree (so no DVC output, venv or MLflow store), minus ``exclude``
    (paths relative to ``root``)."""
    import shutil
    import subprocess

    root, dst, skip = Path(root), Path(dst), set(exclude)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for f in files:
        if f in skip or not (root / f).is_file():
            continue
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, dst / f)
    return dst


# --------------------------------------------------------------------------- code fingerprints
FINGERPRINT_SKIP_DIRS = ("__pycache__",)
FINGERPRINT_SKIP_SUFFIXES = (".pyc",)  # bytecode is not source (.dvcignore keeps it out of DVC's hashes too)


def _stage_stanza(root: Path, stage: str) -> tuple[list[str], list[str], str, Path]:
    """``stage``'s deps, params keys and one output from ``<root>/dvc.yaml``, and the directory they are
    relative to."""
    import yaml

    dvc_yaml = root / "dvc.yaml"
    try:
        doc = yaml.safe_load(dvc_yaml.read_text()) or {}
    except OSError as e:
        raise BadInput(f"{dvc_yaml}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise BadInput(f"{dvc_yaml}: not valid YAML: {e}") from None
    stages = doc.get("stages") if isinstance(doc, dict) else None
    st = stages.get(stage) if isinstance(stages, dict) else None
    if not isinstance(st, dict):
        code = sorted(n for n in (stages or {}) if str(n).startswith("code_"))
        raise BadInput(f"{dvc_yaml}: no stage {stage!r} to fingerprint (code stages: {', '.join(code) or 'none'})")
    if "matrix" in st or "foreach" in st:
        raise BadInput(f"{dvc_yaml}: stage {stage!r} is a matrix/foreach stage; a fingerprint stage is a single stage")
    deps, params, outs = st.get("deps") or [], st.get("params") or [], st.get("outs") or []
    if not isinstance(deps, list) or not deps or not all(isinstance(d, str) for d in deps):
        raise BadInput(f"{dvc_yaml}: stage {stage!r} needs a non-empty list of path deps to fingerprint")
    templated = [d for d in deps if "${" in d]
    if templated:
        raise BadInput(f"{dvc_yaml}: stage {stage!r}: templated deps cannot be fingerprinted: {templated}")
    if not isinstance(params, list) or not all(isinstance(k, str) and k and "${" not in k for k in params):
        raise BadInput(f"{dvc_yaml}: stage {stage!r}: params must be a list of params.yaml keys (a section or "
                       f"section.key), not {params}")
    paths = [next(iter(o)) if isinstance(o, dict) and len(o) == 1 else o for o in outs]
    if len(paths) != 1 or not isinstance(paths[0], str) or "${" in paths[0]:
        raise BadInput(f"{dvc_yaml}: stage {stage!r} must declare exactly one output (the fingerprint file), not {outs}")
    return deps, params, paths[0], root / str(st.get("wdir") or ".")


def _fingerprint_files(base: Path, dep: str) -> list[Path]:
    p = base / dep
    if p.is_file():
        return [p]
    if not p.is_dir():
        return []
    out = []
    for d, dirs, files in os.walk(p):
        dirs[:] = sorted(x for x in dirs if x not in FINGERPRINT_SKIP_DIRS)
        out += [Path(d) / f for f in files if not f.endswith(FINGERPRINT_SKIP_SUFFIXES)]
    return out


def param_values(params_file: Path, keys: list[str], stage: str) -> dict[str, Any]:
    """The value of each key in ``params_file``, sorted by key: ``a.b`` is ``raw["a"]["b"]`` and a bare
    section name is the whole section (as DVC resolves a stage's params). A missing key is bad input."""
    from lopd.config import read_yaml_mapping

    raw = read_yaml_mapping(params_file)
    values, missing = {}, []
    for key in keys:
        node: Any = raw
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(key)
                break
            node = node[part]
        else:
            values[key] = node
    if missing:
        raise BadInput(f"stage {stage!r}: declared params key(s) not in {params_file}: {', '.join(missing)}")
    return dict(sorted(values.items()))


def _value_sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()


def code_fingerprint(root: str | Path, stage: str) -> tuple[Path, dict]:
    """The fingerprint of what a stage kind runs: its code and the params it reads. ``files``: the
    SHA-256 of every file in the deps ``stage`` declares in ``<root>/dvc.yaml`` (directories
    recursively, bytecode skipped), keyed by repo-relative path; ``params``: the value of every params
    key it declares, read from its directory's ``params.yaml`` (the file DVC tracks them in). One
    SHA-256 covers both: of the lines ``<sha256>  <path>`` (like ``sha256sum``), then one line
    ``<sha256 of the value's sorted-key JSON>  params.yaml:<key>`` per key. Returns the stage's output
    path and the fingerprint. A declared dep or key that does not exist is bad input."""

    root = Path(root).resolve()
    deps, keys, out, base = _stage_stanza(root, stage)
    files: dict[str, str] = {}
    missing = []
    for dep in deps:
        found = _fingerprint_files(base, dep)
        if not found and not (base / dep).is_dir():
            missing.append(dep)
        for f in found:
            files[Path(os.path.relpath(f, root)).as_posix()] = sha256_file(f)
    if missing:
        raise BadInput(f"stage {stage!r}: declared dep(s) not found under {base}: {', '.join(missing)}")
    files = dict(sorted(files.items()))
    params = param_values(base / "params.yaml", keys, stage) if keys else {}
    lines = [f"{h}  {p}\n" for p, h in files.items()]
    lines += [f"{_value_sha256(v)}  params.yaml:{k}\n" for k, v in params.items()]
    overall = hashlib.sha256("".join(lines).encode()).hexdigest()
    return base / out, {"stage": stage, "sha256": overall, "files": files, "params": params}


def write_code_fingerprint(root: str | Path, stage: str) -> tuple[Path, dict]:
    """Compute :func:`code_fingerprint` and write it (deterministic JSON, atomically) to the stage's output."""
    out, fp = code_fingerprint(root, stage)
    write_json(out, fp)
    return out, fp


def read_json(path: str | Path) -> Any:
    """The parsed JSON at ``path``; invalid JSON is bad input naming the file (a missing file raises
    FileNotFoundError for the caller to name in context)."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: not valid JSON: {e}") from None


def fmt_num(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.6g}"
    return str(v)


def write_csv(path: str | Path, rows: Iterable[dict[str, Any]], columns: list[str]) -> None:
    """Write ``rows`` (only ``columns``, in that order) as CSV, atomically."""
    import io

    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(columns)
    for r in rows:
        w.writerow([fmt_num(r.get(c)) for c in columns])
    atomic_write_text(path, buf.getvalue())


def progress():
    """A rich progress bar that degrades to plain output when not on a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[info]}"), transient=False)


def process_start_time(pid: int | None = None) -> float | None:
    """Wall-clock time (epoch s) at which process ``pid`` (default: this one) started, to the clock tick;
    ``None`` if no such process runs (gone, or a zombie: dead, not yet reaped by its parent). Raises
    ``OSError`` where /proc cannot tell.

    /proc gives the start in clock ticks since boot. The boot's epoch is taken as now minus
    ``CLOCK_BOOTTIME`` (sub-millisecond), not /proc/stat's ``btime`` (which psutil's ``create_time``
    adds): that is whole seconds, truncated, and would make every process look up to 1 s older."""
    import time

    stat = f"/proc/{os.getpid() if pid is None else pid}/stat"
    try:
        with open(stat) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            return None
        boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except (IndexError, ValueError, AttributeError) as e:
        raise OSError(f"{stat}: cannot read a start time ({type(e).__name__}: {e})") from None


def pid_started_before(pid: int, t: float) -> bool:
    """Whether process ``pid`` is alive and was started before time ``t`` (epoch s), i.e. may be the
    process that wrote something at ``t`` (a reused pid started later is not). In doubt, yes: a live
    holder's lock or run is never taken from it."""
    try:
        start = process_start_time(pid)
    except OSError:
        return True
    return start is not None and start <= t + 1.0


def content_overlap(hashes: dict[str, list[str]]) -> dict:
    """Content overlap of the splits, from each split's list of task content hashes: the number of
    shared hashes for every pair of splits (``"train-test": 0``), and of repeated hashes within each."""
    order = [s for s in ("train", "val", "test") if s in hashes] + sorted(set(hashes) - {"train", "val", "test"})
    sets = {s: set(hashes[s]) for s in order}
    between = {f"{a}-{b}": len(sets[a] & sets[b]) for i, a in enumerate(order) for b in order[i + 1:]}
    return {"between": between, "within": {s: len(hashes[s]) - len(sets[s]) for s in order}}
