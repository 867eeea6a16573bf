"""Analysis: statistics, the falsification rule, tables, plot data, figures, audits and the report
orchestrator (:func:`lopd.analysis.report.build_report`). Nothing here imports torch."""
