"""The stage registry: every pipeline stage declared once.

A :class:`Command` is a ``lopd`` subcommand that runs stage code: its name, help, arguments and the
module whose ``run`` it calls. A :class:`Stage` is a ``dvc.yaml`` stage: the command line it runs, the
params keys and data it reads, its outputs and its matrix. From these two tables come the command
line's parser and dispatch (:mod:`lopd.dispatch`), the warm worker's preload (:mod:`lopd.warm`) and
``dvc.yaml`` itself (``lopd dvc-yaml``, :mod:`lopd.workflow.dvcgen`), whose code deps are computed
from the import graph of each stage's module (:mod:`lopd.workflow.codegraph`), not listed here.

Adding a stage: a module under ``lopd/stages/`` with ``run(params, paths, **args)``, a
:class:`Command` and a :class:`Stage` here, then ``lopd dvc-yaml`` (``docs/architecture.md``).

This module imports nothing from the pipeline: stage modules are named by strings, so importing the
registry (every ``lopd`` command does) costs nothing and adds no stage's code to another's deps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arg:
    """One command-line argument, as :meth:`argparse.ArgumentParser.add_argument` takes it; ``dest``
    (the attribute name) is also the keyword the stage's ``run`` receives."""

    flags: tuple[str, ...]
    help: str = ""
    type: type | None = None
    default: Any = None
    required: bool = False
    action: str | None = None

    @property
    def dest(self) -> str:
        return self.flags[0].lstrip("-").replace("-", "_")

    def add_to(self, parser) -> None:
        kw: dict[str, Any] = {"help": self.help}
        if self.action:
            kw["action"] = self.action
        else:
            kw["type"] = self.type
            if self.flags[0].startswith("-"):
                kw["default"] = self.default
                kw["required"] = self.required
        parser.add_argument(*self.flags, **kw)


@dataclass(frozen=True)
class Command:
    """A ``lopd`` subcommand that runs stage code: ``module.run(params, paths, **args)`` after the params
    are loaded and validated (``loads_params=False``: ``module.run(paths, **args)``, for a command that
    hashes params rather than reading them)."""

    name: str
    module: str
    help: str
    args: tuple[Arg, ...] = ()
    loads_params: bool = True


@dataclass(frozen=True)
class Stage:
    """A ``dvc.yaml`` stage. ``argv``: the command's arguments (``${item.*}`` for a matrix item);
    ``deps``: the data it reads (its code deps are computed); ``fingerprint``: the ``code_*`` stage
    whose output stands in for its code and params (a matrix stage); ``fingerprints``: for a
    ``code_*`` stage, the command whose code it hashes; ``doc``: the comment above it in ``dvc.yaml``."""

    name: str
    command: str
    argv: str = ""
    deps: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    outs: tuple[str, ...] = ()
    uncached_outs: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    matrix: dict[str, str] | None = None
    fingerprint: str | None = None
    fingerprints: str | None = None
    doc: str = ""


# --------------------------------------------------------------------------- commands
_DRAW = Arg(("--draw",), type=int, help="upstream draw of the final runs' training seed DRAW (models/draws/); "
                                         "default: the shared draw (models/bank, models/cold_start)")
_ARM = Arg(("--arm",), required=True, help="the arm (train.arms)")
_SEED_ALONE = Arg(("--seed",), type=int, help="that seed only, alone (train: the path of a run across processes)")

COMMANDS: tuple[Command, ...] = (
    Command("prepare", "lopd.stages.prepare", "write the sealed train/val/test splits"),
    Command("base", "lopd.stages.base", "train (or fingerprint) the base policy and evaluate it on val"),
    Command("bank", "lopd.stages.bank", "build the experience bank from base rollouts on train", (_DRAW,)),
    Command("cold-start", "lopd.stages.cold_start", "composer cold start (phi0)", (_DRAW,)),
    Command("probe", "lopd.stages.probe", "privilege probe: teacher delta with relevant/shuffled/none context on val"),
    Command("hpo", "lopd.stages.hpo", "validation-only search over margin, K, n_ret", (
        Arg(("--worker",), action="store_true", help="join the existing study as an extra worker"),
        Arg(("--storage",), help="Optuna storage URL (default: the journal file)"),
        Arg(("--n-trials",), type=int, help="the study's budget of finished trials, shared by the stage and every "
                                            "worker: each stops once it is reached (default: hpo.n_trials)"))),
    Command("train", "lopd.stages.train", "train every seed of one arm, as one population", (_ARM, _SEED_ALONE)),
    Command("evaluate", "lopd.stages.evaluate", "evaluate every trained seed of one arm on the test split",
            (_ARM, _SEED_ALONE)),
    Command("sensitivity", "lopd.stages.sensitivity", "validation sensitivity grid around the selected point"),
    Command("confirm-split", "lopd.stages.confirm_split", "write the sealed confirmatory test split (no prompt or "
                                                           "solution of train, val or test)"),
    Command("register", "lopd.stages.register", "write registration/registration.json: the rule, S, arms, seeds, "
                                                 "effect, design, before any confirmatory read"),
    Command("confirm-draw", "lopd.stages.confirm_draw", "the bank and cold start of one confirmation seed",
            (Arg(("--seed",), type=int, required=True),)),
    Command("confirm-train", "lopd.stages.confirm_train", "the rule's arms at one point of S on every confirmation "
                                                           "seed", (Arg(("--slot",), type=int, required=True,
                                                                        help="the slot of S (confirm.slots)"),)),
    Command("confirm-evaluate", "lopd.stages.confirm_evaluate", "evaluate the confirmation's students on the "
                                                                 "confirmatory split (refuses without registration.json)"),
    Command("report", "lopd.stages.report", "tables, figures and audits under reports/"),
    Command("fingerprint", "lopd.stages.fingerprint", "hash the code deps and params values a dvc.yaml stage "
                                                       "declares (code_train, code_evaluate) into that stage's output",
            (Arg(("stage",), help="the dvc.yaml stage whose deps are hashed, e.g. code_train"),), loads_params=False),
)

# --------------------------------------------------------------------------- params groups
WORLDS = ("envs.domains", "envs.tool_families", "envs.n_target_worlds", "envs.n_pretrain_worlds", "envs.n_options",
          "envs.null_world", "envs.seed", "envs.max_turns")
SPLIT_SIZES = ("envs.n_train", "envs.n_val", "envs.n_test")
ADAPTERS = ("model.name_or_path", "model.max_seq_len", "model.dtype", "model.device", "model.lora_r",
            "model.lora_alpha", "model.lora_target_modules", "model.torch_threads")
SAMPLING = ("evaluate.temperature", "evaluate.greedy", "evaluate.max_new_tokens", "evaluate.batch_size")
SAMPLING_NO_GREEDY = ("evaluate.temperature", "evaluate.max_new_tokens", "evaluate.batch_size")
TRAIN_LOOP = ("train.steps", "train.tasks_per_step", "train.group_size", "train.lr_student", "train.lr_composer",
              "train.margin", "train.K", "train.n_ret", "train.lambda_anchor", "train.eta_beta", "train.beta_init",
              "train.beta_rate", "train.beta_fixed", "train.top_m", "train.support", "train.temperature",
              "train.rollout_budget", "train.val_every", "train.val_tasks", "train.checkpoint_every",
              "train.beta_max", "train.infeasible_patience", "train.recompute_context_passes",
              "train.population_size", "train.val_samples_per_task")
RUN = (*ADAPTERS, *WORLDS, *SAMPLING, "bank.embedder", "cold_start.k_max")  # what a training run reads beside train.*
COLD_START = ("model.name_or_path", "model.dtype", "model.device", "model.lora_r", "model.lora_alpha",
              "model.lora_target_modules", "model.torch_threads", "bank.embedder", "cold_start", "train.K",
              "hpo.k_choices")
BANK = (*ADAPTERS, *WORLDS, *SAMPLING_NO_GREEDY, "bank", "train.n_ret")
SPLITS = ("data/splits/manifest.json", "data/splits/train.jsonl", "data/splits/val.jsonl")
SEED_MATRIX = ("train.seeds", "train.extra_arms", "train.extra_seeds")

# --------------------------------------------------------------------------- stages
STAGES: tuple[Stage, ...] = (
    Stage("prepare", "prepare", params=(*WORLDS[:6], "envs.max_turns", *SPLIT_SIZES, "envs.seed"),
          outs=("data/splits/train.jsonl", "data/splits/val.jsonl", "data/splits/test.jsonl",
                "data/splits/manifest.json")),
    Stage("base", "base", deps=("data/splits/manifest.json", "data/splits/val.jsonl"),
          params=("model.name_or_path", "model.arch", "model.hidden_size", "model.num_layers", "model.num_heads",
                  "model.num_kv_heads", "model.intermediate_size", "model.max_seq_len", "model.device",
                  "model.torch_threads", *WORLDS, "base", *SAMPLING),
          outs=("models/base", "results/base")),
    Stage("bank", "bank", deps=(*SPLITS, "models/base"), params=BANK, outs=("models/bank",)),
    Stage("cold_start", "cold-start", deps=("models/base", "models/bank"), params=COLD_START,
          outs=("models/cold_start",)),
    Stage("bank_draw", "bank", "--draw ${item.seed}", matrix={"seed": "${train.seeds}"},
          deps=(*SPLITS, "models/base"), params=(*BANK, "train.per_seed_draws"),
          outs=("models/draws/bank-${item.seed}",),
          doc="The upstream draws of the final runs: training seed s of every arm reads bank draw s and cold-start "
              "draw s (lopd.stages.common.upstream_seed: with train.per_seed_draws each seed its own draw, so the "
              "rule's tests over seeds cover the bank and cold-start randomness; without, every draw is the shared "
              "one above). The shared draw (bank, cold_start) is what the search, probe and sensitivity use; "
              "base.seed is one draw for all. *_extra: the same over train.extra_seeds."),
    Stage("bank_draw_extra", "bank", "--draw ${item.seed}", matrix={"seed": "${train.extra_seeds}"},
          deps=(*SPLITS, "models/base"), params=(*BANK, "train.per_seed_draws"),
          outs=("models/draws/bank-${item.seed}",)),
    Stage("cold_start_draw", "cold-start", "--draw ${item.seed}", matrix={"seed": "${train.seeds}"},
          deps=("models/base", "models/draws/bank-${item.seed}"), params=(*COLD_START, "train.per_seed_draws"),
          outs=("models/draws/cold_start-${item.seed}",)),
    Stage("cold_start_draw_extra", "cold-start", "--draw ${item.seed}", matrix={"seed": "${train.extra_seeds}"},
          deps=("models/base", "models/draws/bank-${item.seed}"), params=(*COLD_START, "train.per_seed_draws"),
          outs=("models/draws/cold_start-${item.seed}",)),
    Stage("hpo", "hpo", deps=(*SPLITS, "models/base", "models/bank", "models/cold_start"),
          params=(*RUN, "cold_start.n_ret_max", *TRAIN_LOOP, "hpo"),
          outs=("hpo/best_params.yaml", "hpo/trials.csv", "hpo/margin_paths.csv", "hpo/reruns.csv",
                "hpo/selection.json", "hpo/baselines.yaml", "hpo/baselines.csv", "hpo/result.json", "hpo/arms")),
    Stage("probe", "probe", deps=(*SPLITS, "models/base", "models/bank", "models/cold_start", "hpo/best_params.yaml"),
          params=(*RUN, "probe", "train.K", "train.n_ret", "train.use_best_params"), outs=("results/probe",)),
    Stage("sensitivity", "sensitivity",
          deps=(*SPLITS, "models/base", "models/bank", "models/cold_start", "hpo/best_params.yaml",
                "hpo/baselines.yaml"),
          params=(*RUN, *TRAIN_LOOP, "train.use_best_params", "sensitivity"), outs=("results/sensitivity",)),
    Stage("code_train", "fingerprint", "code_train", fingerprints="train",
          params=(*RUN, *TRAIN_LOOP, "train.use_best_params"), uncached_outs=("fingerprints/train.json",),
          doc="One fingerprint per matrix stage kind: the lopd code and the params every train (evaluate) item reads "
              "are declared once, here, and hashed into one small file that the matrix items depend on instead of "
              "~35 code files and ~40 params keys each (DVC re-parses params.yaml for every stage that declares "
              "params, and rewrites dvc.lock after every stage). A change to any reruns every item of the kind; the "
              "items keep their data deps (a job run alone, e.g. by lopd launch, checks out what they name)."),
    Stage("code_evaluate", "fingerprint", "code_evaluate", fingerprints="evaluate",
          params=("model.name_or_path", "model.max_seq_len", "model.dtype", "model.device", "model.lora_r",
                  "model.lora_alpha", "model.torch_threads", "envs.eval_domains", *WORLDS, "evaluate"),
          uncached_outs=("fingerprints/evaluate.json",)),
    Stage("train", "train", "--arm ${item.arm}", matrix={"arm": "${train.arms}"}, fingerprint="code_train",
          deps=(*SPLITS, "models/base", "models/draws", "hpo/best_params.yaml", "hpo/baselines.yaml"),
          params=SEED_MATRIX, outs=("runs/${item.arm}",),
          doc="One stage per arm: every training seed of the arm (train.seeds_of) in one process, as one population "
              "(lopd.population: each seed its own adapters, optimiser, beta, random streams and upstream draw)."),
    Stage("evaluate", "evaluate", "--arm ${item.arm}", matrix={"arm": "${train.arms}"}, fingerprint="code_evaluate",
          deps=("runs/${item.arm}", "data/splits/manifest.json", "data/splits/test.jsonl", "models/base"),
          params=SEED_MATRIX, outs=("results/eval/${item.arm}",),
          doc="The ONLY stage that reads the test split."),
    Stage("confirm_split", "confirm-split", deps=("data/splits/manifest.json",),
          params=(*WORLDS[:6], "envs.max_turns", *SPLIT_SIZES, "envs.seed", "envs.n_confirm", "confirm.split_round"),
          outs=("data/confirm",),
          doc="The confirmation (lopd.confirmation): the final runs above are the pilot (exploratory). "
              "confirm_split draws a fresh test split sharing no prompt or solution with train, val or test; "
              "register writes registration.json (rule, S, arms, seeds, effect, design) from the search's val "
              "outputs and the pilot's results; confirm_draw@seed and confirm_train@slot train the rule's arms at "
              "every point of S on fresh seeds; confirm_evaluate, the ONLY stage that reads the confirmatory split, "
              "depends on registration.json."),
    Stage("confirm_draw", "confirm-draw", "--seed ${item.seed}", matrix={"seed": "${confirm.seeds}"},
          deps=(*SPLITS, "models/base"),
          params=(*ADAPTERS, *WORLDS, *SAMPLING_NO_GREEDY, "bank", "cold_start", "train.K", "train.n_ret",
                  "hpo.k_choices", "train.per_seed_draws", "confirm.seeds"),
          outs=("models/confirm_draws/seed-${item.seed}",)),
    Stage("register", "register",
          deps=("hpo/selection.json", "hpo/trials.csv", "hpo/margin_paths.csv", "hpo/baselines.yaml", "results/eval",
                "data/confirm/manifest.json", "registration/ledger.yaml"),
          params=("report.alpha", "report.rule", "report.design", "confirm.slots", "confirm.seeds", "confirm.effect",
                  "confirm.efficiency_fractions", "confirm.efficiency_baseline", "confirm.mechanism_controls",
                  "envs.n_train", "envs.domains",
                  "bank.rollouts_per_task", "train.steps", "train.rollout_budget", "train.tasks_per_step"),
          outs=("registration/registration.json",)),
    Stage("confirm_train", "confirm-train", "--slot ${item.slot}", matrix={"slot": "${confirm.slots}"},
          deps=("registration/registration.json", *SPLITS, "models/base", "models/confirm_draws"),
          params=(*RUN, *TRAIN_LOOP, "confirm.slots"), outs=("confirm/runs/p${item.slot}",)),
    Stage("confirm_evaluate", "confirm-evaluate",
          deps=("registration/registration.json", "confirm/runs", "data/confirm", "models/base"),
          params=("model.name_or_path", "model.max_seq_len", "model.dtype", "model.device", "model.lora_r",
                  "model.lora_alpha", "model.torch_threads", *WORLDS, "evaluate", "confirm.slots"),
          outs=("confirm/eval",)),
    Stage("report", "report",
          deps=("runs", "results/eval", "results/probe", "hpo/trials.csv", "hpo/margin_paths.csv", "hpo/selection.json",
                "hpo/baselines.yaml", "hpo/baselines.csv", "hpo/reruns.csv", "hpo/arms",
                "registration/registration.json", "registration/ledger.yaml", "confirm/eval",
                "data/confirm/manifest.json", "results/sensitivity",
                "data/splits/manifest.json"),
          params=("envs.domains", "envs.n_train", "report", "train.per_seed_draws", "bank.scripted_demos",
                  "bank.rollouts_per_task"),
          uncached_outs=("reports/main_table.md", "reports/main_table.tex", "reports/comparisons.md",
                         "reports/falsification.md", "reports/seed_variance.md", "reports/leakage_audit.md",
                         "reports/margin_dynamics.md", "reports/margin_dose.md", "reports/efficiency.md",
                         "reports/search.md", "reports/figures",
                         "reports/plots", "reports/summary.json", "reports/README.md"),
          metrics=("reports/metrics",)),
)

PLOTS: tuple[dict, ...] = (
    {"learning_curves": {"template": "arm_band", "x": "step", "y": {"reports/plots/learning_curves.csv": "val_reward"},
                         "title": "Validation reward per step (mean over seeds, band min-max)"}},
    {"delta_phi": {"template": "arm_band", "x": "step", "y": {"reports/plots/margin_dynamics.csv": "delta_phi"},
                   "title": "Privilege margin Delta(phi) per step"}},
    {"beta": {"template": "arm_band", "x": "step", "y": {"reports/plots/margin_dynamics.csv": "beta"},
              "title": "Dual variable beta per step"}},
    {"margin_sat_frac": {"template": "arm_band", "x": "step",
                         "y": {"reports/plots/margin_dynamics.csv": "margin_sat_frac"},
                         "title": "Fraction of supervised tokens with delta >= m, per step"}},
    {"efficiency": {"template": "arm_band", "x": "rollouts_used", "y": {"reports/plots/efficiency.csv": "val_reward"},
                    "title": "Validation reward vs rollouts used (mean over seeds, band min-max)"}},
    {"sensitivity": {"template": "param_facet", "x": "value", "y": {"reports/plots/sensitivity.csv": "val_reward"},
                     "title": "Validation reward vs m, K, n_ret (grid mean, search trials as points)"}},
    {"margin_dose": {"template": "arm_band", "x": "margin", "y": {"reports/plots/margin_dose.csv": "val_reward"},
                     "title": "Validation reward vs margin m, one line per eta_beta; reference arms flat"}},
)


def command(name: str) -> Command:
    """The registered command ``name`` (KeyError naming the known ones otherwise)."""
    for c in COMMANDS:
        if c.name == name:
            return c
    raise KeyError(f"no stage command {name!r}; registered: {', '.join(c.name for c in COMMANDS)}")


def stage(name: str) -> Stage:
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(f"no stage {name!r}; registered: {', '.join(s.name for s in STAGES)}")


def stage_modules() -> tuple[str, ...]:
    """The module of every command, for the warm worker's preload."""
    return tuple(dict.fromkeys(c.module for c in COMMANDS))


def check() -> list[str]:
    """Problems in the tables themselves: a stage naming no command, a fingerprint naming no ``code_*``
    stage, a duplicate name."""
    names = [s.name for s in STAGES]
    cmds = {c.name for c in COMMANDS}
    out = [f"stage {n!r} declared twice" for n in sorted({n for n in names if names.count(n) > 1})]
    out += [f"stage {s.name!r} runs unknown command {s.command!r}" for s in STAGES if s.command not in cmds]
    out += [f"stage {s.name!r} depends on unknown fingerprint stage {s.fingerprint!r}" for s in STAGES
            if s.fingerprint and s.fingerprint not in names]
    out += [f"stage {s.name!r} fingerprints unknown command {s.fingerprints!r}" for s in STAGES
            if s.fingerprints and s.fingerprints not in cmds]
    return out
