"""Declared = read: every stage declares in dvc.yaml (written from lopd/stages/registry.py) exactly the
params keys it reads, and code deps that cover every ``lopd`` module it imports. The shared smoke pipeline
(``smoke_recorded``) runs every stage with ``LOPD_RECORD_DIR`` set, so each stage writes the params keys it
read and the ``lopd`` modules it imported; this test compares them with ``dvc.yaml`` and names the stage
and key on any difference. This is the check that the registry's declarations are true: its params lists
are written by hand, its code deps computed from the import graph (a superset of one run's imports).

The matrix stages declare their code and params through a fingerprint: they depend on the output
of a ``code_*`` stage (``lopd fingerprint``), whose deps are the code they run and whose params are
the keys they read. Their declared code and params are those. A ``code_*`` stage's own imports must
be among its deps too (so a change to the fingerprinting code reruns it), but it hashes its deps and
params rather than importing or reading them through the config, so a dep it does not import and a
key it does not record are not differences (an over-declared key is named for the matrix stage).
"""

from __future__ import annotations

import json

import yaml

from tests.conftest import REPO

# Read but not declared on purpose, because no output depends on them: where MLflow records runs.
UNDECLARED_OK = ("tracking.",)


def _expand_params(declared: list, all_keys: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for d in declared:
        d = str(d)
        out |= {f"{d}.{k}" for k in all_keys[d]} if d in all_keys else {d}
    return out


def _code_deps(deps: list) -> list[str]:
    return [str(d).rstrip("/") for d in deps if str(d).startswith("lopd")]


def _covered(module: str, deps: list[str]) -> bool:
    return any(module == d or module.startswith(d + "/") for d in deps)


def merged_by_stage(records: list[dict]) -> list[dict]:
    """One record per dvc.yaml stage: a matrix stage (``train@lopd``, ``train@base``, …) has one
    declaration, so what its items read together is what it must declare. An extra-seed stage
    (``bank_draw_extra@2``) is the same stage over more seeds (one YAML anchor; tests/e2e/test_pipeline.py
    checks the stanzas are identical), so its items count as items of its twin."""
    out: dict[str, dict] = {}
    for r in records:
        name = r["stage"].split("@")[0].removesuffix("_extra")
        m = out.setdefault(name, {"stage": name, "params": set(), "modules": set()})
        m["params"] |= set(r["params"])
        m["modules"] |= set(r["modules"])
    return [{**m, "params": sorted(m["params"]), "modules": sorted(m["modules"])} for m in out.values()]


def _out_paths(stage: dict) -> list[str]:
    return [str(next(iter(o))) if isinstance(o, dict) else str(o) for o in stage.get("outs") or []]


def fingerprint_stages(dvc: dict) -> dict[str, str]:
    """Fingerprint file -> the ``code_*`` stage that writes it."""
    return {out: name for name, st in dvc["stages"].items() if name.startswith("code_") for out in _out_paths(st)}


def stage_declarations(dvc: dict, name: str) -> dict:
    """What ``name`` declares: its params and deps, with each fingerprint file's params and code (those
    of the ``code_*`` stage that writes it) added. ``hashes_code``: a ``code_*`` stage itself."""
    base = name.split("@")[0]
    st = dvc["stages"][base]
    deps, params = list(st.get("deps") or []), list(st.get("params") or [])
    fps = fingerprint_stages(dvc)
    for code in [dvc["stages"][fps[str(dep)]] for dep in list(deps) if str(dep) in fps]:
        deps += code.get("deps") or []
        params += code.get("params") or []
    return {"params": params, "deps": deps, "hashes_code": base in fps.values()}


def compare(record: dict, decl: dict, all_keys: dict[str, list[str]]) -> list[str]:
    """Differences between what a stage read (record) and what dvc.yaml declares (decl)."""
    stage = record["stage"]
    declared = _expand_params(decl["params"], all_keys)
    read = {k for k in record["params"] if not k.startswith(UNDECLARED_OK)}
    problems = [f"{stage}: params key {k} is read but not declared" for k in sorted(read - declared)]
    if not decl.get("hashes_code"):  # a code_* stage hashes its params for its matrix stage, which reads them
        problems += [f"{stage}: params key {k} is declared but not read" for k in sorted(declared - read)]
    code = _code_deps(decl["deps"])
    mods = record["modules"]
    # code deps come from the static import graph (lopd/workflow/codegraph.py), which over-approximates what
    # one run imports (a branch this configuration never takes is still a dep): only a miss is a difference
    problems += [f"{stage}: module {m} is imported but not declared" for m in mods if not _covered(m, code)]
    return problems


def _all_keys() -> dict[str, list[str]]:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    return {sec: list(v) for sec, v in raw.items() if isinstance(v, dict)}


def test_every_stage_declares_exactly_what_it_reads(smoke_recorded):
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    records = sorted((smoke_recorded.records).glob("*.json"))
    stages = {json.loads(p.read_text())["stage"] for p in records}
    assert {"prepare", "base", "bank", "cold_start", "probe", "hpo", "sensitivity", "report", "code_train",
            "code_evaluate"} <= stages
    for kind in ("train@", "evaluate@", "bank_draw@", "cold_start_draw@",
                 "bank_draw_extra@", "cold_start_draw_extra@"):
        assert any(s.startswith(kind) for s in stages), kind
    problems = []
    for rec in merged_by_stage([json.loads(p.read_text()) for p in records]):
        problems += compare(rec, stage_declarations(dvc, rec["stage"]), _all_keys())
    assert not problems, "dvc.yaml declarations differ from what the stages read:\n" + "\n".join(problems)


def test_the_comparison_catches_a_removed_declaration():
    """The check can fail: drop a declared key or code dep and it is named."""
    keys = {"model": ["lora_r", "hidden_size"], "train": ["steps"]}
    rec = {"stage": "train@lopd-0", "params": ["model.lora_r", "model.hidden_size", "train.steps", "tracking.uri"],
           "modules": ["lopd/training/trainer.py", "lopd/cli.py"]}
    ok = {"params": ["model", "train.steps"], "deps": ["lopd/training/trainer.py", "lopd/cli.py"]}
    assert compare(rec, ok, keys) == []
    missing_key = {"params": ["model.hidden_size", "train.steps"], "deps": ok["deps"]}
    assert compare(rec, missing_key, keys) == ["train@lopd-0: params key model.lora_r is read but not declared"]
    extra_key = {"params": ["model", "train.steps", "train.K"], "deps": ok["deps"]}
    assert compare(rec, extra_key, {**keys, "train": ["steps", "K"]}) == [
        "train@lopd-0: params key train.K is declared but not read"]
    missing_code = {"params": ok["params"], "deps": ["lopd/cli.py"]}
    assert compare(rec, missing_code, keys) == ["train@lopd-0: module lopd/training/trainer.py is imported but not declared"]


def test_the_comparison_follows_a_fingerprint_to_its_code_stage():
    """A matrix stage's code and params are declared in the ``code_*`` stage whose output it depends
    on: an entry removed there (or one too many) is named for the stage that reads it; the code stage
    itself must cover its own imports but need not import all it hashes nor read the params."""
    keys = {"train": ["steps", "K"]}
    dvc = {"stages": {
        "code_train": {"cmd": "lopd fingerprint code_train", "deps": ["lopd/cli.py", "lopd/training", "lopd/utils.py"],
                       "params": ["train.steps"], "outs": [{"fingerprints/train.json": {"cache": False}}]},
        "train": {"matrix": {"arm": ["lopd"], "seed": [0]}, "cmd": "lopd train --arm ${item.arm} --seed ${item.seed}",
                  "deps": ["data/splits/train.jsonl", "fingerprints/train.json"]}}}
    rec = {"stage": "train@lopd-0", "params": ["train.steps"],
           "modules": ["lopd/cli.py", "lopd/training/trainer.py", "lopd/utils.py"]}
    code_rec = {"stage": "code_train", "params": [], "modules": ["lopd/cli.py", "lopd/utils.py"]}
    assert compare(rec, stage_declarations(dvc, "train"), keys) == []
    assert compare(code_rec, stage_declarations(dvc, "code_train"), keys) == []  # lopd/training, train.steps: hashed only
    dvc["stages"]["code_train"]["params"].append("train.K")
    assert compare(rec, stage_declarations(dvc, "train"), keys) == [
        "train@lopd-0: params key train.K is declared but not read"]
    dvc["stages"]["code_train"]["params"] = []
    assert compare(rec, stage_declarations(dvc, "train"), keys) == [
        "train@lopd-0: params key train.steps is read but not declared"]
    dvc["stages"]["code_train"]["params"] = ["train.steps"]
    dvc["stages"]["code_train"]["deps"].remove("lopd/training")
    assert compare(rec, stage_declarations(dvc, "train"), keys) == [
        "train@lopd-0: module lopd/training/trainer.py is imported but not declared"]
    dvc["stages"]["code_train"]["deps"].remove("lopd/utils.py")
    assert compare(code_rec, stage_declarations(dvc, "code_train"), keys) == [
        "code_train: module lopd/utils.py is imported but not declared"]
    # without the fingerprint dep, the matrix stage declares no code and no params at all
    dvc["stages"]["train"]["deps"].remove("fingerprints/train.json")
    assert compare(rec, stage_declarations(dvc, "train"), keys) == (
        ["train@lopd-0: params key train.steps is read but not declared"]
        + [f"train@lopd-0: module {m} is imported but not declared" for m in rec["modules"]])


def test_a_recording_warm_worker_preloads_no_lopd_code():
    """While reads are recorded, the warm worker (``python -m lopd.warm``) preloads the libraries only:
    a ``lopd`` module it imported would show in every stage's record, declared or not (the full
    preload, ``own=True``, what ``make repro``'s worker does, imports most of ``lopd``)."""
    import subprocess
    import sys

    probe = ("import sys; from lopd.warm import _preload; _preload(own=False); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lopd'))")
    lean = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert lean.returncode == 0, lean.stderr
    assert lean.stdout.split("\n")[-2] == "['lopd', 'lopd.warm']", lean.stdout
