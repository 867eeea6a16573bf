"""``lopd launch`` warns when a job reserves fewer CPUs than the torch threads its stage runs
(:func:`lopd.launch.main.oversubscription`): side by side such jobs spin rather than share the cores."""

from __future__ import annotations

import yaml

from lopd.config import LaunchParams
from lopd.launch.main import oversubscription
from tests.conftest import REPO


def _launch(resources: dict) -> LaunchParams:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())["launch"]
    return LaunchParams.model_validate({**raw, "resources": resources})


def test_a_job_reserving_fewer_cpus_than_its_threads_is_named():
    lp = _launch({"default": {"num_cpus": 1, "num_gpus": 0}, "train": {"num_cpus": 2, "num_gpus": 0},
                  "evaluate": {"num_cpus": 1, "num_gpus": 1}})
    got = oversubscription(lp, 2)
    assert len(got) == 1 and got[0].startswith("launch.resources.default reserves 1 CPU") and "torch_threads = 2" in got[0]
    assert oversubscription(lp, 1) == []  # one thread per job fits one CPU per job


def test_the_committed_params_are_warned_about():
    """The default's jobs reserve 1 CPU and its stages run 2 threads: lopd launch says so (not yet changed:
    either fix moves numbers or halves the jobs a machine runs)."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    assert oversubscription(LaunchParams.model_validate(raw["launch"]), raw["model"]["torch_threads"])
