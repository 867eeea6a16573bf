"""Small shared helpers: seeding, atomic file writes, history tables."""

from __future__ import annotations

import csv
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


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (tmp + rename) so a killed stage never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([fmt_num(r.get(c)) for c in columns])
    os.replace(tmp, path)


def progress():
    """A rich progress bar that degrades to plain output when not on a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[info]}"), transient=False)
