"""Evaluation-only benchmark domains on real data: BFCL (simple/multiple) and HumanEval.

BFCL data is fetched when missing (``lopd.envs.external.fetch_bfcl``: ``pip download`` of the
pinned ``bfcl-eval`` wheel); the tests skip only when pip fails with a network error.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lopd.envs.bfcl import BFCLEnv
from lopd.envs.bfcl_calls import format_call, parse_call, score
from lopd.errors import BadInput
from lopd.envs.external import BFCL_DEFAULT_DIR, BFCL_ENV_VAR, FetchError, bfcl_dir, fetch_bfcl

REPO = Path(__file__).resolve().parents[2]
N_NEG = 40  # tasks per negative check (the brief asks for >= 20)


@pytest.fixture(scope="session")
def bfcl_data(tmp_path_factory) -> Path:
    candidates = [os.environ.get(BFCL_ENV_VAR), REPO / BFCL_DEFAULT_DIR]
    for c in candidates:
        if c:
            try:
                return bfcl_dir(c)
            except BadInput:
                pass
    dest = tmp_path_factory.mktemp("bfcl") / "bfcl"
    try:
        return fetch_bfcl(dest)
    except FetchError as e:
        if e.network:
            print(f"BFCL fetch failed with a network error: {e}")
            pytest.skip(f"BFCL data unavailable (network error in pip download): {e}")
        raise


@pytest.fixture(scope="session")
def simple_tasks(bfcl_data):
    env = BFCLEnv(["simple"], data_dir=bfcl_data)
    return env, env.generate(0, len(env.items()))


def _reward(env, task, action: str) -> float:
    ep = env.episode(task)
    res = ep.step(action)
    assert res.done and res.observation is None
    return ep.reward()


# -------------------------------------------------------------------------------- BFCL
def test_bfcl_possible_answers_score_one(simple_tasks):
    env, tasks = simple_tasks
    assert len(tasks) == 400
    for t in tasks:
        [a] = env.solve(t)
        assert _reward(env, t, a) == 1.0, (t.task_id, a, score(a, t.spec))


def test_bfcl_every_allowed_value_scores_one(simple_tasks):
    env, tasks = simple_tasks
    n_alt = 0
    for t in tasks[:N_NEG]:
        name, args = parse_call(env.solve(t)[0])
        (_, allowed), = t.spec["ground_truth"].items()
        fn = next(f for f in t.spec["functions"] if f["name"] == name)
        required = set(fn["parameters"].get("required", []))
        for p, al in allowed.items():
            for v in al:
                a2 = dict(args)
                if v == "":
                    if p not in a2 or p in required:  # (a few items mark a required one "")
                        continue
                    del a2[p]  # "" = the parameter may be omitted
                elif not isinstance(v, dict):
                    a2[p] = v
                else:
                    continue
                n_alt += 1
                assert score(format_call(name, a2), t.spec)[0] == 1.0, (t.task_id, p, v)
    assert n_alt > N_NEG


def test_bfcl_wrong_calls_score_zero(simple_tasks):
    env, tasks = simple_tasks
    counts = {"name": 0, "value": 0, "missing": 0, "unknown": 0}
    for t in tasks[:N_NEG]:
        name, args = parse_call(env.solve(t)[0])
        fn = next(f for f in t.spec["functions"] if f["name"] == name)
        # wrong function name
        assert _reward(env, t, format_call(name + "_other", args)) == 0.0
        counts["name"] += 1
        # wrong value (for every parameter in turn)
        for p, v in args.items():
            bad = (not v) if isinstance(v, bool) else v + 1001 if isinstance(v, (int, float)) \
                else v + "zzz" if isinstance(v, str) else None
            assert _reward(env, t, format_call(name, {**args, p: bad})) == 0.0, (t.task_id, p, bad)
            counts["value"] += 1
        # missing required argument
        for p in fn["parameters"].get("required", []):
            a2 = {k: v for k, v in args.items() if k != p}
            assert _reward(env, t, format_call(name, a2)) == 0.0, (t.task_id, p)
            counts["missing"] += 1
        # unknown argument
        assert _reward(env, t, format_call(name, {**args, "not_a_param": 1})) == 0.0
        counts["unknown"] += 1
    assert counts["name"] == N_NEG and counts["unknown"] == N_NEG
    assert counts["value"] >= N_NEG and counts["missing"] >= N_NEG


def test_bfcl_parsing_is_literal_only(simple_tasks):
    env, tasks = simple_tasks
    t = tasks[0]
    good = env.solve(t)[0]
    assert _reward(env, t, f"[{good}]") == 1.0  # BFCL's own list format
    assert _reward(env, t, f"```python\n{good}\n```") == 1.0
    assert _reward(env, t, f"{good}\n{good}") == 0.0  # two calls
    assert _reward(env, t, f"[{good}, {good}]") == 0.0
    name, args = parse_call(good)
    first = next(iter(args))
    # non-literal values are rejected, never evaluated
    for expr in ("__import__('os').system('true')", "open('/etc/passwd').read()", "1 if True else 2",
                 "[x for x in range(3)]", "lambda: 1"):
        assert parse_call(f"{name}({first}={expr})") is None
        assert _reward(env, t, format_call(name, args).replace(f"{first}={args[first]!r}", f"{first}={expr}")) == 0.0
    assert parse_call(f"{name}(1, {first}={args[first]!r})") is None  # positional
    assert parse_call(f"{name}(**{{'{first}': 1}})") is None
    assert parse_call("not python at all (") is None
    assert _reward(env, t, "") == 0.0
    # strings compare as in BFCL: case, spaces and ,./-_*^ are ignored
    assert parse_call('f(a="New York", b=-2.5, c=[1, "x"], d={"k": None})') == (
        "f", {"a": "New York", "b": -2.5, "c": [1, "x"], "d": {"k": None}})


def test_bfcl_noisy_solver_fails_and_generate_is_deterministic(bfcl_data, simple_tasks):
    env, tasks = simple_tasks
    rng = random.Random(0)
    for t in tasks[:N_NEG]:
        [bad] = env.solve(t, rng, noise=1.0)
        assert _reward(env, t, bad) == 0.0, (t.task_id, bad)
    a = [t.task_id for t in env.generate(3, 25)]
    assert a == [t.task_id for t in env.generate(3, 25)]
    assert a != [t.task_id for t in env.generate(4, 25)]
    assert len(set(a)) == 25 and all(x.startswith("bfcl/simple/simple_python_") for x in a)
    assert env.vocabulary() == []
    t = env.generate(3, 1)[0]
    assert t.domain == "bfcl" and t.family == "simple" and "Question:" in t.prompt
    with pytest.raises(BadInput):
        env.generate(0, 401)


def test_bfcl_multiple_category(bfcl_data):
    env = BFCLEnv(["multiple"], data_dir=bfcl_data)
    tasks = env.generate(0, 200)
    assert all(len(t.spec["functions"]) >= 2 for t in tasks)
    for t in tasks:
        assert score(env.solve(t)[0], t.spec)[0] == 1.0, t.task_id
    # calling a documented but wrong function scores 0
    t = tasks[0]
    (want, _), = t.spec["ground_truth"].items()
    other = next(f["name"] for f in t.spec["functions"] if f["name"] != want)
    assert score(f"{other}()", t.spec)[0] == 0.0


def test_bfcl_missing_data_names_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv(BFCL_ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(BadInput, match="external-data"):
        bfcl_dir()
    with pytest.raises(BadInput, match="external-data"):
        BFCLEnv().generate(0, 1)
    with pytest.raises(BadInput):
        BFCLEnv(["simple_java"])


# ---------------------------------------------------------------------------- HumanEval
def test_humaneval_canonical_solutions_pass_in_sandbox():
    from lopd.envs.humaneval import HumanEvalEnv

    env = HumanEvalEnv()
    tasks = env.all_tasks()
    assert len(tasks) == 164

    def run(t):
        ep = env.episode(t)
        ep.step(env.solve(t)[0])
        return t.task_id, ep.reward(), ep.result

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(run, tasks))
    failed = [(tid, r.status, r.detail) for tid, rew, r in results if rew != 1.0]
    assert not failed, failed


def test_humaneval_broken_and_hostile_completions_score_zero():
    from lopd.envs.humaneval import BROKEN_COMPLETION, HumanEvalEnv

    env = HumanEvalEnv(timeout_s=2.0)
    tasks = env.generate(0, 6)
    assert [t.task_id for t in tasks] == [t.task_id for t in env.generate(0, 6)]
    assert all(t.task_id.startswith("humaneval/humaneval/") and t.family == "humaneval" for t in tasks)
    rng = random.Random(0)
    for t in tasks[:3]:
        assert env.solve(t, rng, noise=1.0) == [BROKEN_COMPLETION]
        ep = env.episode(t)
        ep.step(BROKEN_COMPLETION)
        assert ep.reward() == 0.0 and ep.result.status == "error"
    t = tasks[3]
    for completion, status in [
        ("    import subprocess\n    return subprocess.run(['true'])\n", "error"),  # refused import
        ("    while True:\n        pass\n", "timeout"),
        ("    raise SystemExit(0)\n", "error"),
        ("    import os\n    os._exit(0)\n", "no_output"),
    ]:
        ep = env.episode(t)
        ep.step(completion)
        assert ep.reward() == 0.0, completion
        assert ep.result.status in (status, "refused"), (completion, ep.result)
    # a full top-level redefinition is accepted (appended after the prompt's stub)
    sol = t.spec["prompt"] + t.spec["canonical_solution"]
    ep = env.episode(t)
    ep.step("\n" + sol)
    assert ep.reward() == 1.0, ep.result
    with pytest.raises(BadInput):
        env.generate(0, 165)
