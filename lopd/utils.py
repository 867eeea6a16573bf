"""Small shared helpers, written once: seeding, atomic file writes, hashing, JSON cleaning, tables."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import random
from pathlib import Path
from typing import Any, Iterable

import numpy as np


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed python, numpy and torch; fix the thread count (CPU float reductions depend on it)."""
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)


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


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file and rename, so a kill never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (sorted keys, cleaned values) so a killed stage never leaves half a file."""
    atomic_write_text(path, json.dumps(_clean(obj), indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | Path) -> str:
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


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


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


def pid_started_before(pid: int, t: float) -> bool:
    """Whether process ``pid`` is alive and was started before time ``t`` (epoch s), i.e. may be the
    process that wrote something at ``t`` (a reused pid started later is not). In doubt, yes: a live
    holder's lock or run is never taken from it."""
    import psutil  # a DVC dependency

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # dead, not yet reaped by its parent
            return False
        return proc.create_time() <= t + 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True
