"""The tool environments: determinism, scripted solutions, hidden rules, vocabulary."""

from __future__ import annotations

import random

import pytest

from lopd.envs import make_env
from lopd.envs.base import Episode
from lopd.envs.tool import FAMILIES, ToolEnv, run_actions
from tests.conftest import default_params  # noqa: E402

N = 200  # tasks per check (50 per family)


@pytest.fixture(scope="module")
def env() -> ToolEnv:
    return ToolEnv()


@pytest.fixture(scope="module")
def tasks(env):
    return env.generate(7, N)


def _by_family(tasks, family):
    out = [t for t in tasks if t.family == family]
    assert out, f"no {family} tasks generated"
    return out


# ----------------------------------------------------------------- generation


def test_same_seed_same_tasks(env):
    a, b = env.generate(11, 40), ToolEnv().generate(11, 40)
    assert [t.to_json() for t in a] == [t.to_json() for t in b]
    c = env.generate(12, 40)
    assert [t.spec for t in a] != [t.spec for t in c]


def test_generation_independent_of_global_rng(env):
    random.seed(0)
    a = env.generate(5, 20)
    random.seed(999)
    random.random()
    b = env.generate(5, 20)
    assert a == b


def test_unique_task_ids_across_seeds(env):
    ids = [t.task_id for s in (1, 2, 3) for t in env.generate(s, 100)]
    assert len(ids) == len(set(ids)) == 300
    assert all(i.startswith("tool/") for i in ids)


def test_every_family_generated_round_robin(env, tasks):
    assert {t.family for t in tasks} == set(FAMILIES) == {"inventory", "bank", "thermo", "ticket"}
    worlds = {w.name: w for w in env.worlds["target"]}
    for i, t in enumerate(tasks):
        assert t.domain == "tool"
        assert t.task_id.split("/")[1] == t.family
        assert t.world == env.worlds["target"][i % len(worlds)].name
        assert worlds[t.world].family == t.family
        assert t.prompt.startswith(f"{t.world} {t.family} : ")


def test_family_subset(env):
    sub = ToolEnv(families=["bank", "ticket"])
    assert {t.family for t in sub.generate(3, 10)} == {"bank", "ticket"}
    assert {w.family for w in sub.worlds["target"] + sub.worlds["pretrain"]} == {"bank", "ticket"}
    with pytest.raises(ValueError, match="unknown tool families"):
        ToolEnv(families=["nope"])


def test_episodes_deterministic(env, tasks):
    rng = random.Random(3)
    for t in tasks[:40]:
        actions = env.solve(t, rng=rng, noise=0.5)
        m1, r1 = run_actions(env, t, actions)
        m2, r2 = run_actions(ToolEnv(), t, actions)
        assert m1 == m2 and r1 == r2
        # step by step: same observations and done flags
        e1, e2 = env.episode(t), env.episode(t)
        for a in actions:
            s1, s2 = e1.step(a), e2.step(a)
            assert (s1.observation, s1.done) == (s2.observation, s2.done)
            if s1.done:
                break
        assert e1.reward() == e2.reward()


def test_noisy_solve_deterministic_given_rng(env, tasks):
    a = [env.solve(t, rng=random.Random(42), noise=0.6) for t in tasks[:40]]
    b = [env.solve(t, rng=random.Random(42), noise=0.6) for t in tasks[:40]]
    assert a == b
    assert a != [env.solve(t) for t in tasks[:40]]  # the noise did something


# ----------------------------------------------------------------- solutions and rules


def _c(t):
    return t.spec["conventions"]


def _op(t, a, b):
    """The operation call of ``t`` on arguments (a, b) in the world's conventions."""
    c = _c(t)
    return f"{c['op']} in {c['unit']} {a} {b}"


def _pre(t, *args):
    """The prerequisite call in ``t``'s conventions: ``<prereq> as <key> ARGS``."""
    c = _c(t)
    return " ".join([c["prereq"], "as", c["key"], *map(str, args)])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_scripted_solution_scores_one(env, tasks, family):
    for t in _by_family(tasks, family):
        msgs, r = run_actions(env, t, env.solve(t))
        assert r == 1.0, (t.task_id, msgs)
        assert msgs[0] == ("user", t.prompt)
        assert [m for role, m in msgs if role == "assistant"] == env.solve(t)


def test_scripted_solution_observations(env):
    t = next(t for t in env.generate(1, 8) if t.family == "inventory")
    c = _c(t)
    msgs, r = run_actions(env, t, env.solve(t))
    item = t.spec["item"]
    assert msgs[1:] == [("assistant", _pre(t, item)), ("obs", f"{item} has {t.spec['current']}"),
                        ("assistant", _op(t, item, t.spec["qty"])), ("obs", "ok"),
                        ("assistant", "commit")]
    assert r == 1.0


def test_inventory_op_before_prereq(env, tasks):
    for t in _by_family(tasks, "inventory"):
        item, q = t.spec["item"], t.spec["qty"]
        ep = env.episode(t)
        assert ep.step(_op(t, item, q)).observation == "error locked"
        ep.step("commit")
        assert ep.reward() == 0.0  # closed before the goal held: no check met
        _, r = run_actions(env, t, [_op(t, item, q), _pre(t, item), "commit"])
        assert r == 0.0  # the prerequisite alone earns nothing: every check needs the goal
        # the goal reached but never committed: one of the two checks
        _, r = run_actions(env, t, [_pre(t, item), _op(t, item, q)])
        assert r == pytest.approx(1 / 2)


def test_bank_op_before_prereq(env, tasks):
    for t in _by_family(tasks, "bank"):
        u, a, c = t.spec["user"], t.spec["amount"], _c(t)
        ep = env.episode(t)
        assert ep.step(_op(t, u, a)).observation == "error denied"
        assert ep.step(_pre(t)).observation == "authed"  # not a bare "ok": it names the step
        assert ep.step("logout").done
        assert ep.reward() == 0.0
        # paying twice overshoots the goal
        _, r = run_actions(env, t, [_pre(t), _op(t, u, a), _op(t, u, a), "logout"])
        assert r == 0.0
        # logging out before paying ends the episode: the payment never happens
        _, r = run_actions(env, t, [_pre(t), "logout", _op(t, u, a)])
        assert r == 0.0


def test_thermo_wrong_mode_room_or_no_read(env, tasks):
    for t in _by_family(tasks, "thermo"):
        s, c = t.spec, _c(t)
        right = "heat" if s["target"] > s["current"] else "cool"
        wrong = "cool" if right == "heat" else "heat"
        ep = env.episode(t)
        ep.step(_pre(t, s['room']))
        assert ep.step(f"mode {wrong}").observation == f"{wrong} on"
        assert ep.step(_op(t, s["room"], s["target"])).observation == "error mode"
        ep.step("save")
        assert ep.reward() == 0.0
        # no reading first: refused even with the right mode
        ep = env.episode(t)
        ep.step(f"mode {right}")
        assert ep.step(_op(t, s["room"], s["target"])).observation == "error stale"
        # wrong room
        other = 1 + (s["room"] % 5)
        ep = env.episode(t)
        ep.step(f"mode {right}")
        assert ep.step(_op(t, other, s["target"])).observation == "error room"


def test_thermo_read_reveals_current(env, tasks):
    for t in _by_family(tasks, "thermo")[:10]:
        ep = env.episode(t)
        obs = ep.step(_pre(t, t.spec['room'])).observation
        assert obs == f"room {t.spec['room']} is {t.spec['current']}"


def test_ticket_op_before_prereq(env, tasks):
    for t in _by_family(tasks, "ticket"):
        i, a, c = t.spec["ticket"], t.spec["agent"], _c(t)
        ep = env.episode(t)
        assert ep.step(_op(t, i, a)).observation == "error unknown"
        res = ep.step(f"close {i}")
        assert res.done
        assert ep.reward() == 0.0
        # wrong agent
        wrong = next(x for x in ("kim", "lee", "max", "ned") if x != a)
        _, r = run_actions(env, t, [_pre(t, i), _op(t, i, wrong), f"close {i}"])
        assert r == 0.0


def test_wrong_key_refuses_the_prerequisite(env, tasks):
    for t in tasks[:40]:
        c, fam = _c(t), FAMILIES[t.family]
        wrong = next(k for k in fam.pools["key"] if k != c["key"])
        ep = env.episode(t)
        assert ep.step(" ".join([c["prereq"], "as", wrong, *fam.prereq_args(t.spec)])).observation == "error key"
        assert ep.step(c["prereq"]).observation == "error key"  # no key at all
        # the right key without its marker, or after the unit's marker, is not the convention either
        assert ep.step(" ".join([c["prereq"], c["key"], *fam.prereq_args(t.spec)])).observation == "error key"
        assert ep.step(" ".join([c["prereq"], "in", c["key"], *fam.prereq_args(t.spec)])).observation == "error key"
        assert not fam.prereq_done(ep.state)


def test_wrong_unit_and_swapped_arguments(env, tasks):
    for t in tasks:
        c, fam = _c(t), FAMILIES[t.family]
        a, b = fam.op_args(t.spec)
        ep = env.episode(t)
        wrong_unit = next(u for u in fam.pools["unit"] if u != c["unit"])
        assert ep.step(f"{c['op']} in {wrong_unit} {a} {b}").observation == "error unit"
        assert env.episode(t).step(f"{c['op']} in {c['unit']} {a}").observation == "error args"
        assert env.episode(t).step(f"{c['op']} {c['unit']} {a} {b}").observation == "error args"  # no marker
        if t.family != "thermo":  # (two digits there: swapped, they address the wrong room)
            assert env.episode(t).step(f"{c['op']} in {c['unit']} {b} {a}").observation == "error args"


@pytest.mark.parametrize("actions", [[], [""], ["   "], ["hello world"], ["lookup"], ["pay 1 2 3 4"],
                                     ["commit commit"], ["\x00 ???"]])
def test_empty_or_garbage_actions_score_low(env, tasks, actions):
    for t in tasks[:40]:
        _, r = run_actions(env, t, actions)
        # none of these actions is valid in any world (the goal is never already met), so
        # nothing changes and no check holds
        assert r == 0.0, (t.task_id, actions, r)


def test_garbage_observation_is_error(env, tasks):
    for t in tasks[:8]:
        ep = env.episode(t)
        assert ep.step("frobnicate 3").observation == "error unknown"


def test_reward_in_unit_interval(env, tasks):
    rng = random.Random(0)
    seen = set()
    for t in tasks:
        for noise in (0.0, 0.3, 0.7, 1.0):
            _, r = run_actions(env, t, env.solve(t, rng=rng, noise=noise))
            assert 0.0 <= r <= 1.0
            seen.add(r)
    assert {0.0, 1 / 2, 1.0} == seen


def test_episode_ends_at_max_turns(tasks):
    for mt in (1, 3, 5):
        env = ToolEnv(max_turns=mt)
        for t in tasks[:8]:
            ep = env.episode(t)
            for k in range(1, mt + 1):
                res = ep.step("frobnicate")
                assert res.done == (k == mt)
                if res.done:
                    assert res.observation is None
                else:
                    assert res.observation == "error unknown"
            with pytest.raises(RuntimeError, match="already over"):
                ep.step("frobnicate")
            assert ep.reward() == 0.0


def test_closing_tool_ends_episode(env, tasks):
    for t in tasks[:20]:
        ep = env.episode(t)
        assert isinstance(ep, Episode)
        acts = env.solve(t)
        for a in acts[:-1]:
            assert not ep.step(a).done
        assert ep.step(acts[-1]).done


def test_run_actions_stops_at_done(env, tasks):
    t = _by_family(tasks, "bank")[0]
    msgs, r = run_actions(env, t, env.solve(t) + [_pre(t), _op(t, "ana", 1)])
    assert r == 1.0
    assert sum(role == "assistant" for role, _ in msgs) == 3


def test_make_env_uses_params():
    p = default_params({"envs": {"tool_families": ["thermo"], "max_turns": 2}})
    env = make_env("tool", p.envs)
    assert env.max_turns == 2 and env.families == ["thermo"]
    assert {t.family for t in env.generate(0, 6)} == {"thermo"}


# ----------------------------------------------------------------- hidden information


def test_prompt_never_names_a_tool_or_unit(env, tasks):
    hidden = set(env.convention_words()) | {"mode", "heat", "cool"}
    for t in tasks:
        words = set(t.prompt.split())
        assert not (words & hidden), (t.prompt, words & hidden)
        assert "current" not in t.prompt  # nor the hidden current state


def test_prompt_states_the_goal(env, tasks):
    for t in tasks:
        s, w = t.spec, t.prompt.split()
        assert w[:4] == [*t.world.split(), t.family, ":"]
        w = w[2:]  # the checks below index from the family name
        if t.family == "inventory":
            assert w[2:] == ["set", s["item"], "to", str(s["qty"])]
        elif t.family == "bank":
            assert w[2:] == ["send", str(s["amount"]), "to", s["user"]]
        elif t.family == "thermo":
            assert w[2:] == ["set", "room", str(s["room"]), "to", str(s["target"])]
        else:
            assert w[2:] == ["resolve", str(s["ticket"]), "for", s["agent"]]


# ----------------------------------------------------------------- vocabulary


def test_vocabulary_covers_prompts_solutions_observations(env, tasks):
    vocab = set(env.vocabulary())
    rng = random.Random(1)
    missing: set[str] = set()
    for t in tasks:
        missing |= set(t.prompt.split()) - vocab
        for noise in (0.0, 0.5, 1.0):
            for _ in range(3 if noise else 1):
                msgs, _ = run_actions(env, t, env.solve(t, rng=rng, noise=noise))
                for _, text in msgs:
                    missing |= set(text.split()) - vocab
        # every observation, including the last one (dropped when the episode ends)
        ep = env.episode(t)
        for a in env.solve(t):
            missing |= set((FAMILIES[t.family].step(ep.state, a.split()) or "").split()) - vocab
    assert not missing, sorted(missing)


def test_vocabulary_sorted_unique(env):
    v = env.vocabulary()
    assert v == sorted(set(v))
    assert all(w and " " not in w for w in v)
