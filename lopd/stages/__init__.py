"""The pipeline: one short module per DVC stage.

Each module's ``run(params, paths, ...)`` reads its params section, calls the library and
writes its outputs under :class:`lopd.paths.Paths`. ``lopd.cli`` dispatches through
:data:`STAGES`; ``dvc.yaml`` calls the CLI (``lopd <stage> …``) and declares exactly the params
keys and code each stage reads (``tests/test_declared_reads.py`` enforces it).
"""

STAGES = ("prepare", "base", "bank", "cold_start", "probe", "hpo", "sensitivity", "train", "evaluate", "report")
