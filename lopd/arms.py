"""The arm registry: every method compared is a set of switches on the one trainer loop.

The CLI, params validation, ``dvc.yaml`` and the report all read :data:`ARMS`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from lopd.errors import BadInput


@dataclass(frozen=True)
class ArmSpec:
    name: str
    trains: bool = True  # False: evaluation only (the base policy)
    objective: Literal["none", "sft", "grpo", "kd"] = "kd"  # what θ minimises
    # what the teacher is conditioned on: retrieved latents, retrieved text, one learned context, nothing
    context: Literal["none", "latent", "text", "learned"] = "latent"
    bank_mode: Literal["relevant", "shuffled", "unrelated", "none"] = "relevant"
    train_composer: bool = True  # φ updated (else frozen at the cold-start φ0)
    margin: bool = True  # the privilege-margin constraint with dual variable β
    # how β moves when ``margin``: "dual" ascent on m − Δ(φ) (the method), "ramp" β_t = β_0 + r·t open loop
    # (r = train.beta_rate, null = η_β·m: what dual ascent does while Δ ≪ m), "fixed" β = train.beta_fixed
    beta_schedule: Literal["dual", "ramp", "fixed"] = "dual"
    grouped: bool = False  # GRPO groups of G rollouts per task
    use_selected: bool = True  # take m, K, n_ret from the validation search
    # which of the search's points: its "selected" one, or "binding": the best trial whose margin binds
    point: Literal["selected", "binding"] = "selected"
    description: str = ""

    def unread_coordinates(self) -> tuple[str, ...]:
        """The search point's coordinates this arm's runs never read: without a margin, m and η_β (no dual variable,
        no ramp). Two runs of the arm that differ only there train the same bits
        (``tests/integration/test_shared_runs.py``), so the confirmation trains them once."""
        return ("margin", "eta_beta") if not self.margin else ()

    def to_dict(self) -> dict:
        return asdict(self)


ARMS: dict[str, ArmSpec] = {
    a.name: a
    for a in [
        ArmSpec("base", trains=False, objective="none", context="none", bank_mode="none", train_composer=False,
                margin=False, use_selected=False, description="base policy, no training"),
        ArmSpec("sft", objective="sft", context="none", bank_mode="none", train_composer=False, margin=False,
                use_selected=False, description="rejection-sampling fine-tuning on the student's own successes"),
        ArmSpec("grpo", objective="grpo", context="none", bank_mode="none", train_composer=False, margin=False,
                grouped=True, use_selected=False, description="GRPO: group-normalised advantages, no KL"),
        ArmSpec("opsd_text", context="text", train_composer=False, margin=False,
                description="on-policy self-distillation, teacher reads retrieved trajectories as text"),
        ArmSpec("lopd_frozen", train_composer=False, margin=False, description="LOPD with the composer fixed at φ0"),
        ArmSpec("lopd_nomargin", margin=False, description="LOPD joint optimisation with m = 0 and β = 0"),
        ArmSpec("lopd_nocontent", context="learned", bank_mode="none",
                description="control: one learned context for every task, no retrieval (context without content)"),
        ArmSpec("lopd", description="LOPD: joint θ/φ with the privilege-margin constraint"),
        ArmSpec("lopd_ramp", beta_schedule="ramp",
                description="control: β_t = r·t open loop (r = η_β·m of the selected point), no Δ(φ) feedback"),
        ArmSpec("lopd_fixbeta", beta_schedule="fixed",
                description="control: β held at a value chosen on val (η_β = 0), no Δ(φ) feedback"),
        ArmSpec("lopd_binding", point="binding",
                description="the paper's mechanism: LOPD at the best val trial whose margin binds (if any does)"),
        ArmSpec("lopd_shuffled", bank_mode="shuffled", description="control: task→trajectory pairing permuted"),
        ArmSpec("lopd_unrelated", bank_mode="unrelated", description="control: trajectories of another domain"),
    ]
}


def get_arm(name: str) -> ArmSpec:
    if name not in ARMS:
        raise BadInput(f"unknown arm {name!r}; known arms: {', '.join(ARMS)}")
    return ARMS[name]
