"""Formatting and atomic writing of report text: numbers, p-values, Markdown and LaTeX tables."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lopd.arms import ARMS
from lopd.utils import atomic_write_text


def write_text(path: Path, text: str) -> None:
    """Atomic, newline-terminated text write."""
    atomic_write_text(path, text if text.endswith("\n") else text + "\n")


def finite(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


def fmt(x: Any, nd: int = 3) -> str:
    """A number for a table: n/a for None/nan, ±∞, integers as such."""
    if x is None or (isinstance(x, (float, np.floating)) and math.isnan(x)):
        return "n/a"
    if isinstance(x, (float, np.floating)) and math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    return f"{x:.{nd}f}"


def fmt_p(p: Any) -> str:
    """A p-value: 4 decimals, scientific below 1e-4."""
    if p is None or (isinstance(p, (float, np.floating)) and math.isnan(p)):
        return "n/a"
    return f"{p:.1e}" if p < 1e-4 else f"{p:.4f}"


def arm_order(names) -> list[str]:
    """Registry order first, then unknown names sorted."""
    names = set(names)
    return [a for a in ARMS if a in names] + sorted(names - set(ARMS))


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def tex_escape(s: str) -> str:
    return (s.replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("%", r"\%")
            .replace("&", r"\&").replace("#", r"\#"))


# what every interval over seeds covers, and what it does not (the tasks are not resampled)
CONDITIONAL = ("Inference is over seeds (each with its own bank and cold-start draw and its own rollouts), "
               "conditional on these test tasks and their worlds: the tasks are crossed with the seeds (every "
               "seed is evaluated on the same tasks) and nested in the worlds, and no interval here resamples them.")
