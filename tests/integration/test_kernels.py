"""Pinned CPU kernels (lopd.compat.kernels): a parent environment cannot change what a stage computes.

Without the pin, ATen picks its kernels by the CPU (AVX-512, AVX2, the scalar default), the
kernels sum in different orders, and a base pretraining amplifies one bit into another model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from lopd.compat.kernels import PINNED_ENV, can_pin, pin_kernels
from tests.conftest import BIN, run_cmd, tiny_params_dict

pytestmark = pytest.mark.skipif(not can_pin(), reason="the AVX2 pin needs an x86-64 CPU with AVX2")


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _base_run(tmp: Path, name: str, parent_env: dict) -> tuple[str, dict]:
    """prepare + a 40-step base pretraining in a fresh process under ``parent_env``: the digest of
    models/base and the kernels the base stage recorded in its side file."""
    root = tmp / name
    root.mkdir()
    raw = tiny_params_dict()
    raw["envs"].update({"n_train": 8, "n_val": 8, "n_test": 8, "n_pretrain_worlds": 16})
    raw["base"].update({"steps": 40})
    raw["tracking"]["uri"] = f"sqlite:///{root / 'mlflow.db'}"
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    for cmd in ("prepare", "base"):
        r = run_cmd([str(BIN / "lopd"), "--params", "params.yaml", cmd], root, 600, LOPD_WARM="0", **parent_env)
        assert r.returncode == 0, r.stderr[-3000:]
    side = json.loads((root / ".lopd" / "timing" / "base.json").read_text())
    return _tree_digest(root / "models" / "base"), side["kernels"]


def test_base_pretraining_is_the_same_bytes_whatever_the_parent_environment_asks(tmp_path):
    plain, rec = _base_run(tmp_path, "plain", {"ATEN_CPU_CAPABILITY": None, "MKL_CBWR": None})
    assert rec["pinned"] and rec["aten_cpu_capability"] == "AVX2" and rec["mkl_cbwr"] == "AVX2"
    assert rec["torch_threads"] == tiny_params_dict()["model"]["torch_threads"]
    # the scalar kernels sum in another order than any vectorised ones (on this AVX-512 EPYC, and on an AVX2
    # machine alike); without the pin this run writes another models/base (checked by disabling pin_kernels)
    digest, rec = _base_run(tmp_path, "default", {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                                                  "ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "1"})
    assert rec["aten_cpu_capability"] == "AVX2", rec
    assert digest == plain, "a parent asking for the default kernels changed models/base"


def test_pin_overrides_the_parent_and_stands_aside_without_avx2(monkeypatch, capsys):
    import lopd.compat.kernels as k

    env = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO"}
    assert pin_kernels(env) and all(env[key] == v for key, v in PINNED_ENV.items())
    assert not can_pin("aarch64", {"avx2", "fma"}) and not can_pin("x86_64", {"avx", "sse4_2"})
    monkeypatch.setattr(k, "can_pin", lambda: False)
    monkeypatch.setitem(k._STATE, "warned", False)
    env = {"ATEN_CPU_CAPABILITY": "avx2", "PATH": "/bin"}
    assert not k.pin_kernels(env)
    assert env == {"PATH": "/bin"}  # no stale pin left behind: the CPU's own kernels, said out loud
    assert "no AVX2" in capsys.readouterr().err
    monkeypatch.setattr(k, "can_pin", lambda: True)
    k.pin_kernels({})  # leave the module state as the test session set it
