"""Worlds: seeded, shared by the splits (tasks disjoint), conventions hidden from prompts,
revealed by a successful trajectory, and load-bearing for the reward."""

from __future__ import annotations

import json

from collections import Counter
from pathlib import Path

import pytest

from lopd.config import deep_merge, parse_params, read_yaml_mapping
from tests.conftest import default_params
from lopd.data import SPLITS, generate_splits
from lopd.envs import WorldConfig, make_env
from lopd.envs.code import SLOTS, CodeEnv
from lopd.envs.tool import FAMILIES, ToolEnv, run_actions

REPO = Path(__file__).resolve().parents[2]


def _params(profile: str | None = None):
    raw = read_yaml_mapping(REPO / "params.yaml")
    if profile:
        raw = deep_merge(raw, read_yaml_mapping(REPO / profile))
    return parse_params(raw)


@pytest.fixture(scope="module", params=[None, "profiles/null-world.yaml", "profiles/smoke.yaml"],
                ids=["default", "null-world", "smoke"])
def profile_splits(request):
    p = _params(request.param)
    return p, generate_splits(p.envs)


def _phrase_in(phrase: str, text: str) -> bool:
    """Whether the words of ``phrase`` occur contiguously among the words of ``text``."""
    p, w = phrase.split(), text.split()
    return any(w[i:i + len(p)] == p for i in range(len(w) - len(p) + 1))


def _conv_phrases(task) -> list[str]:
    """The strings that spell the task's conventions."""
    return list(task.spec["conventions"].values())


# ----------------------------------------------------------------- seeded worlds


@pytest.mark.parametrize("cls", [ToolEnv, CodeEnv])
def test_worlds_seeded_and_deterministic(cls):
    p = _params()
    a, b = make_env(cls.domain, p.envs), make_env(cls.domain, p.envs)
    assert a.worlds == b.worlds
    other = make_env(cls.domain, default_params({"envs": {"seed": p.envs.seed + 1}}).envs)
    assert [w.conventions for w in a.worlds["target"]] != [w.conventions for w in other.worlds["target"]]
    assert len(a.worlds["target"]) == p.envs.n_target_worlds
    assert len(a.worlds["pretrain"]) == p.envs.n_pretrain_worlds
    target = [w.name for w in a.worlds["target"]]
    assert len(set(target)) == len(target)
    # pretraining worlds never take a target world's name; they share the other names
    assert not set(target) & {w.name for w in a.worlds["pretrain"]}
    # the split seeds do not change the worlds: one world set for train, val and test
    assert a.generate(1, 8)[0].world == a.generate(2, 8)[0].world


def test_conventions_draw_from_n_options():
    for n in (2, 3, 4):
        env = ToolEnv(worlds=WorldConfig(n_options=n, n_pretrain=240))
        for w in env.worlds["target"] + env.worlds["pretrain"]:
            fam = FAMILIES[w.family]
            for slot, value in w.conventions:
                assert value in fam.pools[slot][:n]
        seen = Counter(w.conv["op"] for w in env.worlds["pretrain"] if w.family == "bank")
        assert set(seen) == set(FAMILIES["bank"].pools["op"][:n])  # every option is used


def test_splits_share_target_worlds_and_are_disjoint_by_task(profile_splits):
    p, splits = profile_splits
    ids = {s: {t.task_id for t in splits[s]} for s in SPLITS}
    assert not (ids["train"] & ids["val"] or ids["train"] & ids["test"] or ids["val"] & ids["test"])
    for domain in p.envs.domains:
        target = {w.name for w in make_env(domain, p.envs).worlds["target"]}
        for s in SPLITS:
            assert {t.world for t in splits[s] if t.domain == domain} == target, (domain, s)


def test_splits_are_disjoint_by_content(profile_splits):
    """No task's content (its prompt: world, family, operation, arguments) repeats, within a split or
    across splits; checked on the prompts themselves, independently of the manifest's hashes."""
    _, splits = profile_splits
    prompts = {s: [(t.domain, " ".join(t.prompt.split())) for t in splits[s]] for s in SPLITS}
    for s in SPLITS:
        assert len(set(prompts[s])) == len(prompts[s]), f"{s} repeats a task"
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1:]:
            shared = set(prompts[a]) & set(prompts[b])
            assert not shared, f"{a} and {b} share {len(shared)} tasks, e.g. {sorted(shared)[0]}"
    # the specs the verifier applies are disjoint too (conventions aside, which a world fixes)
    core = {s: {json.dumps([t.domain, t.world, {k: v for k, v in t.spec.items() if k not in
                                                ("conventions", "inputs", "expected", "solution")}], sort_keys=True)
                for t in splits[s]} for s in SPLITS}
    assert not (core["train"] & core["test"] or core["train"] & core["val"] or core["val"] & core["test"])


def test_world_is_named_in_prompt(profile_splits):
    _, splits = profile_splits
    for s in SPLITS:
        for t in splits[s]:
            assert _phrase_in(t.world, t.prompt), t.prompt


# ----------------------------------------------------------------- hidden conventions


def test_no_convention_string_in_any_prompt(profile_splits):
    """Every prompt of every split, against its own conventions and against every option any
    world could draw (so no prompt can even hint at which option holds)."""
    p, splits = profile_splits
    options = {d: make_env(d, p.envs).convention_words() for d in p.envs.domains}
    checked = 0
    for s in SPLITS:
        for t in splits[s]:
            for phrase in _conv_phrases(t):
                assert not _phrase_in(phrase, t.prompt), (t.task_id, phrase, t.prompt)
            assert not set(t.prompt.split()) & set(options[t.domain]), t.prompt
            checked += 1
    assert checked == sum(len(splits[s]) for s in SPLITS) > 0


def test_same_world_same_conventions_default_fresh_in_null_world():
    for profile, shared in ((None, True), ("profiles/null-world.yaml", False)):
        p = _params(profile)
        tasks = generate_splits(p.envs)["train"]
        by_world: dict[str, set] = {}
        for t in tasks:
            by_world.setdefault(t.world, set()).add(tuple(sorted(t.spec["conventions"].items())))
        if shared:
            assert all(len(c) == 1 for c in by_world.values())
        else:  # the null world: a world's tasks disagree about its conventions
            assert sum(len(c) > 1 for c in by_world.values()) == len(by_world)


def test_null_world_keeps_pretraining_worlds():
    """The base policy is pretrained on the same worlds either way (it stays a reader)."""
    a, b = _params(), _params("profiles/null-world.yaml")
    assert b.envs.null_world and not a.envs.null_world
    for d in a.envs.domains:
        ea, eb = make_env(d, a.envs), make_env(d, b.envs)
        assert ea.worlds == eb.worlds
        assert [t.to_json() for t in ea.generate(9, 20, pool="pretrain")] == \
               [t.to_json() for t in eb.generate(9, 20, pool="pretrain")]


# ----------------------------------------------------------------- experience reveals, conventions matter


def test_successful_trajectory_reveals_tool_conventions():
    env = make_env("tool", _params().envs)
    tasks = env.generate(3, 64)
    for t in tasks:
        msgs, r = run_actions(env, t, env.solve(t))
        assert r == 1.0
        actions = [a.split() for role, a in msgs if role == "assistant"]
        c = t.spec["conventions"]
        assert [a[0] for a in actions if a[0] != "mode"] == [c["prereq"], c["op"], FAMILIES[t.family].closing]
        assert actions[0][1:3] == ["as", c["key"]]  # the prerequisite carries the world's key after `as`
        op = next(a for a in actions if a[0] == c["op"])
        assert op[1:3] == ["in", c["unit"]]  # the operation carries its unit after `in`
        assert op[3:5] == list(FAMILIES[t.family].op_args(t.spec))
        # and a same-world task is solved with the same tool names and unit
        peer = next(u for u in tasks if u.world == t.world and u.task_id != t.task_id)
        assert peer.spec["conventions"] == c


def test_successful_solution_reveals_code_constants():
    env = make_env("code", _params().envs)
    for t in env.generate(3, 32):
        c = t.spec["conventions"]
        assert env.solve(t)[0].endswith(f") * {c['scale']} + {c['offset']}")


def _wrong(options: list[str], right: str) -> list[str]:
    return [o for o in options if o != right]


def test_wrong_tool_convention_lowers_reward():
    env = make_env("tool", _params().envs)
    n = env.world_cfg.n_options
    for t in env.generate(4, 32):
        c = t.spec["conventions"]
        right = env.solve(t)
        _, r = run_actions(env, t, right)
        assert r == 1.0
        for slot in ("prereq", "key", "op", "unit"):
            for other in _wrong(FAMILIES[t.family].pools[slot][:n], c[slot]):
                bad = dict(t.spec, conventions={**c, slot: other})
                wrong_actions = FAMILIES[t.family].solve(bad)
                _, rw = run_actions(env, t, wrong_actions)
                assert rw < 1.0, (t.task_id, slot, other, wrong_actions)


def _with(t, **conv):
    from lopd.envs.code import solution_text

    return solution_text(t.family, t.spec["params"], {**t.spec["conventions"], **conv})


@pytest.mark.parametrize("n_options", [2, 4])
def test_wrong_code_constant_fails(n_options):
    from lopd.envs.code import _trusted_passes

    p = default_params({"envs": {"n_options": n_options}})
    env = make_env("code", p.envs)
    for t in env.generate(4, 200):
        s = t.spec
        assert _trusted_passes(s["solution"], s["inputs"], s["expected"])
        for slot, opts in SLOTS.items():
            for other in _wrong(opts, s["conventions"][slot]):
                wrong = _with(t, **{slot: other})
                assert not _trusted_passes(wrong, s["inputs"], s["expected"]), (t.task_id, wrong)


def test_wrong_code_constant_fails_in_sandbox():
    env = make_env("code", _params().envs)
    t = env.generate(5, 1)[0]
    wrong = _with(t, offset=_wrong(SLOTS["offset"], t.spec["conventions"]["offset"])[0])
    for action, want in ((t.spec["solution"], 1.0), (wrong, 0.0)):
        ep = env.episode(t)
        ep.step(action)
        assert ep.reward() == want


def test_base_pretraining_uses_pretraining_worlds_only():
    from lopd.training.base_policy import pretraining_demos, pretraining_seed, trajectory
    from lopd.engine.evaluation import make_envs

    # 254 target worlds leave 2 names for 8 pretraining worlds: each name is shared by 4 worlds
    p = default_params({"envs": {"n_target_worlds": 254, "n_pretrain_worlds": 8},
                        "base": {"tasks_per_world": 4, "demos_per_task": 2}})
    envs = make_envs(p)
    for e in envs.values():
        assert len({w.name for w in e.worlds["pretrain"]}) == 2
        assert not {w.name for w in e.worlds["pretrain"]} & {w.name for w in e.worlds["target"]}
    demos = pretraining_demos(envs, p.base, p.envs.seed)
    assert len(demos) == 2 * 4 * 8 * len(envs)
    pre = {w.name: d for d, e in envs.items() for w in e.worlds["pretrain"]}
    tasks = {t.task_id: t for i, e in enumerate(envs.values())
             for t in e.generate(pretraining_seed(p.envs.seed, i), 8 * 4, pool="pretrain")}
    sizes = Counter()
    for demo in demos:
        t = tasks[demo.task_id]
        assert t.world in pre and demo.messages[0] == ("user", t.prompt)
        sizes[len(demo.context)] += 1
        assert len(set(demo.context_task_ids)) == len(demo.context_task_ids)
        for cid, ctx in zip(demo.context_task_ids, demo.context):  # same world, another task, a success
            u = tasks[cid]
            assert cid != t.task_id and u.world == t.world
            # a shared name is not enough: the context comes from the demo's own world
            assert u.family == t.family and u.spec["conventions"] == t.spec["conventions"]
            env = envs[u.domain]
            assert ctx == trajectory(env, u, env.solve(u))
            if env.max_turns > 1:
                assert run_actions(env, u, env.solve(u))[1] == 1.0
    assert set(sizes) == set(range(len(p.base.context_probs)))


def test_encode_demo_masks():
    """The loss is on the demo's assistant tokens, and with context_loss also on the context
    trajectories' assistant tokens; never on prompts, observations, headers or <|exp|>."""
    from lopd.training.base_policy import Demo, encode_demo
    from lopd.model.chat import ChatFormat
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary

    fmt = ChatFormat(build_tokenizer(env_vocabulary(["tool"])))
    e1 = [("user", "bank : send 3 to ana"), ("assistant", "login"), ("obs", "ok"), ("assistant", "pay ana 3 v1")]
    demo = Demo(context=[e1], messages=[("user", "bank : send 4 to bob"), ("assistant", "login")])
    v = fmt.tok.get_vocab()
    ctx = [v["<|exp|>"], v["<|user|>"], v["bank"], v[":"], v["send"], v["3"], v["to"], v["ana"], v["<|end|>"],
           v["<|assistant|>"], v["login"], v["<|end|>"], v["<|obs|>"], v["ok"], v["<|end|>"], v["<|assistant|>"],
           v["pay"], v["ana"], v["3"], v["v1"], v["<|end|>"]]
    own = [v["<|bos|>"], v["<|user|>"], v["bank"], v[":"], v["send"], v["4"], v["to"], v["bob"], v["<|end|>"],
           v["<|assistant|>"], v["login"], v["<|end|>"]]
    ids, mask = encode_demo(fmt, demo, context_loss=False)
    assert ids == ctx + own
    assert mask == [0] * len(ctx) + [0] * 10 + [1, 1]
    ids2, mask2 = encode_demo(fmt, demo, context_loss=True)
    assert ids2 == ids
    assert mask2 == [0] * 10 + [1, 1] + [0] * 4 + [1] * 5 + [0] * 10 + [1, 1]


def test_params_limit_on_target_worlds_matches_the_name_pool():
    """config.EnvParams caps n_target_worlds without importing the environments; the cap must
    leave at least one of the MAX_WORLDS names to the pretraining worlds."""
    from lopd.config import EnvParams
    from lopd.envs.base import MAX_WORLDS

    assert EnvParams.model_fields["n_target_worlds"].metadata[-1].le == MAX_WORLDS - 1
