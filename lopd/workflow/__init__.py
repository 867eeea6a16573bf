"""The workflow around the pipeline, behind one door: DVC and the tools that drive it.

``dvcgen`` writes ``dvc.yaml`` from the stage registry, with code deps from the import graph
(``codegraph``); ``lockguard`` keeps ``dvc.lock`` whole across kills; ``verify`` reruns stages in a
scratch copy; ``experiment`` (``lopd exp run``), ``params_view`` (``lopd params``) and ``doctor``;
``tools`` dispatches these commands. DVC's private internals are read only in
:mod:`lopd.compat.dvc`.
"""
