"""``dvc.yaml`` written from the stage registry (``lopd dvc-yaml``).

Each :class:`lopd.stages.registry.Stage` becomes one stanza: ``cmd`` from its command and arguments,
``deps`` its data deps then its code deps (computed by :mod:`lopd.workflow.codegraph` from the import
graph of its command's module; a matrix stage depends on its ``code_*`` fingerprint instead, whose
deps are the code of the command it fingerprints and of the fingerprinting itself), ``params``,
``outs`` and ``metrics``. The text is deterministic, so a test compares the committed ``dvc.yaml``
with what this writes, byte for byte, without running anything.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from lopd.stages.registry import COMMANDS, PLOTS, STAGES, Stage, check, command
from lopd.workflow.codegraph import code_deps

WIDTH = 118
HEADER = """\
# GENERATED from lopd/stages/registry.py by `lopd dvc-yaml`: edit the registry, not this file
# (tests/unit/test_registry.py fails when the two differ).
#
# The whole experiment: prepare -> base -> bank -> cold_start -> hpo (val only) -> probe / sensitivity
# -> bank_draw@seed -> cold_start_draw@seed -> train@arm -> evaluate@arm (the ONLY stage that reads the
# test split): the pilot. The confirmation: confirm_split -> register -> confirm_draw@seed -> confirm_train@slot
# -> confirm_evaluate (the ONLY stage that reads the confirmatory split) -> report.
# Every knob is in params.yaml. A stage's code deps are the lopd modules its command's module reaches through
# imports (lopd/workflow/codegraph.py); tests/integration/test_declared_reads.py records what each stage
# imports and reads while the smoke pipeline runs and checks the declarations cover it.
# Commands run `lopd <stage>`; under `dvc repro` each is forked from a warm worker (lopd/warm.py).
"""

_PLAIN = re.compile(r"^[A-Za-z0-9_./@$-][^:#{}\[\],'\"]*$")


def _scalar(v: str, flow: bool) -> str:
    """``v`` plain where YAML reads it back as the same string, else single-quoted."""
    s = str(v)
    plain = _PLAIN.match(s) if flow else not (s[:1] in "{[&*!|>'\"%@`#-" or ": " in s or " #" in s)
    return s if plain and s not in ("true", "false", "null", "yes", "no") else "'" + s.replace("'", "''") + "'"


def _flow_list(key: str, items: list[str], indent: int) -> list[str]:
    """``key: [a, b, ...]`` wrapped at :data:`WIDTH`, continuation lines indented two more."""
    body = ", ".join(_scalar(i, True) for i in items)
    first = " " * indent + f"{key}: ["
    lines = textwrap.wrap(body + "]", width=WIDTH - len(first), break_long_words=False, break_on_hyphens=False)
    out = [first + lines[0]]
    rest = textwrap.wrap(" ".join(lines[1:]), width=WIDTH - indent - 2, break_long_words=False,
                         break_on_hyphens=False) if len(lines) > 1 else []
    return out + [" " * (indent + 2) + r for r in rest]


def _comment(text: str, indent: int) -> list[str]:
    return [" " * indent + "# " + line for line in textwrap.wrap(text, width=WIDTH - indent - 2)]


def stage_code(st: Stage) -> list[str]:
    """The code deps of ``st``: none for a matrix stage behind a fingerprint."""
    if st.fingerprint:
        return []
    modules = [command(st.command).module]
    if st.fingerprints:
        modules.append(command(st.fingerprints).module)
    return code_deps(modules)


def fingerprint_out(name: str) -> str:
    return next(s for s in STAGES if s.name == name).uncached_outs[0]


def stanza(st: Stage) -> list[str]:
    """The lines of one stage."""
    out = _comment(st.doc, 2) if st.doc else []
    out.append(f"  {st.name}:")
    if st.matrix:
        out.append("    matrix: {" + ", ".join(f"{k}: {_scalar(v, True)}" for k, v in st.matrix.items()) + "}")
    out.append("    cmd: " + _scalar(" ".join(p for p in ("lopd", st.command, st.argv) if p), False))
    deps = [*st.deps, *([fingerprint_out(st.fingerprint)] if st.fingerprint else []), *stage_code(st)]
    if deps:
        out += _flow_list("deps", deps, 4)
    if st.params:
        out += _flow_list("params", list(st.params), 4)
    if st.outs:
        out += _flow_list("outs", list(st.outs), 4)
    for key, paths in (("outs", st.uncached_outs), ("metrics", st.metrics)):
        if paths:
            if key == "outs" and st.outs:
                raise ValueError(f"stage {st.name}: cached and uncached outs both declared")
            out.append(f"    {key}:")
            out += [f"    - {_scalar(p, True)}: {{cache: false}}" for p in paths]
    return out


def _plots() -> list[str]:
    out = ["plots:"]
    for plot in PLOTS:
        (name, spec), = plot.items()
        out.append(f"- {name}:")
        for k, v in spec.items():
            if isinstance(v, dict):
                out.append(f"    {k}: {{" + ", ".join(f"{_scalar(a, True)}: {_scalar(b, True)}" for a, b in v.items())
                           + "}")
            else:
                out.append(f"    {k}: {_scalar(v, False)}")
    return out


def render() -> str:
    """The text of ``dvc.yaml``."""
    problems = check()
    if problems:
        raise ValueError("the stage registry is inconsistent: " + "; ".join(problems))
    lines = HEADER.splitlines() + ["stages:"]
    for st in STAGES:
        lines += stanza(st)
    return "\n".join(lines + _plots()) + "\n"


def write(root: Path, check_only: bool = False) -> int:
    """Write ``root/dvc.yaml`` (``check_only``: exit 1 naming the first differing line if it is stale)."""
    path = Path(root) / "dvc.yaml"
    text = render()
    old = path.read_text() if path.exists() else ""
    if check_only:
        if old == text:
            print(f"{path}: up to date with the stage registry")
            return 0
        for i, (a, b) in enumerate(zip(old.splitlines() + [""] * 9999, text.splitlines()), 1):
            if a != b:
                print(f"{path}: stale at line {i}:\n  committed: {a}\n  registry:  {b}\n(run `lopd dvc-yaml`)")
                break
        else:
            print(f"{path}: stale (run `lopd dvc-yaml`)")
        return 1
    if old != text:
        from lopd.utils import atomic_write_text

        atomic_write_text(path, text)
        print(f"wrote {path} ({len(STAGES)} stages, {len(COMMANDS)} commands)")
    else:
        print(f"{path}: already up to date")
    return 0
