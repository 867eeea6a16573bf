"""``lopd params``: the effective params, section by section, each key with its value and description.

Effective = the params file, merged with ``--profile`` if given, with ``-S section.key=value``
overrides laid on top (values parsed as YAML, as in ``params.yaml``), and validated. A key whose
value differs from the committed params file (``git show HEAD:params.yaml``; the file on disk
outside git) is marked ``*`` and shows the committed value: that is what the profile, the
overrides or an uncommitted edit changed.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import yaml

from lopd.errors import BadInput

MISSING = object()
VALUE_WIDTH = 60  # longer values (the rule's text) are cut, with an ellipsis


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """``raw`` with each ``section.key=value`` of ``overrides`` set (value parsed as YAML)."""
    out = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not p for p in key.split(".")):
            raise BadInput(f"-S {item!r}: expected section.key=value")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise BadInput(f"-S {item!r}: the value is not valid YAML ({' '.join(str(e).split())})") from None
        *path, last = key.split(".")
        node = out
        for p in path:
            if not isinstance(node.get(p), dict):
                node[p] = {}  # an unknown section or key: validation names it
            node = node[p]
        node[last] = value
    return out


def committed_params(params_file: Path) -> tuple[dict, str]:
    """The committed params (``git show HEAD:<file>``) and where they came from; the file on disk
    when it is not tracked by git."""
    from lopd.config import read_yaml_mapping

    path = params_file.resolve()
    try:
        text = subprocess.run(["git", "show", f"HEAD:./{path.name}"], cwd=path.parent, capture_output=True,
                              text=True, timeout=30, check=True).stdout
        raw = yaml.safe_load(text)
        if isinstance(raw, dict):
            return raw, f"HEAD:{path.name}"
    except (OSError, subprocess.SubprocessError, yaml.YAMLError):
        pass
    return read_yaml_mapping(params_file, "params file"), str(params_file)


def _at(raw: Any, dotted: list[str]) -> Any:
    for p in dotted:
        if not isinstance(raw, dict) or p not in raw:
            return MISSING
        raw = raw[p]
    return raw


def show_value(value: Any) -> str:
    """A value as one line of YAML flow style, cut at :data:`VALUE_WIDTH` characters."""
    if value is MISSING:
        return "(absent)"
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return text if len(text) <= VALUE_WIDTH else text[:VALUE_WIDTH - 1] + "…"


def rows(model, effective: dict, committed: dict, path: list[str], depth: int = 0) -> list[tuple]:
    """``(depth, key, value text, description, committed text or None, is a heading)`` for every key
    of ``model`` at ``path``; a committed text is given only where the value differs."""
    from lopd.config.messages import sub_model

    out: list[tuple] = []
    for name, field in model.model_fields.items():
        sub, keyed = sub_model(field.annotation)
        here = [*path, name]
        if sub is not None and keyed:  # launch.resources: one heading per free name
            out.append((depth, name, "", field.description, None, True))
            for free in _at(effective, here) or {}:
                whose = "every stage not listed" if free == "default" else f"stage {free}"
                out.append((depth + 1, free, "", f"{name} of {whose}", None, True))
                out += rows(sub, effective, committed, [*here, free], depth + 2)
        elif sub is not None:
            out.append((depth, name, "", field.description, None, True))
            out += rows(sub, effective, committed, here, depth + 1)
        else:
            new, old = _at(effective, here), _at(committed, here)
            out.append((depth, name, show_value(new), field.description, None if new == old else show_value(old),
                        False))
    return out


def render(params_file: Path, profile: Path | None, overrides: list[str], sections: list[str]) -> tuple[str, int]:
    """The text ``lopd params`` prints, and how many keys differ from the committed params."""
    from lopd.config import Params, deep_merge, parse_params, read_yaml_mapping

    effective = read_yaml_mapping(params_file, "params file")
    source = str(params_file)
    if profile is not None:
        effective, source = deep_merge(effective, read_yaml_mapping(profile, "profile")), f"{source} + {profile}"
    if overrides:
        effective, source = apply_overrides(effective, overrides), f"{source} + -S overrides"
    parse_params(effective, source)
    unknown = [s for s in sections if s not in Params.model_fields]
    if unknown:
        raise BadInput(f"unknown section(s) {unknown}; sections: {', '.join(Params.model_fields)}")
    committed, committed_from = committed_params(params_file)
    lines = [f"# effective params: {source}", f"# * = differs from the committed params ({committed_from})"]
    changed = 0
    for name, field in Params.model_fields.items():
        if sections and name not in sections:
            continue
        lines += ["", f"{name}:  # {field.description}"]
        table = rows(field.annotation, effective, committed, [name], 1)
        width = max(len("  " * d + k + ": " + v) for d, k, v, _, _, head in table if not head)
        for depth, key, value, desc, old, heading in table:
            mark = "*" if old is not None else " "
            changed += old is not None
            left = "  " * depth + key + ":" + ("" if heading else " " + value)
            note = f"  (committed: {old})" if old is not None else ""
            lines.append(f"{mark}{left:<{width}}  # {desc}{note}".rstrip() if not heading
                         else f" {left}  # {desc}".rstrip())
    lines += ["", f"# {changed} key(s) differ from the committed params"]
    return "\n".join(lines), changed


def show(params_file: str | Path, profile: str | Path | None, overrides: list[str], sections: list[str]) -> int:
    """Print :func:`render`'s text (coloured on a terminal: changed keys highlighted)."""
    from rich.console import Console
    from rich.text import Text

    text, _ = render(Path(params_file), Path(profile) if profile else None, overrides, sections)
    console = Console(soft_wrap=True, highlight=False)
    for line in text.splitlines():
        style = "bold yellow" if line.startswith("*") else ("bold" if line and not line[0].isspace()
                                                           and not line.startswith("#") else None)
        console.print(Text(line, style=style or ""))
    return 0
