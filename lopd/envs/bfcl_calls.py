"""BFCL function calls: parse a model's answer, check it against a possible answer, and write the
reference and corrupted calls of the scripted policies (pure functions: nothing in an action is ever
evaluated or executed; argument values are read with :func:`ast.literal_eval`).

Reward (BFCL's AST checker, simplified): 1.0 iff the function name is the expected one,
every required parameter is given, no parameter is unknown (to the documentation or to the
possible answer), every value has the documented type (ints are accepted for floats; a
value of the possible answer's own type is accepted too, as BFCL does for "variables") and
is among the possible answer's allowed values, and every parameter the possible answer
lists without ``""`` (BFCL's "optional" marker) is given; else 0.0. String comparison is
BFCL's: case-insensitive, ignoring spaces and ``,./-_*^``, ``'`` read as ``"``. Dicts
match when every given key is allowed with an allowed value and every omitted key is
optional; lists match element-wise (dict elements as dicts).
"""

from __future__ import annotations

import ast
import random
import re
from typing import Any

_PY_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool,
                              "array": list, "tuple": list, "dict": dict, "any": str}
_STD_RE = re.compile(r"[ ,./\-_*^]")  # BFCL ignores these when it compares strings


# --------------------------------------------------------------------------------------
# Parsing and checking (pure functions, no evaluation of the action)
# --------------------------------------------------------------------------------------
def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _strip_wrapping(text: str) -> str:
    s = text.strip()
    m = re.search(r"```[A-Za-z0-9_+-]*\n?(.*?)```", s, re.DOTALL)
    if m:
        s = m.group(1).strip()
    return s


def parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """``(function name, {param: value})`` for one keyword-argument call, else ``None``.

    Values must be Python literals (:func:`ast.literal_eval`); positional arguments,
    ``**kwargs``, repeated keywords and more than one call are rejected.
    """
    if not isinstance(text, str):
        return None
    s = _strip_wrapping(text)
    try:
        body = ast.parse(s, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if isinstance(body, (ast.List, ast.Tuple)) and len(body.elts) == 1:
        body = body.elts[0]
    if not isinstance(body, ast.Call):
        return None
    name = _dotted(body.func)
    if name is None or body.args:
        return None
    args: dict[str, Any] = {}
    for kw in body.keywords:
        if kw.arg is None or kw.arg in args:
            return None
        try:
            args[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
    return name, args


def standardize(s: str) -> str:
    """BFCL's string normalisation."""
    return _STD_RE.sub("", s).lower().replace("'", '"')


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _match(v: Any, a: Any) -> bool:
    """Whether the value ``v`` equals one allowed value ``a`` (type-aware)."""
    if isinstance(a, str):
        return isinstance(v, str) and standardize(v) == standardize(a)
    if isinstance(a, bool):
        return isinstance(v, bool) and v == a
    if _is_num(a):
        return _is_num(v) and v == a
    if a is None:
        return v is None
    if isinstance(a, list):
        return (isinstance(v, (list, tuple)) and len(v) == len(a)
                and all(_dict_match(x, y) if isinstance(y, dict) else _match(x, y) for x, y in zip(v, a)))
    if isinstance(a, dict):
        return _dict_match(v, a)
    return False


def _allowed(v: Any, allowed: Any) -> bool:
    if not isinstance(allowed, list):
        return _match(v, allowed)
    return any(_match(v, a) for a in allowed)


def _dict_match(v: Any, a: dict) -> bool:
    """A dict answer: each key of ``a`` maps to its list of allowed values (``""`` = optional)."""
    if not isinstance(v, dict):
        return False
    for k, x in v.items():
        if k not in a or not _allowed(x, a[k]):
            return False
    for k, al in a.items():
        if k not in v and not (isinstance(al, list) and "" in al):
            return False
    return True


def _type_ok(v: Any, declared: str | None, allowed: list) -> bool:
    expected = _PY_TYPES.get(declared or "")
    if expected is None or type(v) is expected:
        return True
    concrete = [a for a in allowed if a != ""]
    return bool(concrete) and type(v) is type(concrete[0])


def check_call(parsed: tuple[str, dict] | None, functions: list[dict], ground_truth: dict) -> tuple[bool, str]:
    """``(passed, reason)`` for a parsed call against one possible answer."""
    if parsed is None:
        return False, "unparsable: expected one call with literal keyword arguments"
    name, args = parsed
    (want, allowed), = ground_truth.items()
    if name != want:
        return False, f"wrong function name {name!r} (expected {want!r})"
    desc = next((f for f in functions if f.get("name") == want), None)
    if desc is None:
        return False, f"function {want!r} is not documented"
    params = desc.get("parameters") or {}
    props = params.get("properties") or {}
    for p in params.get("required") or []:
        if p not in args:
            return False, f"missing required parameter {p!r}"
    for p, v in args.items():
        if p not in props or p not in allowed:
            return False, f"unexpected parameter {p!r}"
        declared = props[p].get("type")
        if declared == "float" and type(v) is int:
            v = float(v)
        if declared == "tuple" and type(v) is tuple:
            v = list(v)
        if not _type_ok(v, declared, allowed[p]):
            return False, f"parameter {p!r}: wrong type {type(v).__name__} (documented {declared})"
        if not _allowed(v, allowed[p]):
            return False, f"parameter {p!r}: value {v!r} not among the allowed values"
    for p, al in allowed.items():
        if p not in args and "" not in al:
            return False, f"parameter {p!r} must be given"
    return True, "ok"


def score(action: str, spec: dict) -> tuple[float, str]:
    ok, why = check_call(parse_call(action), spec["functions"], spec["ground_truth"])
    return (1.0 if ok else 0.0), why


# --------------------------------------------------------------------------------------
# Scripted solutions
# --------------------------------------------------------------------------------------
def _first(allowed: Any) -> tuple[bool, Any]:
    """(present, value): the first allowed value that is not the optional marker ``""``."""
    if not isinstance(allowed, list):
        return True, _materialize(allowed)
    for a in allowed:
        if a != "":
            return True, _materialize(a)
    return False, None


def _materialize(a: Any) -> Any:
    """A concrete value from one allowed value (dict answers hold allowed lists per key)."""
    if isinstance(a, dict):
        out = {}
        for k, al in a.items():
            present, val = _first(al)
            if present:
                out[k] = val
        return out
    if isinstance(a, list):
        return [_materialize(x) for x in a]
    return a


def format_call(name: str, args: dict[str, Any]) -> str:
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"


def solution_call(ground_truth: dict) -> str:
    (name, allowed), = ground_truth.items()
    args = {}
    for p, al in allowed.items():
        present, val = _first(al)
        if present:
            args[p] = val
    return format_call(name, args)


def corrupt_call(spec: dict, rng: random.Random) -> str:
    """A call that fails the check: wrong name, a missing required argument, a wrong value,
    or an unknown argument."""
    name, args = parse_call(solution_call(spec["ground_truth"]))  # type: ignore[misc]
    for _ in range(20):
        kind = rng.randrange(4)
        n2, a2 = name, dict(args)
        if kind == 0:
            n2 = name + "_v2"
        elif kind == 1:
            desc = next(f for f in spec["functions"] if f["name"] == name)
            req = [p for p in (desc["parameters"].get("required") or []) if p in a2]
            if not req:
                continue
            del a2[rng.choice(req)]
        elif kind == 2:
            if not a2:
                continue
            p = rng.choice(sorted(a2))
            v = a2[p]
            a2[p] = (not v) if isinstance(v, bool) else (v + 7 if _is_num(v) else f"{v}zz" if isinstance(v, str) else None)
        else:
            a2["unexpected_extra_arg"] = 1
        text = format_call(n2, a2)
        if score(text, spec)[0] == 0.0:
            return text
    return name + "_v2()"
