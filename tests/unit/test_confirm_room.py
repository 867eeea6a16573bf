"""``bench/confirm_room.py`` counts what stage ``confirm_split`` can draw: a round draws at ``envs.n_confirm``
exactly when the bench's ``fresh`` count for it reaches ``n_confirm`` (both ways, on the tiny params)."""

from __future__ import annotations

import importlib.util

import pytest

from lopd.errors import BadInput
from tests.conftest import REPO, tiny_params_dict


def _bench():
    spec = importlib.util.spec_from_file_location("confirm_room", REPO / "bench" / "confirm_room.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_fresh_count_decides_whether_a_round_can_be_drawn():
    from lopd.config import deep_merge, parse_params
    from lopd import data as data_mod
    from lopd.confirmation.split import generate_confirm

    params = parse_params(deep_merge(tiny_params_dict(), {"envs": {"n_confirm": 56}}), "tiny")
    n = params.envs.n_confirm
    manifest = {"files": {s: {"content": [data_mod.content_key(t) for t in ts]}
                          for s, ts in data_mod.generate_splits(params.envs).items()}}
    bench, seen = _bench(), set()
    for r in range(3):
        fresh = {row["domain"]: row["fresh"] for row in bench.room(params, r, mult=1, pool=False)}
        if min(fresh.values()) >= n:
            tasks, _ = generate_confirm(params.envs, n, manifest, r)
            assert len(tasks) == n * len(params.envs.domains)
            seen.add("drawn")
        else:
            with pytest.raises(BadInput, match="too few tasks left"):
                generate_confirm(params.envs, n, manifest, r)
            seen.add("refused")
            break
    assert seen == {"drawn", "refused"}, f"the tiny pool should allow some rounds and then run out: {fresh}"
