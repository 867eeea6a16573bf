"""``lopd params`` (effective params with descriptions, changed keys marked), ``lopd exp run --profile``
(a profile as ``dvc exp run -S`` overrides that DVC's own parser reads back to the merged params) and
``lopd doctor`` (repairs what the lock guard handles)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from lopd.cli import main
from lopd.config import deep_merge, read_yaml_mapping
from lopd.errors import BadInput
from lopd.workflow.experiment import exp_run_argv, hydra_literal, set_param_args
from tests.conftest import REPO

PROFILES = sorted((REPO / "profiles").glob("*.yaml"))


@pytest.fixture()
def repo_params(tmp_path) -> Path:
    p = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", p)
    return p


# ------------------------------------------------------------------ lopd params


def test_params_prints_every_section_with_descriptions(repo_params, capsys):
    from lopd.config import Params, TrainParams

    assert main(["--params", str(repo_params), "params"]) == 0
    out = capsys.readouterr().out
    for name, field in Params.model_fields.items():
        assert f"{name}:  # {field.description}" in out
    (steps,) = [ln for ln in out.splitlines() if "# training steps per run" in ln]
    assert steps.split("#")[0].split() == ["steps:", "96"] and not steps.startswith("*")
    assert TrainParams.model_fields["margin"].description in out
    assert "# 0 key(s) differ from the committed params" in out


def test_params_marks_what_a_profile_and_an_override_change(repo_params, tmp_path, capsys):
    prof = tmp_path / "prof.yaml"
    prof.write_text("train: {steps: 3, seeds: [0, 1]}\n")
    rc = main(["--params", str(repo_params), "params", "train", "--profile", str(prof), "-S", "train.K=8"])
    assert rc == 0
    out = capsys.readouterr().out
    marked = {ln.split(":")[0].lstrip("* ") for ln in out.splitlines() if ln.startswith("*")}
    assert marked == {"steps", "seeds", "K"}
    (steps,) = [ln for ln in out.splitlines() if ln.startswith("*") and "steps:" in ln]
    assert "steps: 3" in steps and "(committed: 96)" in steps and "training steps per run" in steps
    assert "envs:" not in out  # only the section asked for
    assert "# 3 key(s) differ from the committed params" in out


def test_params_refuses_a_bad_override_naming_the_key(repo_params, capsys):
    assert main(["--params", str(repo_params), "params", "-S", "train.K=0"]) == 2
    err = capsys.readouterr().err
    assert "train.K: Input should be greater than or equal to 1 (got 0)" in err
    assert main(["--params", str(repo_params), "params", "-S", "train.stepz=1"]) == 2
    assert "did you mean `steps`?" in capsys.readouterr().err
    assert main(["--params", str(repo_params), "params", "-S", "train.K"]) == 2
    assert "expected section.key=value" in capsys.readouterr().err


def test_params_compares_with_the_committed_file_in_git(tmp_path, capsys):
    """In a git repository the baseline is HEAD's params.yaml: an uncommitted edit is marked too."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    for cmd in (["git", "init", "-q"], ["git", "add", "params.yaml"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "p"]):
        subprocess.run(cmd, cwd=tmp_path, check=True)
    raw = yaml.safe_load((tmp_path / "params.yaml").read_text())
    raw["bank"]["seed"] = 7
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["--params", str(tmp_path / "params.yaml"), "params", "bank"]) == 0
    out = capsys.readouterr().out
    assert "HEAD:params.yaml" in out
    assert [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("*")] == ["*  seed"]


# ------------------------------------------------------------------ lopd exp run: the argv


def test_exp_run_argv_for_the_smoke_profile():
    argv = exp_run_argv(REPO / "params.yaml", REPO / "profiles/smoke.yaml", ["-n", "smoke"])
    assert argv[:2] == ["exp", "run"] and argv[-2:] == ["-n", "smoke"]
    sets = argv[3:-2:2]
    assert all(a == "-S" for a in argv[2:-2:2])
    assert "envs.n_train=48" in sets and "train.steps=2" in sets
    assert "train.arms=[base,lopd,lopd_shuffled,lopd_binding]" in sets
    assert "hpo.lr_choices=[0.002,0.005]" in sets
    assert "sensitivity.margins=[0.0,0.05]" in sets and "sensitivity.references=[lopd_nomargin]" in sets
    assert len(sets) == 43  # one per leaf of the profile


@pytest.mark.parametrize("value,literal", [
    (None, "null"), (True, "true"), (3, "3"), (0.002, "0.002"), (5e-05, "5.0e-05"), (1e20, "1.0e+20"),
    ("sqlite:///mlflow.db", "'sqlite:///mlflow.db'"), ("it's", "'it\\'s'"), ("${x}", "'\\${x}'"),
    ("lopd_frozen", "lopd_frozen"), ("True", "'True'"), ("nan", "'nan'"), ("12", "'12'"), ("a-b", "'a-b'"),
    ([1, "a b"], "[1,'a b']"), ({"num_cpus": 1, "num_gpus": 0.5}, "{num_cpus:1,num_gpus:0.5}")])
def test_hydra_literal(value, literal):
    assert hydra_literal(value) == literal


def test_exp_run_adds_missing_keys_with_plus_plus():
    committed = read_yaml_mapping(REPO / "params.yaml")
    args = set_param_args({"launch": {"resources": {"cold_start": {"num_gpus": 1}, "train": {"num_gpus": 2}}}},
                          committed)
    assert args == ["-S", "++launch.resources.cold_start={num_gpus:1}", "-S", "launch.resources.train.num_gpus=2"]


def test_exp_run_refuses_an_invalid_profile_before_dvc(tmp_path, capsys):
    prof = tmp_path / "bad.yaml"
    prof.write_text("train: {K: 0}\n")
    with pytest.raises(BadInput, match="train.K"):
        exp_run_argv(REPO / "params.yaml", prof, [])
    rc = main(["--params", str(REPO / "params.yaml"), "exp", "run", "--profile", str(prof)])
    assert rc == 2 and "train.K" in capsys.readouterr().err


EXTRA = {"tracking": {"uri": "sqlite:///x:y, z'q\\b.db", "experiment": "123"},
         "launch": {"resources": {"cold_start": {"num_cpus": 2, "num_gpus": 0.5}},
                    "shared_paths": ["a\\", "a\\'b", "NULL", "Inf", "x_1", "_", "1e5", "", "[1,2]", "null", "true",
                                     "x=y", "${oc.env:HOME}", "é ü"]},
         "train": {"lr_student": 5e-05, "rollout_budget": None, "arms": ["base"]},
         "model": {"lora_target_modules": ["q_proj", "v_proj"]}, "envs": {"null_world": True},
         "hpo": {"lr_choices": [5e-05, 1e20, 1e-300, 0.1, -3e-7]}}


@pytest.mark.parametrize("profile", [*PROFILES, "extra"], ids=[*(p.stem for p in PROFILES), "extra"])
def test_dvc_reads_the_overrides_back_to_the_merged_params(repo_params, profile):
    """DVC's own -S parser (Hydra) applied to params.yaml gives exactly deep_merge(params, profile), as
    lopd reads the file DVC rewrites (its floats in YAML 1.2 form, e.g. 5e-05)."""
    from dvc.utils.hydra import apply_overrides

    committed = read_yaml_mapping(repo_params)
    prof = EXTRA if profile == "extra" else read_yaml_mapping(profile, "profile")
    apply_overrides(repo_params, set_param_args(prof, committed)[1::2])
    assert read_yaml_mapping(repo_params) == deep_merge(committed, prof)


# ------------------------------------------------------------------ lopd doctor


def test_doctor_restores_a_torn_lock_and_reports(tmp_path, monkeypatch, capsys):
    from lopd.workflow.lockguard import snapshot_lock

    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    good = (REPO / "dvc.lock").read_text()
    (tmp_path / "dvc.lock").write_text(good)
    assert snapshot_lock(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", "--no-mlflow"]) == 0
    assert "dvc.lock: complete; no stale DVC locks" in capsys.readouterr().out
    (tmp_path / "dvc.lock").write_text(good[: len(good) // 2])  # a kill during DVC's rewrite
    assert main(["doctor", "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert "dvc.lock is damaged" in out and "restored the last complete lock" in out
    assert (tmp_path / "dvc.lock").read_text() == good


def test_doctor_outside_a_dvc_repository(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", "--no-mlflow"]) == 2
    assert "not in a DVC repository" in capsys.readouterr().err


def test_exp_run_passes_unknown_arguments_to_dvc(monkeypatch):
    """`lopd exp run` takes --profile anywhere; everything else goes to `dvc exp run` in order."""
    import lopd.workflow.experiment

    seen = []
    monkeypatch.setattr(lopd.workflow.experiment, "guarded_dvc", lambda argv: seen.append(argv) or 0)
    monkeypatch.chdir(REPO)
    assert main(["--params", str(REPO / "params.yaml"), "exp", "run", "-n", "smoke", "--profile",
                 str(REPO / "profiles/null-world.yaml"), "--pull", "train"]) == 0
    assert seen == [["exp", "run", "-S", "envs.null_world=true", "-n", "smoke", "--pull", "train"]]
    with pytest.raises(SystemExit):
        main(["validate", "--bogus"])


def test_doctor_marks_a_dead_process_mlflow_run_killed(tmp_path, monkeypatch, capsys):
    import socket

    from mlflow.tracking import MlflowClient

    from lopd.tracking import HOST_TAG, PID_TAG

    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / ".dvc").mkdir()
    monkeypatch.chdir(tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    client = MlflowClient(tracking_uri="sqlite:///mlflow.db")
    run = client.create_run(client.create_experiment("lopd"),
                            tags={HOST_TAG: socket.gethostname(), PID_TAG: str(gone.pid)})
    assert main(["doctor"]) == 0
    assert f"marked 1 run(s) of dead processes KILLED: {run.info.run_id}" in capsys.readouterr().out
    assert client.get_run(run.info.run_id).info.status == "KILLED"
