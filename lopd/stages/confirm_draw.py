"""Stage ``confirm_draw@{seed}``: the experience bank and φ0 of the confirmation's training seed ``seed``
(``models/confirm_draws/seed-<seed>/{bank,cold_start}``), drawn as the pilot's per-seed draws are
(:func:`lopd.stages.common.upstream_seed`) and shared by every point of S, so contrasts pair across points."""

from __future__ import annotations

from lopd.config import Params
from lopd.errors import BadInput
from lopd.paths import Paths


def run(params: Params, paths: Paths, seed: int) -> dict:
    from lopd.stages import bank, cold_start

    if seed not in params.confirm.seeds:
        raise BadInput(f"seed {seed} is not a confirmation seed (confirm.seeds {params.confirm.seeds})")
    bank_dir, cold_dir = paths.confirm_draw(seed)
    manifest = bank.run(params, paths, draw=seed, out_dir=bank_dir)
    result = cold_start.run(params, paths, draw=seed, dirs=(bank_dir, cold_dir), stage=f"confirm_draw@{seed}")
    return {"bank": manifest, "cold_start": result}
