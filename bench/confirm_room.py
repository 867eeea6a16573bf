"""How many fresh confirmatory tasks are left: per domain, after the sealed splits and confirmatory rounds 0..R-1.

    python bench/confirm_room.py [--params params.yaml] [--profile P] [--rounds R] [--mult 4]

A new registration needs a split round no registration has read (``confirm.split_round``,
``registration/ledger.yaml``), and stage ``confirm_split`` draws round r only after drawing rounds 0..r-1 in turn,
each at ``envs.n_confirm`` tasks per domain, excluding by prompt and by solution train, val, test and every earlier
round (:func:`lopd.confirmation.split.generate_confirm`). This draws rounds 0..R-1 exactly so (R: default
``confirm.split_round + 1``), then counts, per domain, how many tasks round R can deal in ``confirm_split``'s own
order, none sharing a prompt or a solution with any of them or with each other: from the stream ``confirm_split``
draws and from one ``--mult`` times as long; and the domain's distinct solutions in a long stream of its generator
(the pool every split and round draws from). ``confirm_split`` can draw round R at ``envs.n_confirm`` exactly when
the first count reaches it (``tests/unit/test_confirm_room.py``). Generates tasks only; reads no split file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def room(params, rounds: int, mult: int = 4, pool: bool = True) -> list[dict]:
    """Per domain: ``pool`` (distinct solutions in a long stream of its generator, with everything drawn),
    ``sealed`` (solutions of train, val and test), ``rounds`` (those the rounds 0..rounds-1 added), and ``fresh``
    / ``fresh_long``: how many tasks round ``rounds`` can deal from its candidate stream (confirm_split's length,
    and ``mult`` times it), counted in :func:`lopd.confirmation.split._draw_round`'s own order (round-robin over
    the target worlds, a task taken bans its prompt and solution), so ``confirm_split`` draws that round at
    ``envs.n_confirm`` exactly when ``fresh >= envs.n_confirm``. ``pool`` False: no pool count (None), faster."""
    import lopd.confirmation.split as cs
    from lopd import data as data_mod
    from lopd.envs import make_env

    ep, n_confirm = params.envs, params.envs.n_confirm
    sealed = data_mod.generate_splits(ep)
    rows = []
    for d_i, domain in enumerate(ep.domains):
        env = make_env(domain, ep)
        n_worlds = len(env.worlds["target"])
        n_cands = data_mod._MAX_DRAWS_PER_TASK * -(-n_confirm // n_worlds) * n_worlds
        mine = [t for ts in sealed.values() for t in ts if t.domain == domain]
        prompts = {data_mod.content_key(t) for t in mine}
        banned = {cs.solution_key(env, t) for t in mine}
        n_sealed = len(banned)
        for r in range(rounds):  # exactly as generate_confirm draws them (the same streams, sizes and exclusions)
            cs._draw_round(env, domain, ep.seed * 1000 + d_i + cs.STREAM_OFFSET + 1000 * r, n_cands, n_worlds,
                           n_confirm, prompts, banned)
        seed_next = ep.seed * 1000 + d_i + cs.STREAM_OFFSET + 1000 * rounds
        fresh = [_dealable(env, data_mod, cs, env.generate(seed_next, n_cands * m), n_worlds, prompts, banned)
                 for m in dict.fromkeys((1, mult))]
        fresh += fresh[-1:]  # mult 1: the long stream is the stream
        n_pool = (len({cs.solution_key(env, t) for t in env.generate(seed_next + 1, n_cands * mult * 4)} | banned)
                  if pool else None)
        rows.append({"domain": domain, "pool": n_pool, "sealed": n_sealed, "rounds": len(banned) - n_sealed,
                     "fresh": fresh[0], "fresh_long": fresh[1]})
    return rows


def _dealable(env, data_mod, cs, cands: list, n_worlds: int, prompts: set, banned: set) -> int:
    """How many tasks ``_draw_round`` deals from ``cands`` before every world's queue is spent (its loop with no
    ``n_confirm``): the first n of them are the ones it draws at n_confirm = n."""
    p_seen, s_seen = set(prompts), set(banned)
    queues = [iter(cands[w::n_worlds]) for w in range(n_worlds)]
    live, w, n = list(range(n_worlds)), 0, 0
    while live:
        q = live[w % len(live)]
        for t in queues[q]:
            p, s = data_mod.content_key(t), cs.solution_key(env, t)
            if p in p_seen or s in s_seen:
                continue
            p_seen.add(p)
            s_seen.add(s)
            n += 1
            w += 1
            break
        else:
            live.remove(q)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default=None, help="a profile over --params (e.g. profiles/smoke.yaml)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds drawn before the count (default: split_round + 1)")
    ap.add_argument("--mult", type=int, default=4, help="the longer stream: this many times confirm_split's")
    args = ap.parse_args()

    from lopd.config import load_params

    params = load_params(args.params, args.profile)
    n_confirm = params.envs.n_confirm
    rounds = params.confirm.split_round + 1 if args.rounds is None else args.rounds
    print(f"envs.n_confirm {n_confirm} per domain; rounds 0..{rounds - 1} drawn, then round {rounds} counted "
          f"(confirm.split_round is {params.confirm.split_round})")
    print(f"{'domain':8} {'pool':>6} {'sealed':>7} {'rounds':>7} {'fresh':>6} {'fresh x' + str(args.mult):>9}  verdict")
    for r in room(params, rounds, args.mult):
        verdict = "ok" if r["fresh"] >= n_confirm else f"round {rounds} cannot be drawn at {n_confirm}"
        print(f"{r['domain']:8} {r['pool']:>6} {r['sealed']:>7} {r['rounds']:>7} {r['fresh']:>6} "
              f"{r['fresh_long']:>9}  {verdict}")
    print("pool: distinct solutions seen (a long stream and everything drawn); sealed: solutions of train, val and "
          "test; rounds: added by the confirmatory rounds; fresh: tasks the next round can deal from its stream "
          "(a new prompt and a new solution each)")


if __name__ == "__main__":
    main()
