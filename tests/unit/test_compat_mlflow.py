"""The MLflow internals lopd reads (all in lopd/compat/mlflow.py) are where the adapter expects them,
and lopd/tracking reads none itself."""

from __future__ import annotations

import re
from pathlib import Path

LOPD = Path(__file__).resolve().parents[2] / "lopd"


def test_every_mlflow_internal_the_adapter_reads_is_present():
    import mlflow

    from lopd.compat import mlflow as mlflow_compat

    missing = mlflow_compat.missing_internals()
    assert not missing, (f"MLflow {mlflow.__version__} has moved {', '.join(missing)} (lopd/compat/mlflow.py was "
                         f"checked against {mlflow_compat.CHECKED_VERSION}): update the adapter there")


def test_the_check_names_an_internal_that_moved(monkeypatch):
    from lopd.compat import mlflow as mlflow_compat

    monkeypatch.setattr(mlflow_compat, "INTERNALS", [*mlflow_compat.INTERNALS, ("mlflow.utils.validation", "GONE")])
    monkeypatch.setattr(mlflow_compat, "STORE_METHODS", [*mlflow_compat.STORE_METHODS, "vanished"])
    assert mlflow_compat.missing_internals() == ["mlflow.utils.validation.GONE"]
    monkeypatch.setattr(mlflow_compat, "INTERNALS", mlflow_compat.INTERNALS[:-1])
    assert mlflow_compat.missing_internals() == ["SqlAlchemyStore.vanished"]


def test_only_the_adapter_reads_private_mlflow_modules():
    """A private module (``mlflow.x._y``) or a store's attribute read anywhere else in lopd would
    escape the check above."""
    private = re.compile(r"mlflow(\.\w+)*\._\w+")
    offenders = [f"{p.relative_to(LOPD.parent)}:{i}" for p in LOPD.rglob("*.py") if p.name != "mlflow.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert not offenders, offenders
