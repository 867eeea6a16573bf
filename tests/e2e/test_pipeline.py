"""The DVC pipeline: structure checks on dvc.yaml and one end-to-end ``dvc repro`` on the
smoke profile in a scratch copy of the repository."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, REPO, run_cmd


def _stage_deps(dvc: dict) -> dict[str, list[str]]:
    return {name: [str(d) for d in (st.get("deps") or [])] for name, st in dvc["stages"].items()}


def _reads_test(dep: str) -> bool:
    d = dep.rstrip("/")
    return d.endswith("test.jsonl") or d in ("data", "data/splits")


def test_only_evaluate_depends_on_the_test_split():
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    offenders = {s: [d for d in deps if _reads_test(d)] for s, deps in _stage_deps(dvc).items()}
    offenders = {s: d for s, d in offenders.items() if d and s not in ("evaluate", "evaluate_extra")}
    assert not offenders, f"stages other than evaluate depend on the test split: {offenders}"
    assert any(_reads_test(d) for d in _stage_deps(dvc)["evaluate"]), "evaluate must read the test split"
    for kind in ("bank_draw", "cold_start_draw"):  # the extra-seed stages: the same over other seeds
        extra = dvc["stages"][f"{kind}_extra"]
        assert {k: v for k, v in extra.items() if k != "matrix"} == {
            k: v for k, v in dvc["stages"][kind].items() if k != "matrix"}, kind


# the run matrix: a fingerprint holding it would rerun every arm's items when an arm is added
MATRIX_KEYS = ("train", "train.arms", "train.seeds", "train.extra_arms", "train.extra_seeds")
# what a train/evaluate item declares itself: the seeds it runs (every seed of its arm, one population)
SEED_KEYS = ["train.seeds", "train.extra_arms", "train.extra_seeds"]


def test_matrix_stages_declare_their_code_through_one_fingerprint():
    """train/evaluate depend on the output of code_train/code_evaluate, which holds the code list and
    the params list; they list no code themselves (their data deps stay theirs) and no params but
    the seeds of their arm. The fingerprint is a small uncached file that git ignores, written by
    `lopd fingerprint <its own stage>`, and its params leave out the run matrix."""
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    ignored = (REPO / ".gitignore").read_text().split()
    for kind in ("train", "evaluate"):
        code = dvc["stages"][f"code_{kind}"]
        assert code["cmd"] == f"lopd fingerprint code_{kind}" and "matrix" not in code
        assert code["params"] and not set(map(str, code["params"])) & set(MATRIX_KEYS), code["params"]
        [out] = code["outs"]
        [path] = out
        assert out[path] == {"cache": False} and f"/{path.split('/')[0]}/" in ignored, out
        assert all(str(d).startswith("lopd") for d in code["deps"])
        deps = [str(d) for d in dvc["stages"][kind]["deps"]]
        assert path in deps and not [d for d in deps if d.startswith("lopd")], kind
        assert list(map(str, dvc["stages"][kind]["params"])) == SEED_KEYS, kind
        assert f"{kind}_extra" not in dvc["stages"], "every seed of an arm is one stage item"


def _fingerprint_ws(root: Path, deps: list[str], params: list[str] | None = None) -> Path:
    (root / "lopd" / "sub" / "__pycache__").mkdir(parents=True)
    (root / "lopd" / "a.py").write_text("a = 1\n")
    (root / "lopd" / "sub" / "b.py").write_text("b = 2\n")
    (root / "lopd" / "sub" / "b.pyc").write_bytes(b"bytecode")
    (root / "lopd" / "sub" / "__pycache__" / "b.cpython-312.pyc").write_bytes(b"bytecode")
    (root / "params.yaml").write_text("{}\n")
    stanza = {"cmd": "lopd fingerprint code_x", "deps": deps, "outs": [{"fp/x.json": {"cache": False}}]}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"code_x": {**stanza, **({"params": params} if params else {})}}}))
    return root


def test_fingerprint_hashes_the_files_its_stanza_declares(tmp_path, monkeypatch, capsys):
    import hashlib

    from lopd.cli import run_in_process

    monkeypatch.delenv("LOPD_ROOT", raising=False)
    monkeypatch.delenv("LOPD_RECORD_DIR", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    root = _fingerprint_ws(tmp_path, ["lopd/a.py", "lopd/sub"])
    assert run_in_process(["--params", str(root / "params.yaml"), "fingerprint", "code_x"]) == 0
    out = root / "fp" / "x.json"
    first = out.read_bytes()
    fp = json.loads(first)
    sha = {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in ("lopd/a.py", "lopd/sub/b.py")}
    assert fp["files"] == sha and list(fp["files"]) == sorted(sha)  # bytecode and __pycache__ skipped
    assert fp["sha256"] == hashlib.sha256("".join(f"{h}  {f}\n" for f, h in sha.items()).encode()).hexdigest()
    assert [p.name for p in out.parent.iterdir()] == ["x.json"]  # no temp file left
    assert run_in_process(["--params", str(root / "params.yaml"), "fingerprint", "code_x"]) == 0
    assert out.read_bytes() == first  # deterministic
    (root / "lopd" / "sub" / "b.py").write_text("b = 3\n")
    assert run_in_process(["--params", str(root / "params.yaml"), "fingerprint", "code_x"]) == 0
    assert json.loads(out.read_text())["sha256"] != fp["sha256"]
    capsys.readouterr()
    # a declared file that is missing, and an unknown stage: bad input (exit 2) naming it
    (root / "lopd" / "a.py").unlink()
    assert run_in_process(["--params", str(root / "params.yaml"), "fingerprint", "code_x"]) == 2
    err = capsys.readouterr().err
    assert "code_x" in err and "lopd/a.py" in err and "not found" in err
    assert run_in_process(["--params", str(root / "params.yaml"), "fingerprint", "code_y"]) == 2
    assert "no stage 'code_y'" in capsys.readouterr().err


def test_fingerprint_hashes_the_values_of_its_declared_params(tmp_path, monkeypatch, capsys):
    """The fingerprint holds the value of each declared key (a bare section: the whole section) and its
    hash covers them, after the files' lines: a declared value changes it, an undeclared one does not;
    a declared key missing from params.yaml is bad input naming it."""
    import hashlib

    from lopd.cli import run_in_process

    for var in ("LOPD_ROOT", "LOPD_RECORD_DIR", "DVC_ROOT"):
        monkeypatch.delenv(var, raising=False)
    root = _fingerprint_ws(tmp_path, ["lopd/a.py"], ["train.lr", "evaluate"])
    raw = {"train": {"lr": 0.002, "seeds": [0, 1], "steps": 3}, "evaluate": {"greedy": False, "n": 4}}
    pfile = root / "params.yaml"
    pfile.write_text(yaml.safe_dump(raw))
    out = root / "fp" / "x.json"

    def fingerprint() -> dict:
        assert run_in_process(["--params", str(pfile), "fingerprint", "code_x"]) == 0
        return json.loads(out.read_text())

    fp = fingerprint()
    assert fp["params"] == {"evaluate": {"greedy": False, "n": 4}, "train.lr": 0.002}
    a = hashlib.sha256((root / "lopd/a.py").read_bytes()).hexdigest()
    lines = f"{a}  lopd/a.py\n"
    lines += hashlib.sha256(b'{"greedy": false, "n": 4}').hexdigest() + "  params.yaml:evaluate\n"
    lines += hashlib.sha256(b"0.002").hexdigest() + "  params.yaml:train.lr\n"
    assert fp["sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    for section, key, value, changes in (("train", "seeds", [0, 1, 2], False), ("train", "steps", 4, False),
                                         ("train", "lr", 0.004, True), ("evaluate", "n", 8, True)):
        raw[section][key] = value
        pfile.write_text(yaml.safe_dump(raw))
        new = fingerprint()
        assert (new["sha256"] != fp["sha256"]) == changes, (section, key)
        fp = new
    capsys.readouterr()
    del raw["train"]["lr"]
    pfile.write_text(yaml.safe_dump(raw))
    assert run_in_process(["--params", str(pfile), "fingerprint", "code_x"]) == 2
    err = capsys.readouterr().err
    assert "code_x" in err and "train.lr" in err and "not in" in err


def test_detector_catches_a_test_dependency():
    """The check above can fail: a stage depending on test.jsonl or the whole splits dir is caught."""
    bad = {"stages": {"hpo": {"deps": ["data/splits/val.jsonl", "data/splits/test.jsonl"]},
                      "bank": {"deps": ["data/splits"]}}}
    found = {s for s, deps in _stage_deps(bad).items() if any(_reads_test(d) for d in deps)}
    assert found == {"hpo", "bank"}


def test_train_and_evaluate_matrix_cover_every_arm_and_seed():
    from lopd.arms import ARMS
    from lopd.config import load_params

    p = load_params(REPO / "params.yaml")
    assert set(p.train.arms) == set(ARMS), "the default profile runs every arm"
    rule = p.report.rule
    for arm in {rule.treatment, *rule.gain_over, *rule.content_controls}:  # the rule's arms need >= 10 seeds
        assert len(p.train.seeds_of(arm)) >= 10, arm
    # the search: at least 16 trial runs (12 trials x 2 seeds), at the final runs' horizon, CRN validation
    assert p.hpo.n_trials * p.hpo.seeds_per_trial >= 16 and p.hpo.seeds_per_trial >= 2
    assert (p.hpo.steps or p.train.steps) == p.train.steps and (p.sensitivity.steps or p.train.steps) == p.train.steps
    assert p.train.steps * p.train.tasks_per_step >= 1536 and p.train.val_samples_per_task >= 2
    assert max(p.hpo.margin_choices) >= 0.5
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    for stage in ("train", "evaluate"):  # an item per arm, running train.seeds_of(arm)
        assert dvc["stages"][stage]["matrix"] == {"arm": "${train.arms}"}
        assert "--seed" not in dvc["stages"][stage]["cmd"]


def _ran(stdout: str) -> list[str]:
    return [ln.split("'")[1] for ln in stdout.splitlines() if ln.startswith("Running stage")]


def _copy(smoke, dst: Path) -> Path:
    """A copy of a finished smoke workspace (DVC cache included) to mutate without disturbing others."""
    import shutil

    shutil.copytree(smoke.repo, dst, symlinks=True)
    return dst


def test_dvc_repro_smoke_end_to_end(smoke_recorded):
    repo = smoke_recorded.repo
    print(f"smoke dvc repro: {smoke_recorded.seconds:.0f} s")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    arms, seeds = params["train"]["arms"], params["train"]["seeds"]
    expected = ["data/splits/manifest.json", "models/base/model/config.json", "models/bank/manifest.json",
                "models/cold_start/phi0.safetensors", "results/probe/result.json", "hpo/best_params.yaml",
                "hpo/trials.csv", "results/sensitivity/grid.csv", "reports/summary.json",
                "reports/main_table.md", "reports/falsification.md", "reports/leakage_audit.md",
                "reports/figures/margin_dynamics.png"]
    extra = params["train"]["extra_arms"]
    # lopd_binding runs at the best trial whose margin binds; in a 2-step search no run is long enough to tell
    # (status "too short"), so it is recorded not run, with the reason, by train and evaluate alike
    not_run = {a for a in arms if a == "lopd_binding"}
    assert not_run, "the smoke profile no longer exercises the not-run path"
    for a in not_run:
        why = json.loads((repo / f"runs/{a}/not_run.json").read_text())["reason"]
        assert json.loads((repo / f"results/eval/{a}/not_run.json").read_text())["reason"] == why
        assert why.startswith("no completed trial's margin binds"), why
        assert not list((repo / f"runs/{a}").glob("seed-*")) and not list((repo / f"results/eval/{a}").glob("seed-*"))
        assert f"{a} is not run: {why}" in (repo / "reports/search.md").read_text()
        assert f"{a} not run: {why}" in (repo / "reports/falsification.md").read_text()
    for a in [a for a in arms if a not in not_run]:
        for s in [*seeds, *(params["train"]["extra_seeds"] if a in extra else [])]:
            run, ev = f"runs/{a}/seed-{s}", f"results/eval/{a}/seed-{s}"
            expected += [f"{run}/result.json", f"{run}/history.csv", f"{run}/student.safetensors",
                         f"{run}/splits_read.json", f"{ev}/result.json", f"{ev}/per_task.json"]
    final_seeds = [*seeds, *params["train"]["extra_seeds"]]
    expected += [f"models/draws/{f}" for s in final_seeds for f in (f"bank-{s}/manifest.json",
                                                                   f"cold_start-{s}/phi0.safetensors")]
    missing = [e for e in expected if not (repo / e).exists()]
    assert not missing, f"missing outputs: {missing}"
    # train.per_seed_draws (default): every final seed has its own bank and φ0 draw, none the shared one
    assert params["train"]["per_seed_draws"] is True
    phi0 = [(repo / f"models/draws/cold_start-{s}/phi0.safetensors").read_bytes() for s in final_seeds]
    phi0.append((repo / "models/cold_start/phi0.safetensors").read_bytes())
    assert len(set(phi0)) == len(phi0), "two upstream draws share their φ0"
    seeds_used = [json.loads((repo / f"models/draws/bank-{s}/manifest.json").read_text())["seed"] for s in final_seeds]
    assert len(set(seeds_used)) == len(final_seeds) and params["bank"]["seed"] not in seeds_used, seeds_used
    summary = json.loads((repo / "reports/summary.json").read_text())
    assert set(summary["test_reward"]) == set(arms) - not_run
    # every finished trial of the search kept its margin path (β and Δ(φ) by step, per seed)
    with open(repo / "hpo/trials.csv", newline="") as f:
        trials = {r["number"] for r in csv.DictReader(f)}
    with open(repo / "hpo/margin_paths.csv", newline="") as f:
        paths = list(csv.DictReader(f))
    assert {r["trial"] for r in paths} == trials and all(r["beta"] != "" for r in paths)
    assert "## What the margin did" in (repo / "reports/search.md").read_text()
    # the confirmation: registered before its split is read, every slot of S trained or recorded empty, the
    # confirmatory verdict opening falsification.md with the registration's hash, the pilot after it
    reg = json.loads((repo / "registration/registration.json").read_text())
    fal = (repo / "reports/falsification.md").read_text()
    assert fal.index(reg["sha256"]) < fal.index("## Confirmatory verdict") < fal.index("## Specification curve") \
        < fal.index("# Pilot (exploratory)")
    assert reg["seeds"] == params["confirm"]["seeds"] and 1 <= len(reg["points"]) <= len(params["confirm"]["slots"])
    for slot in params["confirm"]["slots"]:
        runs = repo / f"confirm/runs/p{slot}"
        assert json.loads((runs / "registration.json").read_text())["sha256"] == reg["sha256"]
        assert (runs / "not_run.json").exists() == (slot >= len(reg["points"]))
    evals = sorted((repo / "confirm/eval").glob("*/*/seed-*/result.json"))
    # each point's trained arms (less any run an earlier point trains), base and the efficiency baseline at slot 0
    from lopd.confirmation.registration import trained_at

    assert len(evals) == sum(len(trained_at(reg, i)) for i in range(len(reg["points"]))) * len(reg["seeds"])
    assert {"base", params["confirm"]["efficiency_baseline"], *reg["arms"]["trained"]} <= set(trained_at(reg, 0))
    eff = reg["efficiency"]
    assert eff["baseline"] == params["confirm"]["efficiency_baseline"] and eff["steps"] == [1]  # 2 steps: after 1
    snaps = sorted((repo / "confirm/eval").glob("*/*/seed-*/snapshots/step-*/result.json"))
    assert len(snaps) == 2 * len(eff["steps"]) * len(reg["seeds"])  # lopd at the selected point and the baseline
    assert all(json.loads(p.read_text())["splits_read"] == [{"split": "confirm", "role": "confirm_evaluate",
               "sha256": reg["confirm_split"]["sha256"]}] for p in [*evals, *snaps])
    assert "## On the confirmatory split (registered)" in (repo / "reports/efficiency.md").read_text()
    assert summary["confirmation"]["registration_sha256"] == reg["sha256"] and summary["confirmation"]["label"]
    assert (repo / "reports/figures/spec_curve.png").exists()
    assert summary["leakage_clean"] and summary["leakage_violations"] == 0
    # MLflow: one tree per experiment, the report on its parent, no run left RUNNING
    from tests.e2e.test_tracking_tree import assert_one_tree

    runs = assert_one_tree(f"sqlite:///{repo / 'mlflow.db'}", params["tracking"]["experiment"],
                           ["reports/main_table.md", "reports/falsification.md", "reports/metrics/verdict/claim.json",
                            "reports/figures/learning_curves.png"])
    assert len(runs) >= 2 * len(set(arms) - not_run) * len(seeds), len(runs)  # a train and an eval run per job
    assert {r.info.status for r in runs.values()} == {"FINISHED"}, {r.info.run_name: r.info.status for r in runs.values()}
    st = run_cmd([str(BIN / "dvc"), "status"], repo, 120)
    assert st.returncode == 0 and "up to date" in st.stdout, st.stdout
    again = run_cmd([str(BIN / "dvc"), "repro"], repo, 300)
    assert again.returncode == 0
    assert "Running stage" not in again.stdout, f"a second repro re-ran stages:\n{again.stdout}"


def test_a_stage_in_its_own_process_writes_what_the_warm_fork_wrote(smoke_recorded, tmp_path):
    """Outputs do not depend on the warm worker: ``lopd train`` run in its own fresh process
    (outside DVC, no worker) rewrites the LOPD population that the smoke repro's forked stage wrote,
    byte for byte (the kill-anywhere chain compares the two warm modes, library-only and full preload)."""
    import filecmp
    import shutil

    repo = _copy(smoke_recorded, tmp_path / "repo")
    shutil.rmtree(repo / "runs/lopd")
    r = run_cmd([str(BIN / "lopd"), "train", "--arm", "lopd"], repo, 600, LOPD_WARM="0",
                DVC_ROOT=None, LOPD_RECORD_DIR=None)
    assert r.returncode == 0, r.stderr[-3000:]
    ref, got = smoke_recorded.repo / "runs/lopd", repo / "runs/lopd"
    files = sorted(str(f.relative_to(ref)) for f in ref.rglob("*") if f.is_file())
    assert files == sorted(str(f.relative_to(got)) for f in got.rglob("*") if f.is_file()), files
    assert "seed-0/student.safetensors" in files and "seed-1/student.safetensors" in files, files
    match, mismatch, errors = filecmp.cmpfiles(ref, got, files, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)


@pytest.mark.slow
def test_changing_lora_r_reruns_every_stage_that_reads_it(smoke_recorded, tmp_path):
    repo = _copy(smoke_recorded, tmp_path / "repo")
    readers = set()
    for rec in smoke_recorded.records.glob("*.json"):
        r = json.loads(rec.read_text())
        if "model.lora_r" in r["params"]:
            readers.add(r["stage"])
    assert {"cold_start", "hpo", "probe"} <= readers and any(s.startswith("train@") for s in readers)
    before = {p: p.read_bytes() for s in readers if s.startswith("train@")
              for p in sorted((repo / f"runs/{s.split('@')[1]}").glob("seed-*/student.safetensors"))}
    assert before
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["model"]["lora_r"] = params["model"]["lora_r"] // 2
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = run_cmd([str(BIN / "dvc"), "repro"], repo, 1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = set(_ran(r.stdout))
    assert readers <= ran, f"stages that read model.lora_r but were not rerun: {sorted(readers - ran)}"
    for p, old in before.items():
        assert p.read_bytes() != old, p


def test_adding_a_seed_reruns_each_arms_population_and_nothing_upstream(smoke_recorded, tmp_path):
    """One more seed in train.seeds: its upstream draw (bank and cold start), every arm's train and
    evaluate stage (each arm's seeds train as one population) and the report run, nothing else. The
    existing seeds train as they did: a member's run does not depend on who shares its batch, to the
    tolerances of tests/integration/test_population.py (not to the bit: other batches are other kernel calls)."""
    import csv

    repo = _copy(smoke_recorded, tmp_path / "repo")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    arms, new = params["train"]["arms"], max(params["train"]["seeds"] + params["train"]["extra_seeds"]) + 1
    params["train"]["seeds"] = [*params["train"]["seeds"], new]
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    def losses(path):
        return [float(r["loss"]) for r in csv.DictReader(path.open()) if r.get("loss")]

    old = {p: losses(p) for p in sorted((repo / "runs").glob("*/seed-*/history.csv"))}
    assert old and any(old.values())
    r = run_cmd([str(BIN / "dvc"), "repro"], repo, 900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    want = {f"train@{a}" for a in arms} | {f"evaluate@{a}" for a in arms} | {"report"}
    want |= {f"bank_draw@{new}", f"cold_start_draw@{new}"}
    # register reads the pilot's results (its design); with the smoke's pilot too small for a design, the
    # registration it writes is the same, so the confirmation does not rerun
    want |= {"register"}
    assert set(_ran(r.stdout)) == want, sorted(set(_ran(r.stdout)) ^ want)
    ran = [a for a in arms if not (repo / f"runs/{a}/not_run.json").exists()]  # lopd_binding: no point in smoke
    assert ran and all((repo / f"runs/{a}/seed-{new}/result.json").exists() for a in ran)
    for p, before in old.items():
        assert losses(p) == pytest.approx(before, rel=1e-4, abs=1e-5), p


def test_a_code_change_reruns_its_stage_kind_through_the_fingerprint(smoke_recorded, tmp_path):
    """A change to a file only code_train lists: code_train is out of date; once it has rerun, its new
    fingerprint puts every train item (and train_extra item) out of date and nothing else. A
    fingerprint rerun on unchanged code changes nothing downstream."""
    repo = _copy(smoke_recorded, tmp_path / "repo")

    def status() -> set[str]:
        r = run_cmd([str(BIN / "dvc"), "status", "--json"], repo, 300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return set(json.loads(r.stdout or "{}"))

    (repo / "fingerprints" / "evaluate.json").unlink()  # uncached: rewritten with the same bytes
    r = run_cmd([str(BIN / "dvc"), "repro", "code_evaluate"], repo, 300)
    assert r.returncode == 0 and _ran(r.stdout) == ["code_evaluate"], r.stdout[-3000:] + r.stderr[-3000:]
    assert status() == set()
    with open(repo / "lopd" / "stages" / "train.py", "a") as f:
        f.write("# a code change\n")
    assert status() == {"code_train"}
    r = run_cmd([str(BIN / "dvc"), "repro", "code_train"], repo, 300)
    assert r.returncode == 0 and _ran(r.stdout) == ["code_train"], r.stdout[-3000:] + r.stderr[-3000:]
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    train = {s for s in lock if s.startswith(("train@", "train_extra@"))}
    assert train and status() == train


def _declaring(dvc: dict, section: str, key: str) -> set[str]:
    """The stages of dvc.yaml that declare ``section.key`` (or the whole section) as a param."""
    return {n for n, st in dvc["stages"].items() if {section, f"{section}.{key}"} & set(map(str, st.get("params") or []))}


def test_a_param_change_reruns_its_stage_kind_through_the_fingerprint(smoke_recorded, tmp_path):
    """The matrix items declare their params through their code stage. A train param (train.lr_student)
    puts out of date the stages declaring it, code_train among them, and once code_train has rerun,
    every train item and no evaluate item; an evaluate-only param (evaluate.samples_per_task), only
    code_evaluate, then every evaluate item and no train item."""
    repo = _copy(smoke_recorded, tmp_path / "repo")
    dvc = yaml.safe_load((repo / "dvc.yaml").read_text())
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    items = {kind: {s for s in lock if s.startswith((f"{kind}@", f"{kind}_extra@"))} for kind in ("train", "evaluate")}
    assert items["train"] and items["evaluate"]

    def status() -> set[str]:
        r = run_cmd([str(BIN / "dvc"), "status", "--json"], repo, 300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return set(json.loads(r.stdout or "{}"))

    for section, key, kind in (("train", "lr_student", "train"), ("evaluate", "samples_per_task", "evaluate")):
        names = _declaring(dvc, section, key)
        assert f"code_{kind}" in names and not {"train", "evaluate"} & names, names
        # a matrix stage declaring the key itself (confirm_train) is out of date item by item
        direct = {i for n in names for i in ({s for s in lock if s.split("@")[0] == n} or {n})}
        params = yaml.safe_load((repo / "params.yaml").read_text())
        params[section][key] = params[section][key] * 2
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        assert status() == direct, (key, direct)
        r = run_cmd([str(BIN / "dvc"), "repro", f"code_{kind}"], repo, 300)
        assert r.returncode == 0 and _ran(r.stdout) == [f"code_{kind}"], r.stdout[-3000:] + r.stderr[-3000:]
        assert status() == (direct - {f"code_{kind}"}) | items[kind], key
        r = run_cmd([str(BIN / "dvc"), "commit", "-f"], repo, 300)  # take the change as done: next key
        assert r.returncode == 0 and status() == set(), r.stdout[-3000:] + r.stderr[-3000:]


def test_report_param_reruns_only_report_and_exp_run_resumes_the_search(smoke_recorded, tmp_path):
    repo = _copy(smoke_recorded, tmp_path / "repo")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["report"]["n_boot"] = params["report"]["n_boot"] + 1
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    rep = run_cmd([str(BIN / "dvc"), "repro"], repo, 300)
    assert rep.returncode == 0, rep.stdout[-3000:] + rep.stderr[-3000:]
    assert _ran(rep.stdout) == ["report"]

    # `dvc exp run -S hpo.n_trials=...` resumes the study: the finished trials are kept, one is added (then
    # the boundary rule's extensions start again from the n + 1 trials)
    n = params["hpo"]["n_trials"]
    before = (repo / "hpo/trials.csv").read_text().splitlines()[:1 + n]
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "smoke"]):
        r = run_cmd(cmd, repo, 60)
        assert r.returncode == 0, r.stderr
    exp = run_cmd([str(BIN / "dvc"), "exp", "run", "hpo", "-S", f"hpo.n_trials={n + 1}"], repo, 600)
    assert exp.returncode == 0, exp.stdout[-3000:] + exp.stderr[-3000:]
    states = json.loads((repo / "hpo/result.json").read_text())["trial_states"]
    rule = json.loads((repo / "hpo/selection.json").read_text())["boundary_rule"]
    assert not rule["extensions"] or rule["extensions"][0]["after_trials"] == n + 1, rule
    after = (repo / "hpo/trials.csv").read_text().splitlines()
    assert states["COMPLETE"] + states["PRUNED"] == len(after) - 1 >= n + 1, states
    # each kept trial's number, state, value and point (its CI, confirmation and ties move with the new trials)
    keep = lambda rows: [r.split(",")[:3] + r.split(",")[-4:] for r in rows]  # noqa: E731
    assert keep(after[:len(before)]) == keep(before), (before, after)


@pytest.mark.slow
def test_plots_diff_overlays_two_experiments(smoke_recorded, tmp_path):
    """`dvc exp run -S train.lr_student=...` then `dvc plots diff`: one HTML page whose learning
    curves carry both revisions."""
    repo = _copy(smoke_recorded, tmp_path / "repo")
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "smoke"]):
        r = run_cmd(cmd, repo, 60)
        assert r.returncode == 0, r.stderr
    lr = yaml.safe_load((repo / "params.yaml").read_text())["train"]["lr_student"]
    exp = run_cmd([str(BIN / "dvc"), "exp", "run", "-n", "lr2x", "-S", f"train.lr_student={2 * lr}"], repo, 900)
    assert exp.returncode == 0, exp.stdout[-3000:] + exp.stderr[-3000:]
    out = tmp_path / "plots"
    r = run_cmd([str(BIN / "dvc"), "plots", "diff", "HEAD", "lr2x", "-o", str(out)], repo, 300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    html = (out / "index.html").read_text()
    # the learning-curves plot itself (its own div and vega spec): declared title, and val_reward points
    # of both revisions in its data
    from lopd.analysis.plotdata import plot_declarations

    decl = next(d["learning_curves"] for d in plot_declarations() if "learning_curves" in d)
    spec = _vega_spec(html, "learning_curves")
    assert spec["title"] == decl["title"]
    points = [p for p in spec["data"]["values"] if p.get("val_reward") not in (None, "")]
    assert {p["rev"] for p in points} == {"HEAD", "lr2x"}, "a revision's learning curves are missing"


def _vega_spec(html: str, plot_id: str) -> dict:
    """The vega spec dvc_render embeds for one plot: ``<div id = "<id>"> ... var spec = {...};``."""
    import re

    m = re.search(r'<div id = "' + re.escape(plot_id) + r'">\s*<script type = "text/javascript">\s*var spec = '
                  r"(\{.*?\});\s*vegaEmbed\('#" + re.escape(plot_id) + "'", html, re.S)
    assert m, f"no plot {plot_id!r} in the page"
    return json.loads(m.group(1))


def test_dvc_yaml_plots_match_the_report_declarations():
    """The plots dvc.yaml declares are the ones the report writes data for (same files and fields)."""
    from lopd.analysis.plotdata import plot_declarations

    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    assert dvc["plots"] == plot_declarations()
