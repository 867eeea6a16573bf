"""Stage ``report``: tables, figures and audits under ``reports/`` from the run outputs only."""

from __future__ import annotations

from lopd.config import Params
from lopd.paths import Paths


def run(params: Params, paths: Paths) -> dict:
    from lopd.analysis.report import build_report
    from lopd.confirmation.ledger import entry_line
    from lopd.confirmation.registration import load
    from lopd.tracking import log_report_artifacts, report_files

    # the registration, its hashes checked (an altered one stops the report); none: no confirmatory verdict
    registration = load(paths.registration) if paths.registration.exists() else None
    ledger = entry_line(paths.root, registration["sha256"]) if registration else None
    summary = build_report(params, paths.root, registration, ledger)
    # the experiment's parent MLflow run carries the report
    log_report_artifacts(params, report_files(paths.reports), root=paths.root)
    print(f"report written to {paths.reports}")
    return summary
