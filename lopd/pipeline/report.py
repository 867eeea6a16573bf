"""Stage ``report``: tables, figures and audits under ``reports/`` from the run outputs only."""

from __future__ import annotations

from lopd.config import Params
from lopd.paths import Paths


def run(params: Params, paths: Paths) -> dict:
    from lopd.analysis.report import build_report

    summary = build_report(params, paths.root)
    print(f"report written to {paths.reports}")
    return summary
