"""Stage ``report``: tables, figures and audits under ``reports/`` from the run outputs only."""

from __future__ import annotations

from lopd.config import Params
from lopd.paths import Paths


def run(params: Params, paths: Paths) -> dict:
    from lopd.analysis.report import build_report
    from lopd.tracking import log_report_artifacts

    summary = build_report(params, paths.root)
    out = paths.reports  # the experiment's parent MLflow run carries the report
    log_report_artifacts(params, sorted([*out.glob("*.md"), *out.glob("*.json"), *(out / "figures").glob("*.png"),
                                         *(out / "metrics").rglob("*.json")]), root=paths.root)
    print(f"report written to {paths.reports}")
    return summary
