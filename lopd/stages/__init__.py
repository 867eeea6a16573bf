"""The pipeline: one short module per command a DVC stage runs.

Each module's ``run(params, paths, ...)`` reads its params section, calls the library and writes its
outputs under :class:`lopd.paths.Paths`. Every stage is declared once, in :mod:`lopd.stages.registry`:
the command line (:mod:`lopd.dispatch`), the warm worker's preload and ``dvc.yaml`` (``lopd dvc-yaml``)
come from it; ``tests/integration/test_declared_reads.py`` checks its declarations against what each
stage reads.
"""
