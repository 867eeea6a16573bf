"""Bad parameters stop every stage with exit status 2 and a message naming the cause."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from lopd.arms import ARMS
from lopd.cli import main
from lopd.config import load_params, parse_params
from lopd.errors import BadInput
from tests.conftest import REPO, default_params  # noqa: E402

REPO_PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


@pytest.fixture(scope="module")
def base_raw() -> dict:
    raw = yaml.safe_load(REPO_PARAMS.read_text())
    assert isinstance(raw, dict) and "train" in raw
    return raw


def _write(tmp_path: Path, raw: dict | str) -> Path:
    p = tmp_path / "params.yaml"
    p.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False))
    return p


def _mod(raw: dict, **changes) -> dict:
    """``_mod(raw, **{"train.steps": 3})`` — a deep copy with dotted keys set."""
    out = copy.deepcopy(raw)
    for dotted, value in changes.items():
        *path, key = dotted.split(".")
        d = out
        for k in path:
            d = d.setdefault(k, {})
        d[key] = value
    return out


def _validate(tmp_path, capsys, raw) -> tuple[int, str]:
    p = _write(tmp_path, raw)
    rc = main(["--params", str(p), "validate"])
    cap = capsys.readouterr()
    return rc, cap.err + cap.out


def test_repo_params_valid(tmp_path, capsys, base_raw):
    rc, out = _validate(tmp_path, capsys, base_raw)
    assert rc == 0
    assert "params OK" in out
    p = load_params(REPO_PARAMS)
    assert p.train.K == base_raw["train"]["K"]


def test_empty_params_is_refused_naming_the_missing_keys(tmp_path, capsys):
    """No hidden defaults: an empty params file names what is missing (params.yaml is the only source)."""
    rc, out = _validate(tmp_path, capsys, "")
    assert rc == 2 and "Field required" in out and "model" in out and "train" in out


# (change, substrings that the message must contain)
CASES = {
    "unknown_section": ({"trian": {"steps": 3}}, ["trian", "unknown key", "train", "model", "envs"]),
    "unknown_key": ({"train.stepz": 3}, ["train.stepz", "unknown key", "allowed keys", "steps", "margin", "n_ret"]),
    "unknown_key_model": ({"model.layers": 3}, ["model.layers", "allowed keys", "num_layers"]),
    "string_for_int": ({"train.steps": "many"}, ["train.steps", "integer", "many"]),
    "float_for_int": ({"train.steps": 2.5}, ["train.steps", "integer"]),
    "negative_margin": ({"train.margin": -0.1}, ["train.margin", "greater than or equal to 0", "-0.1"]),
    "K_zero": ({"train.K": 0}, ["train.K", "greater than or equal to 1"]),
    "n_ret_zero": ({"train.n_ret": 0}, ["train.n_ret", "greater than or equal to 1"]),
    "duplicate_seeds": ({"train.seeds": [0, 1, 1]}, ["train.seeds", "distinct", "[0, 1, 1]"]),
    "negative_seed": ({"train.seeds": [0, -1]}, ["train.seeds", "non-negative"]),
    "extra_seed_in_seeds": ({"train.extra_seeds": [2, 3]}, ["train.extra_seeds", "not in train.seeds", "[2, 3]"]),
    "extra_arm_not_run": ({"train.arms": ["base", "lopd"], "train.extra_arms": ["lopd", "sft"]},
                          ["train.extra_arms", "train.arms", "sft"]),
    "unknown_arm": ({"train.arms": ["lopd", "nope"]}, ["train.arms", "nope", "known arms", *ARMS]),
    "duplicate_arm": ({"train.arms": ["lopd", "lopd"]}, ["train.arms", "duplicates"]),
    "bad_literal_support": ({"train.support": "both"}, ["train.support", "'teacher'", "'student'", "'union'", "both"]),
    "bad_literal_arch": ({"model.arch": "bert"}, ["model.arch", "qwen3", "llama", "gpt2", "bert"]),
    "bad_literal_embedder": ({"bank.embedder": "bge"}, ["bank.embedder", "backbone", "minilm"]),
    "bad_on_failure": ({"tracking.on_failure": "ignore"}, ["tracking.on_failure", "warn", "fail"]),
    "heads_not_divisor": ({"model.hidden_size": 66}, ["model.hidden_size", "divisible", "num_heads"]),
    "kv_heads_not_divisor": ({"model.num_kv_heads": 3}, ["num_kv_heads", "divisible"]),
    "domains_empty": ({"envs.domains": []}, ["envs.domains", "non-empty", "tool", "code"]),
    "domains_unknown": ({"envs.domains": ["tool", "math"]}, ["envs.domains", "math", "'tool'", "'code'"]),
    "domains_dup": ({"envs.domains": ["tool", "tool"]}, ["envs.domains", "duplicates"]),
    "family_unknown": ({"envs.tool_families": ["bank", "atm"]}, ["envs.tool_families", "atm", "inventory"]),
    "max_turns_range": ({"envs.max_turns": 50}, ["envs.max_turns", "less than or equal to 20"]),
    "hpo_range": ({"hpo.n_ret_min": 4, "hpo.n_ret_max": 2}, ["hpo.n_ret_min", "hpo.n_ret_max"]),
    "hpo_k_choices_empty": ({"hpo.k_choices": []}, ["hpo.k_choices", "non-empty"]),
    "K_gt_k_max": ({"train.K": 32}, ["train.K", "32", "cold_start.k_max", "16"]),
    "n_ret_gt_max": ({"train.n_ret": 9}, ["train.n_ret", "cold_start.n_ret_max"]),
    "noise_range": ({"base.noise": 1.5}, ["base.noise", "less than or equal to 1"]),
    "lr_zero": ({"train.lr_student": 0}, ["train.lr_student", "greater than 0"]),
    "section_not_mapping": ({"train": 5}, ["train"]),
    "alpha_range": ({"report.alpha": 1.0}, ["report.alpha", "less than 1"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_params_exit_2(tmp_path, capsys, base_raw, name):
    change, needles = CASES[name]
    raw = _mod(base_raw, **{k: v for k, v in change.items() if "." in k})
    raw.update({k: v for k, v in change.items() if "." not in k})
    rc, out = _validate(tmp_path, capsys, raw)
    assert rc == 2, out
    assert out.startswith("error: "), out
    for n in needles:
        assert n in out, f"{n!r} not in message:\n{out}"
    assert "Traceback" not in out


def test_a_renamed_key_is_refused_naming_its_new_name(tmp_path, capsys, base_raw):
    """hpo.confirm_top/confirm_seeds (the search's reruns) and confirm.points (a list of slots) were renamed so that
    "confirm" means the confirmatory study only: an old file gets the new names, not "extra inputs"."""
    raw = {**base_raw, "hpo": {**base_raw["hpo"], "confirm_top": 4}, "confirm": {**base_raw["confirm"], "points": [0]}}
    rc, out = _validate(tmp_path, capsys, raw)
    assert rc == 2 and "hpo.confirm_top was renamed hpo.rerun_top" in out and "confirm.points was renamed confirm.slots" in out


def test_unknown_key_lists_exactly_allowed(tmp_path, capsys, base_raw):
    rc, out = _validate(tmp_path, capsys, _mod(base_raw, **{"envs.n_tran": 5}))
    assert rc == 2
    line = next(ln for ln in out.splitlines() if "envs.n_tran" in ln)
    allowed = line.split("allowed keys here:")[1].strip().split(", ")
    assert allowed == sorted(base_raw["envs"])  # exactly the section's keys (params.yaml lists them all)


def test_unknown_section_lists_sections(tmp_path, capsys, base_raw):
    rc, out = _validate(tmp_path, capsys, {**base_raw, "extra": {}})
    assert rc == 2
    line = next(ln for ln in out.splitlines() if "extra" in ln)
    allowed = set(line.split("allowed keys here:")[1].strip().split(", "))
    assert allowed == {"model", "envs", "tracking", "base", "evaluate", "bank", "cold_start", "probe", "train", "hpo",
                       "sensitivity", "report", "confirm", "launch"}


def test_several_errors_reported_together(tmp_path, capsys, base_raw):
    rc, out = _validate(tmp_path, capsys, _mod(base_raw, **{"train.K": 0, "train.margin": -1, "base.steps": "x"}))
    assert rc == 2
    for key in ("train.K", "train.margin", "base.steps"):
        assert key in out


def test_yaml_syntax_error(tmp_path, capsys):
    rc, out = _validate(tmp_path, capsys, "train:\n  steps: [1, 2\n  K: 4\n")
    assert rc == 2
    assert "not valid YAML" in out and "params.yaml" in out


def test_top_level_not_mapping(tmp_path, capsys):
    rc, out = _validate(tmp_path, capsys, "- a\n- b\n")
    assert rc == 2
    assert "mapping" in out


def test_missing_params_file(tmp_path, capsys):
    rc = main(["--params", str(tmp_path / "nope.yaml"), "validate"])
    out = capsys.readouterr().err
    assert rc == 2
    assert "params file not found" in out and "nope.yaml" in out


def test_missing_profile(tmp_path, capsys, base_raw):
    p = _write(tmp_path, base_raw)
    rc = main(["--params", str(p), "--profile", str(tmp_path / "smoke.yaml"), "validate"])
    out = capsys.readouterr().err
    assert rc == 2
    assert "profile not found" in out and "smoke.yaml" in out


def test_profile_merged_and_validated(tmp_path, capsys, base_raw):
    p = _write(tmp_path, base_raw)
    prof = tmp_path / "prof.yaml"
    prof.write_text("train:\n  K: 0\n")
    rc = main(["--params", str(p), "--profile", str(prof), "validate"])
    out = capsys.readouterr().err
    assert rc == 2 and "train.K" in out and "prof.yaml" in out
    prof.write_text("train:\n  steps: 3\n")
    assert main(["--params", str(p), "--profile", str(prof), "validate"]) == 0
    assert load_params(p, prof).train.steps == 3
    assert load_params(p, prof).train.K == base_raw["train"]["K"]  # the rest of the section kept


def test_parse_params_raises_badinput():
    with pytest.raises(BadInput) as ei:
        default_params({"train": {"K": 0}})
    assert ei.value.exit_code == 2
    assert default_params().train.K == yaml.safe_load((REPO / "params.yaml").read_text())["train"]["K"]


@pytest.mark.parametrize("cmd", [["prepare"], ["base"], ["bank"], ["cold-start"], ["train", "--arm", "lopd", "--seed", "0"],
                                 ["evaluate", "--arm", "lopd", "--seed", "0"], ["report"]])
def test_bad_params_write_nothing(tmp_path, monkeypatch, capsys, base_raw, cmd):
    monkeypatch.chdir(tmp_path)
    bad = _write(tmp_path, _mod(base_raw, **{"train.K": 0}))
    before = sorted(p.name for p in tmp_path.iterdir())
    rc = main(["--params", str(bad), *cmd])
    out = capsys.readouterr().err
    assert rc == 2 and "train.K" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == before == ["params.yaml"]
    assert not (tmp_path / "data").exists()


def test_prepare_with_valid_small_params_writes_splits(tmp_path, monkeypatch, capsys, base_raw):
    monkeypatch.chdir(tmp_path)
    good = _write(tmp_path, _mod(base_raw, **{"envs.n_train": 4, "envs.n_val": 4, "envs.n_test": 4}))
    assert main(["--params", str(good), "prepare"]) == 0
    assert (tmp_path / "data" / "splits" / "manifest.json").exists()


@pytest.mark.parametrize("argv,needles", [
    (["train", "--arm", "nope", "--seed", "0"], ["unknown arm 'nope'", "known arms", *ARMS]),
    (["evaluate", "--arm", "nope", "--seed", "0"], ["known arms"]),
    (["train", "--arm", "lopd", "--seed", "99"], ["seed 99", "train.seeds"]),
    (["evaluate", "--arm", "sft", "--seed", "5"], ["seed 5", "train.seeds"]),  # an extra seed of other arms only
], ids=["train-unknown-arm", "evaluate-unknown-arm", "train-seed-not-in-params", "extra-seed-of-another-arm"])
def test_cli_rejects_bad_arm_or_seed_before_anything_else(tmp_path, monkeypatch, capsys, base_raw, argv, needles):
    monkeypatch.chdir(tmp_path)
    # sft not among the extra arms (the default runs every arm on the extra seeds): its seed 5 is no seed of it
    good = _write(tmp_path, _mod(base_raw, **{"train.extra_arms": ["base", "lopd"]}))
    rc = main(["--params", str(good), *argv])
    out = capsys.readouterr().err
    assert rc == 2, out
    missing = [n for n in needles if n not in out]
    assert not missing, (missing, out)
    # checked before anything else is needed or written (no splits, no base model here)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_train_without_prepared_data(tmp_path, monkeypatch, capsys, base_raw):
    monkeypatch.chdir(tmp_path)
    good = _write(tmp_path, base_raw)
    rc = main(["--params", str(good), "train", "--arm", "sft", "--seed", "0"])
    out = capsys.readouterr().err
    assert rc == 2, out
    assert "base" in out  # names the missing input (the base model / stage to run first)


# ------------------------------------------------------------------ profiles and apply-profile


def test_apply_profile_missing_profile(tmp_path, monkeypatch, capsys, base_raw):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, base_raw)
    rc = main(["apply-profile", "missing.yaml", "--out", "out.yaml"])
    assert rc == 2 and "missing.yaml" in capsys.readouterr().err
    assert not (tmp_path / "out.yaml").exists()


def test_apply_profile_bad_yaml(tmp_path, monkeypatch, capsys, base_raw):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, base_raw)
    (tmp_path / "prof.yaml").write_text("train: [1,\n")
    rc = main(["apply-profile", "prof.yaml", "--out", "out.yaml"])
    assert rc == 2 and "prof.yaml" in capsys.readouterr().err


def test_apply_profile_invalid_result_writes_nothing(tmp_path, monkeypatch, capsys, base_raw):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, base_raw)
    (tmp_path / "prof.yaml").write_text("train:\n  K: 0\n")
    rc = main(["apply-profile", "prof.yaml", "--out", "out.yaml"])
    assert rc == 2 and "train.K" in capsys.readouterr().err
    assert not (tmp_path / "out.yaml").exists()
    (tmp_path / "prof.yaml").write_text("train:\n  K: 8\n")
    assert main(["apply-profile", "prof.yaml", "--out", "out.yaml"]) == 0
    assert yaml.safe_load((tmp_path / "out.yaml").read_text())["train"]["K"] == 8


def test_profile_not_a_mapping(tmp_path, capsys, base_raw):
    p = _write(tmp_path, base_raw)
    prof = tmp_path / "prof.yaml"
    prof.write_text("- 1\n- 2\n")
    rc = main(["--params", str(p), "--profile", str(prof), "validate"])
    assert rc == 2 and "prof.yaml" in capsys.readouterr().err


def test_profile_yaml_error_names_profile(tmp_path, capsys, base_raw):
    p = _write(tmp_path, base_raw)
    prof = tmp_path / "prof.yaml"
    prof.write_text("train: {K: [\n")
    rc = main(["--params", str(p), "--profile", str(prof), "validate"])
    out = capsys.readouterr().err
    assert rc == 2
    assert "prof.yaml" in out


def test_params_yaml_is_the_only_source_of_defaults():
    """The schema has types and ranges only: every key of every section must come from params.yaml."""
    from lopd.config import Params

    def with_default(model, prefix=""):
        for name, f in model.model_fields.items():
            if not f.is_required():
                yield prefix + name
            sub = getattr(f.annotation, "model_fields", None)
            if sub is not None:
                yield from with_default(f.annotation, prefix + name + ".")

    assert list(with_default(Params)) == []


# ------------------------------------------------------------------ descriptions and error messages


def test_every_key_has_a_description():
    """Every field of every section model (and every section of Params) says what it is."""
    from lopd.config import Params
    from lopd.config.messages import iter_fields

    fields = list(iter_fields(Params))
    keys = [k for k, _ in fields]
    assert "train.margin" in keys and "report.design.n_sim" in keys and "launch.resources.*.num_gpus" in keys
    missing = [k for k, f in fields if not (f.description or "").strip()]
    assert missing == [], f"fields without a description: {missing}"


def test_every_params_yaml_key_is_a_described_field(base_raw):
    """The walk above covers params.yaml: its keys are exactly the fields walked (a stage's name under
    launch.resources and an arm under hpo.search_axes stand for the free name ``*``)."""
    from lopd.config import Params
    from lopd.config.messages import iter_fields

    def leaves(d, prefix=""):
        for k, v in d.items():
            here = prefix + ("*" if prefix in ("launch.resources.", "hpo.search_axes.") else k)
            yield here
            if isinstance(v, dict):
                yield from leaves(v, here + ".")

    assert set(leaves(base_raw)) - {"launch.resources.*", "hpo.search_axes.*"} == {k for k, _ in iter_fields(Params)}


def test_unknown_key_error_lists_allowed_keys_with_descriptions(tmp_path, capsys, base_raw):
    from lopd.config import TrainParams

    rc, out = _validate(tmp_path, capsys, _mod(base_raw, **{"train.stepz": 3}))
    assert rc == 2
    assert "train.stepz: unknown key; allowed keys here:" in out
    assert "did you mean `steps`?" in out
    for key, field in TrainParams.model_fields.items():  # each allowed key with its description
        assert any(ln.split() and ln.split()[0] == key and field.description in ln for ln in out.splitlines()), key
    assert "lopd params" in out


def test_invalid_value_error_names_the_key_problem_and_description(tmp_path, capsys, base_raw):
    from lopd.config import TrainParams

    rc, out = _validate(tmp_path, capsys, _mod(base_raw, **{"train.K": 0}))
    assert rc == 2
    assert "train.K: Input should be greater than or equal to 1 (got 0)" in out
    assert f"train.K: {TrainParams.model_fields['K'].description}" in out


def test_nested_and_keyed_sections_are_described_in_errors(tmp_path, capsys, base_raw):
    from lopd.config import DesignParams, LaunchResources

    rc, out = _validate(tmp_path, capsys, _mod(base_raw, **{"report.design.n_sim": 3,
                                                             "launch.resources.train.num_gpu": 1}))
    assert rc == 2
    assert f"report.design.n_sim: {DesignParams.model_fields['n_sim'].description}" in out
    assert "launch.resources.train.num_gpu: unknown key; allowed keys here: num_cpus, num_gpus" in out
    assert LaunchResources.model_fields["num_gpus"].description in out


def test_launch_uses_the_same_error_formatter(tmp_path, base_raw):
    """lopd launch validates only its section, with the same messages (key, allowed keys, description)."""
    from lopd.config import LaunchParams
    from lopd.launch.main import load_launch_params

    p = _write(tmp_path, _mod(base_raw, **{"launch.max_retry": 1, "launch.keep_worktrees": "yes"}))
    with pytest.raises(BadInput) as ei:
        load_launch_params(p)
    msg = str(ei.value)
    assert "launch.max_retry: unknown key; allowed keys here: keep_worktrees, max_retries" in msg
    assert "did you mean `max_retries`?" in msg
    assert f"launch.keep_worktrees: {LaunchParams.model_fields['keep_worktrees'].description}" in msg
