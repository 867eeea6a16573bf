"""The final runs' upstream draws (``train.per_seed_draws``) and ``bench/upstream.py``.

* ``upstream_seed``: with per-seed draws every seed's bank and cold-start seed differs from the others and
  from the shared draw's; without, every draw is seeded as the shared one.
* Without per-seed draws, ``lopd bank --draw s`` and ``lopd cold-start --draw s`` write the shared draw's bank
  and φ0 byte for byte (the old shared-draw design is still what ``per_seed_draws: false`` runs); with them
  (the workspace fixture's default), each draw's φ0 differs from the others and from the shared one.
* ``lopd train --seed s`` reads draw s; a draw that is not a final seed is bad input (exit 2, nothing written).
* ``bench/upstream.py``: its spread arithmetic on known numbers, and a tiny run end to end.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO


def _draw_root(workspace, tmp_path, **train):
    """A root with the workspace's splits and base linked, and its params with ``train`` merged in."""
    raw = yaml.safe_load(workspace.params_path.read_text())
    raw["train"].update(train)
    raw["tracking"]["uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "models").mkdir()
    (tmp_path / "data").symlink_to(workspace.root / "data")
    (tmp_path / "models" / "base").symlink_to(workspace.root / "models" / "base")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path / "params.yaml"


def test_upstream_seeds_per_draw_and_shared(workspace):
    from lopd.stages.common import upstream_seed

    per_seed = workspace.params(train={"per_seed_draws": True})
    shared = workspace.params(train={"per_seed_draws": False})
    for kind in ("bank", "cold_start"):
        own = getattr(per_seed, kind).seed
        seeds = [upstream_seed(per_seed, kind, s) for s in range(10)]
        assert len(set(seeds)) == 10 and own not in seeds, seeds
        assert [upstream_seed(shared, kind, s) for s in range(10)] == [own] * 10
    assert upstream_seed(per_seed, "bank", 1) != upstream_seed(per_seed, "cold_start", 1)


def test_shared_draw_mode_reproduces_the_shared_bank_and_phi0(workspace, tmp_path):
    from lopd.cli import main

    pp = _draw_root(workspace, tmp_path, per_seed_draws=False)
    for cmd in ("bank", "cold-start"):
        assert main(["--params", str(pp), cmd, "--draw", "1"]) == 0, cmd
    got, ref = tmp_path / "models" / "draws", workspace.root / "models"
    assert (got / "bank-1" / "bank.jsonl").read_bytes() == (ref / "bank" / "bank.jsonl").read_bytes()
    assert (got / "bank-1" / "embeddings.npy").read_bytes() == (ref / "bank" / "embeddings.npy").read_bytes()
    assert (got / "cold_start-1" / "phi0.safetensors").read_bytes() == (ref / "cold_start" / "phi0.safetensors").read_bytes()


def test_per_seed_draws_differ_and_train_reads_its_seeds_draw(workspace, monkeypatch, tmp_path):
    import json

    import lopd.stages.train as train_stage

    m = workspace.root / "models"
    assert workspace.params().train.per_seed_draws  # the fixture's draws were made with the default
    phi0 = [(m / p).read_bytes() for p in ("cold_start/phi0.safetensors", "draws/cold_start-0/phi0.safetensors",
                                           "draws/cold_start-1/phi0.safetensors")]
    assert len(set(phi0)) == 3
    man = [json.loads((m / f"draws/bank-{s}/manifest.json").read_text()) for s in (0, 1)]
    assert [x["draw"] for x in man] == [0, 1] and man[0]["seed"] != man[1]["seed"]

    seen = {}

    class Stop(Exception):
        pass

    def fake_load(params, paths, role, need_bank=True, draw=None):
        seen.update(role=role, need_bank=need_bank, draw=draw)
        raise Stop

    monkeypatch.setattr(train_stage, "load_resources", fake_load)
    with pytest.raises(Stop):
        train_stage.run(workspace.params(), workspace.paths, "lopd_shuffled", 1)
    assert seen == {"role": "train", "need_bank": True, "draw": 1}


def test_each_member_of_an_arms_population_reads_its_seeds_draw(workspace, monkeypatch):
    """``lopd train --arm A`` (the train stage): seed s's member holds draw s's bank and φ0, all on one
    backbone (loaded once, with the first seed's draw)."""
    import torch

    import lopd.population.jobs as runs
    import lopd.stages.train as train_stage
    from lopd.training.checkpoint import load_tensors_verified

    params = workspace.params(train={"seeds": [0, 1], "extra_arms": [], "extra_seeds": []})
    loads, got = [], {}

    real_load = train_stage.load_resources

    def counting_load(*a, **k):
        loads.append(k.get("draw"))
        return real_load(*a, **k)

    class Stop(Exception):
        pass

    def fake_run_jobs(params, res, arm, jobs, **kw):
        got.update(arm=arm, ckpt=kw.get("ckpt_dir"), shared=res,
                   members={j.seed: (j.res or res) for j in jobs}, dirs={j.seed: j.out_dir for j in jobs})
        raise Stop

    monkeypatch.setattr(train_stage, "load_resources", counting_load)
    monkeypatch.setattr(runs, "run_jobs", fake_run_jobs)
    with pytest.raises(Stop):
        train_stage.run(params, workspace.paths, "lopd")
    assert loads == [0] and got["arm"] == "lopd" and got["ckpt"] == workspace.paths.checkpoints / "lopd"
    m = workspace.root / "models" / "draws"
    for s in (0, 1):
        member = got["members"][s]
        assert member.bb is got["shared"].bb
        want = load_tensors_verified(m / f"cold_start-{s}" / "phi0.safetensors")
        assert all(torch.equal(member.phi0[k], want[k]) for k in want), f"seed {s} holds another draw's φ0"
        assert got["dirs"][s] == workspace.paths.root / "runs" / "lopd" / f"seed-{s}"
    assert got["members"][0].bank is not got["members"][1].bank


@pytest.mark.parametrize("cmd", ["bank", "cold-start"])
def test_a_draw_that_is_no_final_seed_is_bad_input(workspace, tmp_path, capsys, cmd):
    from lopd.cli import main

    pp = _draw_root(workspace, tmp_path)
    rc = main(["--params", str(pp), cmd, "--draw", "99"])
    err = capsys.readouterr().err
    assert rc == 2 and "draw 99" in err and "train.seeds" in err, err
    assert not (tmp_path / "models" / "draws").exists()


def test_bench_spread_arithmetic():
    sys.path.insert(0, str(REPO / "bench"))
    import upstream

    # lopd − lopd_frozen per seed: draw 0 → [0.1, 0.3] (mean 0.2), draw 1 → [0.5, 0.7] (mean 0.6)
    values = {0: {"lopd": [1.0, 1.0], "lopd_frozen": [0.9, 0.7], "lopd_shuffled": [1.0, 1.0], "lopd_unrelated": [1.0, 1.0]},
              1: {"lopd": [1.0, 1.0], "lopd_frozen": [0.5, 0.3], "lopd_shuffled": [1.0, 1.0], "lopd_unrelated": [1.0, 1.0]}}
    rows = {r["contrast"]: r for r in upstream.spread(values, base=[0.0, 0.0])}
    r = rows["lopd - lopd_frozen"]
    assert r["draw_means"] == pytest.approx([0.2, 0.6])
    assert r["between_draw_sd"] == pytest.approx(math.sqrt(0.08))  # sd of (0.2, 0.6), ddof 1
    assert r["seed_sd"] == pytest.approx(math.sqrt(0.02))  # each draw's var of two values 0.2 apart
    assert r["seed_sd_of_draw_mean"] == pytest.approx(0.1)
    assert r["draw_component_sd"] == pytest.approx(math.sqrt(0.08 - 0.01))
    assert r["seed_ci_half"] == pytest.approx(12.7062 * 0.1, rel=1e-4)
    assert rows["lopd - base"]["between_draw_sd"] == 0 and rows["lopd - lopd_shuffled"]["seed_sd"] == 0


def test_bench_upstream_runs_at_a_tiny_size(workspace, tmp_path):
    """Two draws × two seeds × one step on the smoke profile, with the workspace's base linked (the smoke
    profile's envs and base match the workspace's): it prints one row per contrast."""
    out = tmp_path / "upstream.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "upstream.py"), "--draws", "2", "--seeds", "2",
                        "--steps", "1", "--profile", str(REPO / "profiles" / "smoke.yaml"),
                        "--base-dir", str(workspace.root / "models" / "base"), "--workspace", str(tmp_path / "ws"),
                        "--json", str(out)], capture_output=True, text=True, timeout=1500, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for x in ("base", "lopd_frozen", "lopd_shuffled", "lopd_unrelated"):
        assert f"| lopd - {x} |" in r.stdout, r.stdout
    import json

    table = json.loads(out.read_text())["table"]
    assert len(table) == 4 and all(len(t["draw_means"]) == 2 for t in table)
    for t in table:  # the between-draw sd is the sd (ddof 1) of the draw means it printed, not any number
        assert t["between_draw_sd"] == pytest.approx(statistics.stdev(t["draw_means"]), abs=1e-12), t
    # the draws are different draws: their banks were built from different seeds, and so were their φ0
    banks = [(tmp_path / "ws" / f"draw-{d}" / "models" / "bank" / "bank.jsonl").read_bytes() for d in (0, 1)]
    phi0 = [(tmp_path / "ws" / f"draw-{d}" / "models" / "cold_start" / "phi0.safetensors").read_bytes() for d in (0, 1)]
    assert banks[0] != banks[1], "two draws wrote the same bank"
    assert phi0[0] != phi0[1], "two draws wrote the same φ0"


def test_bench_upstream_rejects_a_size_too_small_for_an_sd(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "upstream.py"), "--draws", "1"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 2 and "--draws >= 2" in r.stderr, r.stderr
