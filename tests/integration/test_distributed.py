"""Two-rank data parallelism on CPU (gloo) under ``torchrun --standalone --nproc_per_node 2``.

* a toy check of :class:`lopd.training.distributed.World`: ranks start from *different* LoRA inits,
  ``broadcast_params`` makes them identical, each rank takes one step on different data, and
  with ``all_reduce_grads`` the adapters stay bit-identical (without it, they differ);
* the real :class:`lopd.training.trainer.Trainer` (``run_arm(..., world=...)``) for 2 LOPD steps on the
  workspace: both ranks end with the same student LoRA, composer φ and β.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from tests.conftest import REPO

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"

TOY = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import torch

    from lopd.config import load_params
    from lopd.training.distributed import World, params_digest
    from lopd.model.backbone import Backbone, build_tiny_model
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary

    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    world = World.from_env("cpu")
    assert world is not None, "WORLD_SIZE not set: not launched by torchrun?"
    tok = build_tokenizer(env_vocabulary(["tool", "code"]))
    mp = load_params(Path(sys.argv[2])).model
    bb = Backbone(build_tiny_model(mp, tok, seed=0), tok, mp)
    theta = bb.adapter_params("student")
    torch.manual_seed(100 + world.rank)  # a different adapter per rank: the broadcast must fix it
    with torch.no_grad():
        for p in theta:
            p.add_(torch.randn_like(p) * 0.05)
    init_digest = params_digest(theta)
    world.broadcast_params(theta)
    start = [p.detach().clone() for p in theta]
    start_digest = params_digest(theta)

    # different data per rank
    g = torch.Generator().manual_seed(world.rank_seed(0))
    ids = torch.randint(8, len(tok), (4, 12), generator=g)
    attn = torch.ones_like(ids)

    def step(sync):
        with torch.no_grad():
            for p, s in zip(theta, start):
                p.copy_(s)
                p.grad = None
        opt = torch.optim.AdamW(theta, lr=1e-2, weight_decay=0.0)
        logits = bb.logits(ids, attn, "student")[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        if sync:  # composer grads are None: they must be zero-filled, not skipped
            world.all_reduce_grads(theta + bb.adapter_params("composer"))
        torch.nn.utils.clip_grad_norm_(theta, 1.0)
        opt.step()
        return params_digest(theta), float(loss)

    synced, loss = step(True)
    unsynced, _ = step(False)
    wm, wsum = world.weighted_mean(10.0 * world.rank, float(world.rank))
    rec = {"rank": world.rank, "world_size": world.world_size, "init": init_digest, "start": start_digest,
           "data": params_digest([ids]), "synced": synced, "unsynced": unsynced, "loss": loss,
           "mean_rank": world.mean_scalar(float(world.rank)), "weighted_mean": [wm, wsum],
           "any_rank1": world.any_true(world.rank == 1), "seed": world.rank_seed(3)}
    world.barrier()
    (out / f"rank{world.rank}.json").write_text(json.dumps(rec))
    """
)

TRAINER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    import yaml

    from lopd.config import parse_params
    from lopd.paths import Paths
    from lopd.stages.common import load_resources
    import torch

    from lopd.training.run import run_arm
    from lopd.training.distributed import World, params_digest
    from lopd.training.trainer import Trainer

    root, params_path, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    params = parse_params(yaml.safe_load(params_path.read_text()), "test params")
    world = World.from_env("cpu")
    res = load_resources(params, Paths(root), role="train")

    sampled = []
    _sample, _init = Trainer.sample_tasks, Trainer.__init__

    def sample_tasks(self):
        tasks = _sample(self)
        sampled.append([t.task_id for t in tasks])
        return tasks

    def adapters(tr):
        return (list(tr.bb.adapter_params("student")) + list(tr.composer.block.parameters())
                + list(tr.bb.adapter_params("composer")))

    def init(self, *a, **kw):
        # a different θ and φ per rank right after the Trainer is built: only the broadcast that
        # run_arm itself does next (lopd.training.run._fit) can make the ranks agree again
        _init(self, *a, **kw)
        torch.manual_seed(100 + world.rank)
        with torch.no_grad():
            for q in adapters(self):
                q.add_(torch.randn_like(q) * 0.05)
        init.digest = params_digest(adapters(self))
        init.trainer = self

    Trainer.sample_tasks, Trainer.__init__ = sample_tasks, init
    r, _ = run_arm(params, res, "lopd", 0, out / "run", ckpt_dir=None, world=world, final_val=False)
    tr = init.trainer
    rec = {"rank": world.rank, "world_size": world.world_size, "beta": tr.beta, "steps": tr.step, "init": init.digest,
           "student": params_digest(res.bb.adapter_params("student")),
           "composer": params_digest(tr.composer.phi_params()), "sampled": sampled,
           "losses": [h.get("loss") for h in tr.history if h.get("loss") is not None],
           "delta_phi": [h.get("delta_phi") for h in tr.history]}
    world.barrier()
    (out / f"rank{world.rank}.json").write_text(json.dumps(rec))
    """
)


def _torchrun(script: Path, args: list[str], tmp_path: Path, timeout: int = 120) -> list[dict]:
    if not TORCHRUN.exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "LOPD_DIST_TIMEOUT": "90", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("WORLD_SIZE", None)
    p = subprocess.Popen([str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(script), *args],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        log, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        log, _ = p.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s:\n{log[-4000:]}")
    assert p.returncode == 0, f"torchrun exited {p.returncode}:\n{log[-6000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_world_single_process_is_none(monkeypatch):
    """No WORLD_SIZE, or 1: no process group; broadcast_trainer then does not even look at the trainer."""
    from lopd.training.distributed import World, broadcast_trainer

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert World.from_env() is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert World.from_env() is None
    touched = []

    class Untouchable:
        def __getattribute__(self, name):
            touched.append(name)
            raise AssertionError(f"broadcast_trainer(None, ...) read trainer.{name}")

    broadcast_trainer(None, Untouchable())
    assert touched == []


def test_broadcast_trainer_sends_theta_and_all_of_phi():
    """What one broadcast covers, in order: the student θ, then the composer's query block
    (frozen parameters included, so a frozen composer is identical too) and its LoRA; only θ
    when the arm has no composer. One collective call each time."""
    from types import SimpleNamespace

    import torch

    from lopd.training.distributed import broadcast_trainer

    theta, phi_lora = [torch.zeros(2), torch.zeros(1)], [torch.zeros(3)]
    block = torch.nn.Linear(2, 2)
    block.bias.requires_grad_(False)
    bb = SimpleNamespace(adapter_params=lambda role: iter({"student": theta, "composer": phi_lora}[role]))
    sent = []
    world = SimpleNamespace(broadcast_params=lambda params: sent.append([id(q) for q in params]))
    broadcast_trainer(world, SimpleNamespace(bb=bb, composer=SimpleNamespace(block=block)))
    assert sent == [[id(theta[0]), id(theta[1]), id(block.weight), id(block.bias), id(phi_lora[0])]]
    sent.clear()
    broadcast_trainer(world, SimpleNamespace(bb=bb, composer=None))
    assert sent == [[id(theta[0]), id(theta[1])]]


def test_two_ranks_stay_identical_only_with_all_reduce(tmp_path):
    script = tmp_path / "toy.py"
    script.write_text(TOY)
    r0, r1 = _torchrun(script, [str(tmp_path), str(REPO / "params.yaml")], tmp_path)
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["init"] != r1["init"], "ranks were meant to start from different adapters"
    assert r0["start"] == r1["start"], "broadcast_params did not make the ranks identical"
    assert r0["data"] != r1["data"], "ranks saw the same data"
    assert r0["seed"] == 3000 and r1["seed"] == 3001
    assert r0["synced"] == r1["synced"], "with all_reduce_grads the ranks diverged"
    assert r0["unsynced"] != r1["unsynced"], "control: without all_reduce_grads the ranks should differ"
    assert r0["mean_rank"] == r1["mean_rank"] == 0.5
    assert r0["weighted_mean"] == r1["weighted_mean"] == [10.0, 1.0]
    assert r0["any_rank1"] and r1["any_rank1"]


def test_trainer_two_ranks_identical_adapters_and_beta(workspace, tmp_path):
    raw = yaml.safe_load(workspace.params_path.read_text())
    raw["tracking"]["uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    raw["train"].update(steps=2, tasks_per_step=4, val_every=2, val_tasks=4, checkpoint_every=2,
                        use_best_params=False)
    pp = tmp_path / "params.yaml"
    pp.write_text(yaml.safe_dump(raw))
    script = tmp_path / "trainer_ddp.py"
    script.write_text(TRAINER)
    r0, r1 = _torchrun(script, [str(workspace.root), str(pp), str(tmp_path)], tmp_path)
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["init"] != r1["init"], "ranks were meant to build different adapters"
    assert r0["steps"] == r1["steps"] == 2
    assert r0["student"] == r1["student"], "student LoRA differs across ranks"
    assert r0["composer"] == r1["composer"], "composer φ differs across ranks"
    assert r0["beta"] == r1["beta"], "β differs across ranks"
    assert len(r0["losses"]) == 2 and all(abs(x) < 1e9 for x in r0["losses"] + r1["losses"])
    assert (tmp_path / "run" / "result.json").exists()  # rank 0 wrote the outputs
    assert r0["sampled"] != r1["sampled"], "ranks must roll out different tasks (world.rank_seed)"
