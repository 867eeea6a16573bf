"""MLflow tracking: one run tree per pipeline experiment, never holding a run's files hostage.

Every stage writes its results as files first (``result.json``, ``history.csv``); MLflow mirrors
them for browsing, through :class:`mlflow.MlflowClient`, in the experiment ``tracking.experiment``
(run names: :mod:`lopd.tracking.names`)::

    <dvc exp> @ <commit> · params <hash>   tag lopd.experiment_key; the whole params as run params;
    │                                      artifacts: reports/*.md, reports/figures/*.png, metrics.json
    ├── base, cold start, probe
    ├── search (hpo, or a search worker)
    │   └── trial k · m=… K=… n_ret=… lr=…,  baseline <arm> · lr=… · seed s
    ├── sensitivity
    │   └── sensitivity · <axis>=<value> · seed s
    ├── <arm> · seed s     the final runs: history.csv and result.json as artifacts; test/reward and
    │                      final/beta as metrics (test/* mirrored by the evaluate stage)
    └── evaluate · <arm> · seed s

Every run carries the tags ``dvc.exp_name`` (``DVC_EXP_NAME`` under ``dvc exp run``, else
``workspace``), ``dvc.rev`` and ``git_commit``. Metric names are namespaced: ``train/*`` (reward,
loss, kd_loss, tail_mass, n_supervised, rollouts_used), ``margin/*`` (delta_phi, beta, sat_frac),
``phi/anchor``, ``val/*``, ``test/*``, ``final/*``, ``cold_start/*``, ``probe/*``.

The experiment parent is identified by :func:`experiment_key` (the hash of every params section
but ``tracking`` + the git commit). The first :class:`Tracker` of an experiment creates it; a file
lock (next to the SQLite db, or in the temp directory for other URIs: same host only) makes the
look-up-or-create atomic, so concurrent stages end with one parent. Every run without an explicit
parent is nested under it (tag ``mlflow.parentRunId``). :func:`log_report_artifacts` attaches the
report to it and marks it FINISHED; when DVC skipped the report stage, ``lopd repro`` does the same
after the repro (:func:`close_experiment`).

Metrics are buffered and sent with ``MlflowClient.log_batch`` (one store write per flush, not per
value; the client splits a flush into batches MLflow accepts); with ``tracking.async_logging``
MLflow's own background queue writes them (``synchronous=False``) and their outcome is collected
at the next flush and at :meth:`Tracker.end`.

A worker that forks one process per stage calls :func:`preload` once: the children then skip
importing MLflow's store code, opening the store and finding the parent. Forking is safe at any
time: before a fork this process's MLflow writer threads are drained and stopped and its pooled
SQLite connections closed (SQLite connections must not cross a fork). The MLflow internals this
needs are read in :mod:`lopd.compat.mlflow` only.

If the tracking URI is unreachable: with ``tracking.on_failure: warn`` (default) the run goes on,
prints one clear warning and records ``"tracking": "failed: <cause>"`` in its ``result.json``;
with ``fail`` the stage stops with exit status 2 (``BadInput``).
"""

# EXPERIMENT_IDS, PARENTS and SWEPT: this process's caches of the look-ups it made (cleared, the next call
# looks up again, as a fresh process would)
from lopd.tracking.store import (EXPERIMENT_IDS, EXPERIMENT_KEY_TAG, HOST_TAG, PARENTS, PID_TAG,  # noqa: F401
                                 experiment_id, experiment_key, experiment_parent_id, git_commit, preload,
                                 provenance_tags)
from lopd.tracking.tracker import (SWEPT, Tracker, close_experiment, log_report_artifacts,  # noqa: F401
                                   log_to_training_run, mark_stale_run, report_files, sweep_dead_runs)
