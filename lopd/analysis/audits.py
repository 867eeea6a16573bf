"""Audits: where the test split was used (leakage). How noisy the seeds are: :mod:`lopd.analysis.variance`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from lopd.analysis.confirm_report import confirm_split_audit, confirm_split_lines
from lopd.analysis.render import md_table, write_text
from lopd.errors import BadInput
from lopd.utils import content_overlap, read_json

SPLITS = ("train", "val", "test", "confirm")
EVAL_STAGE = "evaluate"
CONFIRM_STAGE = "confirm_evaluate"
REGISTRATION = "registration/registration.json"
HPO_STAGE = "hpo"
CLEAN_LEAKAGE_SENTENCE = (
    "The hyper-parameters (m, K, n_ret) were selected on the validation split only; "
    "no stage other than evaluate depends on or read the test split; "
    "no stage other than confirm_evaluate depends on or read the confirmatory split, and confirm_evaluate "
    "depends on registration/registration.json, so DVC runs register before it; "
    "no val or test task shares its content with a train task."
)


# --------------------------------------------------------------------------- leakage audit
_SPLIT_RE = re.compile(r"(?:^|[/\\\s'\"=])(train|val|test|confirm)\.jsonl\b")
_SPLIT_DIR_RE = re.compile(r"(?:^|[\s'\"=])(?:\./)?data/splits/?(?:$|[\s'\"])")


def _strings(obj) -> list[str]:
    """Every string inside a nested deps/cmd value (lists, dicts: keys and values)."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in _strings(v)]
    return []


def _splits_in(texts: list[str]) -> set[str]:
    found = set()
    for t in texts:
        found |= set(_SPLIT_RE.findall(t))
        if _SPLIT_DIR_RE.search(t) or t.strip().rstrip("/") in ("data/splits", "./data/splits"):
            found |= {"train", "val", "test"}  # the whole split directory, test included
        if t.strip().rstrip("/") in ("data/confirm", "./data/confirm"):
            found.add("confirm")
    return found


def _dvc_deps(root: Path) -> dict | None:
    path = root / "dvc.yaml"
    if not path.exists():
        return None
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise BadInput(f"{path}: not valid YAML: {e}") from None
    out = {}
    for name, stage in (doc.get("stages") or {}).items():
        if not isinstance(stage, dict):
            continue
        body = [stage, stage.get("do") or {}]
        deps = [s for b in body if isinstance(b, dict) for s in _strings(b.get("deps", []))]
        cmds = [s for b in body if isinstance(b, dict) for s in _strings(b.get("cmd", []))]
        out[str(name)] = {"deps": _splits_in(deps), "cmd": _splits_in(cmds),
                          "registered": REGISTRATION in [d.strip().lstrip("./") for d in deps]}
    return out


def _stage_base(name: str) -> str:
    """``train@lopd`` → ``train``; an extra-seed stage is the stage it repeats (``bank_draw_extra`` →
    ``bank_draw``: dvc.yaml gives both the same command, deps and params, which tests/e2e/test_pipeline.py checks)."""
    return name.split("@", 1)[0].removesuffix("_extra")


def _runtime_records(root: Path) -> list[dict]:
    cands: list[tuple[str, Path]] = []
    for p in sorted((root / "results").glob("*/result.json")):
        cands.append((p.parent.name, p))
    for p in sorted((root / "results" / "eval").glob("*/seed-*/result.json")):
        cands.append((EVAL_STAGE, p))
    for p in sorted((root / "models").glob("*/manifest.json")):
        cands.append((p.parent.name, p))
    for p in sorted((root / "models" / "draws").glob("*/manifest.json")):  # bank-<s>, cold_start-<s>
        cands.append((f"{p.parent.name.rpartition('-')[0]}_draw", p))  # dvc.yaml's matrix stage; the path names s
    for p in sorted((root / "confirm" / "eval").glob("*/*/seed-*/result.json")):
        cands.append((CONFIRM_STAGE, p))
    for p in sorted((root / "runs").glob("*/seed-*/splits_read.json")):  # a training run's own record
        cands.append(("train", p))
    for p in sorted((root / "confirm" / "runs").glob("*/*/seed-*/splits_read.json")):
        cands.append(("confirm_train", p))
    for p in sorted((root / "models" / "confirm_draws").glob("seed-*/bank/manifest.json")):
        cands.append(("confirm_draw", p))
    for p in (root / "hpo" / "result.json", root / "results" / "sensitivity" / "result.json"):
        if p.exists():
            cands.append((p.parent.name, p))
    seen, recs = set(), []
    for stage, p in cands:
        if p in seen:
            continue
        seen.add(p)
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError:
            recs.append({"stage": stage, "path": p, "reads": None})
            continue
        if isinstance(d, dict):
            d = d.get("splits_read")
        if isinstance(d, list):  # a result's "splits_read" entry, or a run's splits_read.json (the list itself)
            recs.append({"stage": stage, "path": p, "reads": [r for r in d if isinstance(r, dict)]})
    return recs


def _declared_problems(dvc: dict | None) -> tuple[list[str], list[str]]:
    """(violations, unverified) from the dvc.yaml declarations: a stage other than evaluate that depends
    on or names the test split; no hpo stage, or one that does not depend on the validation split."""
    violations, unverified = [], []
    if dvc is None:
        return violations, ["dvc.yaml not found: stage dependencies cannot be checked"]
    for name, d in dvc.items():
        if _stage_base(name) != EVAL_STAGE and "test" in (d["deps"] | d["cmd"]):
            where = "depends on" if "test" in d["deps"] else "names in its cmd"
            violations.append(f"stage `{name}` {where} the test split (data/splits/test.jsonl)")
        if _stage_base(name) != CONFIRM_STAGE and "confirm" in (d["deps"] | d["cmd"]):
            where = "depends on" if "confirm" in d["deps"] else "names in its cmd"
            violations.append(f"stage `{name}` {where} the confirmatory split (data/confirm)")
        if _stage_base(name) == CONFIRM_STAGE and not d.get("registered"):
            violations.append(f"stage `{name}` does not depend on {REGISTRATION}: nothing orders the registration "
                              "before its confirmatory read")
    hpo = [d for n, d in dvc.items() if _stage_base(n) == HPO_STAGE]
    if not hpo:
        unverified.append("no `hpo` stage in dvc.yaml: where m, K, n_ret were selected cannot be verified")
    elif not any("val" in d["deps"] for d in hpo):
        unverified.append("the `hpo` stage does not declare a dependency on the validation split")
    return violations, unverified


def _unselected_hparams(root: Path, runs, checked_arms) -> list[str]:
    """A warning for each final run of ``checked_arms`` whose m, K or n_ret is not the selected one."""
    best_path = root / "hpo" / "best_params.yaml"
    if not best_path.exists():
        return []
    best = yaml.safe_load(best_path.read_text()) or {}
    out = []
    for arm in checked_arms:
        for seed, run in sorted(runs.get(arm, {}).items()):
            hp = run["result"].get("hparams") or {}
            bad = [k for k in ("margin", "K", "n_ret") if k in best and k in hp and hp[k] != best[k]]
            if bad:
                out.append(f"{arm} seed {seed} used {', '.join(f'{k}={hp[k]}' for k in bad)} but "
                           f"hpo/best_params.yaml selected {', '.join(f'{k}={best[k]}' for k in bad)}")
    return out


def leakage(root: Path, runs, checked_arms) -> dict:
    man_path = root / "data" / "splits" / "manifest.json"
    manifest = {}
    if man_path.exists():
        manifest = {k: v for k, v in ((read_json(man_path) or {}).get("files") or {}).items()}
    dvc = _dvc_deps(root)
    recs = _runtime_records(root)
    violations, unverified = _declared_problems(dvc)
    warnings_: list[str] = []
    for r in recs:
        if r["reads"] is None:
            warnings_.append(f"{r['path'].relative_to(root)} is not valid JSON")
            continue
        for read in r["reads"]:
            split, role = read.get("split"), read.get("role")
            if split == "test" and (r["stage"] != EVAL_STAGE or role != EVAL_STAGE):
                violations.append(f"stage `{r['stage']}` (role {role!r}) read the test split at run time "
                                  f"({r['path'].relative_to(root)})")
            if split == "confirm" and (r["stage"] != CONFIRM_STAGE or role != CONFIRM_STAGE):
                violations.append(f"stage `{r['stage']}` (role {role!r}) read the confirmatory split at run time "
                                  f"({r['path'].relative_to(root)})")
            exp = (manifest.get(split) or {}).get("sha256")
            if exp and read.get("sha256") and read["sha256"] != exp:
                warnings_.append(f"{r['path'].relative_to(root)}: read {split} with SHA-256 {read['sha256'][:12]}… "
                                 f"but the manifest has {exp[:12]}…")
    overlap = None
    content = {s: e.get("content") for s, e in manifest.items() if isinstance(e, dict)}
    if manifest and all(isinstance(v, list) for v in content.values()):
        overlap = content_overlap(content)
        for pair, n in overlap["between"].items():
            if n:
                violations.append(f"splits {pair.replace('-', ' and ')} share {n} tasks by content (same prompt)")
        for split, n in overlap["within"].items():
            if n:
                warnings_.append(f"split {split} holds {n} repeated tasks (same prompt)")
    elif manifest:
        unverified.append("data/splits/manifest.json has no content hashes: content overlap between splits cannot be "
                          "checked (rerun prepare)")
    notes = []
    if not any(r["stage"] == HPO_STAGE and r["reads"] for r in recs):
        notes.append("no run-time record from hpo (hpo/result.json with splits_read): the hpo part of the audit "
                     "rests on the dvc.yaml dependencies only")
    if not man_path.exists():
        unverified.append("data/splits/manifest.json not found: split hashes unknown")
    warnings_ += _unselected_hparams(root, runs, checked_arms)
    confirm = confirm_split_audit(root, content, violations)
    return {"confirm": confirm, "manifest": manifest, "content_overlap": overlap, "dvc": dvc, "records": recs, "violations": violations, "unverified": unverified,
            "warnings": warnings_, "notes": notes, "clean": not violations and not unverified}


def write_leakage(out: Path, lk: dict) -> None:
    md = ["# Leakage audit", ""]
    if lk["violations"]:
        md += ["## ⚠ LEAKAGE VIOLATION ⚠", "",
               "**The test split was used outside the evaluate stage. Test numbers in this report are NOT a clean "
               "held-out estimate.**", ""] + [f"- **VIOLATION:** {v}" for v in lk["violations"]] + [""]
    elif lk["unverified"]:
        md += ["**UNVERIFIED: the audit could not establish that the test split was used only by evaluate and that "
               "m, K, n_ret were selected on validation:**", ""] + [f"- {u}" for u in lk["unverified"]] + [""]
    else:
        md += [CLEAN_LEAKAGE_SENTENCE, ""]
    if lk["violations"] and lk["unverified"]:
        md += ["Also unverified:"] + [f"- {u}" for u in lk["unverified"]] + [""]
    md += ["## Split files (data/splits/manifest.json)", ""]
    if lk["manifest"]:
        md.append(md_table(["split", "path", "n", "SHA-256"],
                            [[s, str(lk["manifest"][s].get("path", "")), str(lk["manifest"][s].get("n", "")),
                              f"`{lk['manifest'][s].get('sha256', '')}`"]
                             for s in [*[x for x in SPLITS if x in lk["manifest"]],
                                       *sorted(set(lk["manifest"]) - set(SPLITS))]]))
    else:
        md.append("MISSING: data/splits/manifest.json.")
    ov = lk.get("content_overlap")
    md += ["", "## Content overlap (tasks with the same prompt, from the manifest's content hashes)", ""]
    if ov is None:
        md.append("UNVERIFIED: the manifest holds no content hashes.")
    else:
        md.append("Splits are disjoint by task id *and* by content: a task whose prompt (world, family, operation, "
                  "arguments) is in train never reappears in val or test. Must be 0 everywhere.")
        md += ["", md_table(["between splits", "shared tasks"], [[k, str(v)] for k, v in ov["between"].items()]),
               "", md_table(["within split", "repeated tasks"], [[k, str(v)] for k, v in ov["within"].items()])]
    md += confirm_split_lines(lk.get("confirm"))
    md += ["", "## Stages: declared dependencies (dvc.yaml) and run-time reads (splits_read records)", "",
           _stage_table(lk)]
    if lk["warnings"]:
        md += ["", "## Warnings", ""] + [f"- {w}" for w in lk["warnings"]]
    if lk["notes"]:
        md += ["", "## Notes", ""] + [f"- {n}" for n in lk["notes"]]
    write_text(out / "leakage_audit.md", "\n".join(md))


def _stage_table(lk: dict) -> str:
    """Each stage's declared split dependencies and the splits it read at run time."""
    runtime: dict[str, dict] = {}
    for r in lk["records"]:
        e = runtime.setdefault(r["stage"], {"splits": set(), "roles": set(), "n": 0})
        e["n"] += 1
        for x in r["reads"] or []:
            e["splits"].add(str(x.get("split")))
            e["roles"].add(str(x.get("role")))
    dvc = lk["dvc"] or {}
    rows, matched = [], set()

    def flag(name):
        return "**VIOLATION**" if any(f"`{name}`" in v for v in lk["violations"]) else ""

    def read_txt(rt):
        if rt is None:
            return "no record"
        return (", ".join(x for x in SPLITS if x in rt["splits"]) or "none") + (
            f" (roles: {', '.join(sorted(rt['roles']))}; {rt['n']} record{'s' if rt['n'] != 1 else ''})")

    for s in dvc:
        d = dvc[s]
        key = s if s in runtime else _stage_base(s)
        rt = runtime.get(key)
        if rt is not None:
            matched.add(key)
        rows.append([f"`{s}`", ", ".join(x for x in SPLITS if x in d["deps"]) or "—",
                     ", ".join(x for x in SPLITS if x in d["cmd"]) or "—", read_txt(rt), flag(s) or flag(key)])
    for s in sorted(set(runtime) - matched):
        rows.append([f"`{s}`", "(not in dvc.yaml)", "—", read_txt(runtime[s]), flag(s)])
    return (md_table(["stage", "deps on splits", "splits named in cmd", "read at run time", ""], rows)
            if rows else "MISSING: neither dvc.yaml stages nor splits_read records found.")

