from __future__ import annotations

import random
from collections import Counter

import pytest

from lopd.envs.base import Episode, Task
from lopd.envs.code import FAMILIES, CodeEnv, corrupt, outputs_match, reference


@pytest.fixture(scope="module")
def env() -> CodeEnv:
    return CodeEnv()


def run(env: CodeEnv, task: Task, action: str) -> float:
    ep = env.episode(task)
    assert isinstance(ep, Episode)
    res = ep.step(action)
    assert res.done and res.observation is None
    return ep.reward()


def test_protocol_attributes(env):
    assert env.domain == "code" and env.max_turns == 1
    assert len(FAMILIES) >= 4


def test_examples_from_spec():
    c = {"scale": "13", "offset": "17"}
    assert reference("scale_shift", {"a": 2, "b": 3}, 4, c) == 11 * 13 + 17
    assert reference("wrap", {"a": 4, "m": 7}, 5, c) == 2 * 13 + 17
    assert reference("clamp", {"lo": 2, "hi": 9}, 12, c) == 9 * 13 + 17
    assert reference("parity", {"a": 3, "b": 5}, 7, c) == 5 * 13 + 17
    env = CodeEnv()
    by_family = {}
    for t in env.generate(3, 40):
        by_family.setdefault(t.family, t)
    assert set(by_family) == set(FAMILIES)
    for fam, t in by_family.items():
        words = t.prompt.split()
        assert words[:4] == ["task", *t.world.split(), fam]
        assert " ".join(words) == t.prompt  # single spaces
        sol = env.solve(t)[0]
        assert " ".join(sol.split()) == sol
        assert sol.startswith("def f ( x ) : return ( ")
        c = t.spec["conventions"]
        assert sol.endswith(f" ) * {c['scale']} + {c['offset']}")


def test_determinism_and_unique_ids(env):
    a = env.generate(7, 60)
    b = env.generate(7, 60)
    assert [t.to_json() for t in a] == [t.to_json() for t in b]
    c = env.generate(8, 60)
    assert [t.prompt for t in a] != [t.prompt for t in c]
    assert [t.spec for t in a] != [t.spec for t in c]
    # prefix-stable
    assert [t.to_json() for t in env.generate(7, 10)] == [t.to_json() for t in a[:10]]
    ids = [t.task_id for s in range(5) for t in env.generate(s, 60)]
    assert len(ids) == len(set(ids))
    assert all(i.startswith("code/") for i in ids)
    for t in a:
        assert Task.from_json(t.to_json()) == t


def test_spec_contents(env):
    for t in env.generate(1, 40):
        s = t.spec
        assert s["family"] == t.family
        assert len(s["inputs"]) == 6 and len(set(s["inputs"])) == 6
        assert all(-5 <= x <= 15 for x in s["inputs"])
        assert s["expected"] == [reference(t.family, s["params"], x, s["conventions"]) for x in s["inputs"]]
        assert all(0 <= v <= 9 for v in s["params"].values())
        if t.family == "clamp":
            assert s["params"]["lo"] < s["params"]["hi"]
        if t.family == "wrap":
            assert s["params"]["m"] >= 2


def test_scripted_solutions_score_one(env):
    tasks = env.generate(11, 48)
    assert Counter(t.family for t in tasks) == {f: 12 for f in FAMILIES}
    for t in tasks:
        assert run(env, t, env.solve(t)[0]) == 1.0, t


def test_wrong_solutions_score_zero(env):
    t = env.generate(0, 1)[0]
    sol = t.spec["solution"]
    assert run(env, t, sol.replace("return", "return 1 +")) == 0.0
    assert run(env, t, corrupt(sol, random.Random(0))) == 0.0
    assert run(env, t, "def f ( x ) : return x") == 0.0
    assert run(env, t, "") == 0.0
    assert run(env, t, "def f ( x ) : return") == 0.0
    assert run(env, t, "garbage ( (") == 0.0


def test_noisy_solutions_mostly_fail(env):
    tasks = env.generate(5, 24)
    rng = random.Random(1)
    rewards = [run(env, t, env.solve(t, rng, noise=1.0)[0]) for t in tasks]
    assert sum(rewards) <= 0.2 * len(tasks)
    # noise 0 with an rng is the clean solution
    assert all(env.solve(t, random.Random(2), noise=0.0) == [t.spec["solution"]] for t in tasks)


def test_noisy_solutions_are_wrong_by_reference(env):
    """Cheap check of many corruptions without the sandbox."""
    rng = random.Random(3)
    tasks = env.generate(9, 200)
    wrong = 0
    for t in tasks:
        bad = env.solve(t, rng, noise=1.0)[0]
        assert bad != t.spec["solution"]
        ns: dict = {}
        try:
            exec(bad, {"max": max, "min": min}, ns)
            outs = [ns["f"](x) for x in t.spec["inputs"]]
            wrong += not outputs_match(outs, t.spec["expected"])
        except Exception:
            wrong += 1
    assert wrong >= 0.95 * len(tasks)


def test_vocabulary_covers_everything(env):
    vocab = set(env.vocabulary())
    assert env.vocabulary() == sorted(vocab)
    rng = random.Random(4)
    for t in env.generate(13, 400):
        words = set(t.prompt.split()) | set(env.solve(t)[0].split())
        for _ in range(3):
            words |= set(env.solve(t, rng, noise=1.0)[0].split())
        assert words <= vocab, words - vocab
    syllables = {s for pool in env.worlds.values() for w in pool for s in w.name.split()}
    assert syllables <= vocab
    assert len(vocab - syllables) < 70


def test_step_twice_raises(env):
    t = env.generate(0, 1)[0]
    ep = env.episode(t)
    ep.step(t.spec["solution"])
    with pytest.raises(RuntimeError):
        ep.step(t.spec["solution"])


def test_make_env_builds_the_code_env_the_params_configure():
    """``make_env("code", envs)`` is a code environment configured from the ``envs`` section: it
    generates the tasks a CodeEnv with those worlds generates, scores a task's own solution 1 and a
    wrong one 0, and an unknown domain is refused by name."""
    from lopd.config import load_params
    from lopd.envs import WorldConfig, make_env
    from tests.conftest import REPO

    # worlds other than the defaults: an env that ignored the params would generate other tasks
    envs = load_params(REPO / "params.yaml").envs.model_copy(update={"seed": 4321, "n_target_worlds": 3})
    made = make_env("code", envs)
    assert isinstance(made, CodeEnv)
    tasks = made.generate(0, 6)
    direct = CodeEnv(worlds=WorldConfig.from_params(envs)).generate(0, 6)
    assert [t.spec for t in tasks] == [t.spec for t in direct]
    assert [t.prompt for t in tasks] != [t.prompt for t in CodeEnv().generate(0, 6)]
    for t in tasks:
        assert run(made, t, made.solve(t)[0]) == 1.0
        assert run(made, t, t.spec["solution"].replace("return", "return 1 +")) == 0.0
    with pytest.raises(ValueError, match="unknown domain 'cod'"):
        make_env("cod", envs)


def test_concurrent_episodes(env):
    from concurrent.futures import ThreadPoolExecutor

    tasks = env.generate(21, 16)
    with ThreadPoolExecutor(4) as ex:
        rewards = list(ex.map(lambda t: run(env, t, env.solve(t)[0]), tasks))
    assert rewards == [1.0] * len(tasks)
