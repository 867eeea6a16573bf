"""The plain-data codec: the one way values cross the sandbox's process boundary, used by
the parent (:mod:`lopd.sandbox.session`) and by the child (:mod:`lopd.sandbox.child`, which
runs next to a copy of this file).

**Plain data**: ``None``, ``bool``, ``int``, ``float``, ``str``, and ``list``/``tuple``/
``dict``/``set``/``frozenset`` of plain data, with *exact* types (``type(x) is int``): a
subclass of ``int`` with a forged ``__eq__`` is refused, not converted. The JSON form tags the
other containers (``{"t": [...]}`` tuple, ``{"d": [[k, v], ...]}`` dict, ``{"s": [...]}`` set,
``{"f": [...]}`` frozenset), so ``(4, 5)`` and ``{1: "a"}`` come back exactly. Encoding runs
no user code, and every helper is bound when the codec is made (in the child: before the
user code exists), so patching ``json``, ``pickle`` or ``builtins`` later changes nothing.
Standard library only, and only its C JSON module ``_json``: importing ``json`` costs the child
~13 ms (``re``, ``enum``), a third of a sandboxed run's start-up.
"""

from __future__ import annotations

import _json

TAGS = ("t", "d", "s", "f")  # tuple, dict, set, frozenset


def make_codec():
    """``(dumps, loads)``: plain data to one line of JSON text and back. ``dumps`` raises
    ``TypeError`` on anything that is not plain data (exact types) and ``ValueError`` on an
    int too long to print; ``loads`` raises ``ValueError`` on text that is not the JSON form
    of plain data. Every helper is bound once, here: later changes to ``builtins`` or
    ``json`` do not reach them."""
    return make_dumps(), make_loads()


def make_dumps():
    from builtins import TypeError, bool, dict, enumerate, float, frozenset, int, list, set, str, tuple, type

    int_repr, float_repr, str_join = int.__repr__, float.__repr__, str.join
    escape = _json.encode_basestring_ascii
    inf = float("inf")
    specials = {inf: "Infinity", -inf: "-Infinity"}
    containers = {tuple: "t", set: "s", frozenset: "f"}

    def dump(x, out) -> None:
        t = type(x)
        if x is None:
            out.append("null")
        elif t is bool:
            out.append("true" if x else "false")
        elif t is int:
            out.append(int_repr(x))
        elif t is float:
            out.append(float_repr(x) if x == x and x not in specials else specials.get(x, "NaN"))
        elif t is str:
            out.append(escape(x))
        elif t is list or t in containers:
            out.append("[" if t is list else '{"%s": [' % containers[t])
            for i, item in enumerate(x):
                out.append(", " if i else "")
                dump(item, out)
            out.append("]" if t is list else "]}")
        elif t is dict:
            out.append('{"d": [')
            for i, (k, v) in enumerate(dict.items(x)):
                out.append(", [" if i else "[")
                dump(k, out)
                out.append(", ")
                dump(v, out)
                out.append("]")
            out.append("]}")
        else:
            raise TypeError("not plain data: " + type_name(t))

    def dumps(x) -> str:
        out: list = []
        dump(x, out)
        return str_join("", out)

    return dumps


def make_loads():
    from builtins import (RecursionError, StopIteration, TypeError, ValueError, all, bool, dict,
                          float, frozenset, int, len, list, set, str, tuple, type)

    scan = _json.make_scanner(_ScannerContext())  # the C scanner: reads its context once, here
    makers = {"t": tuple, "s": set, "f": frozenset}

    def build(j):
        t = type(j)
        if j is None or t is bool or t is int or t is float or t is str:
            return j
        if t is list:
            return [build(i) for i in j]
        if t is dict and len(j) == 1:
            (tag, body), = dict.items(j)
            if type(body) is list and tag in TAGS:
                items = [build(i) for i in body]
                if tag != "d":
                    return makers[tag](items)
                if all(type(p) is list and len(p) == 2 for p in items):
                    return dict((k, v) for k, v in items)
                raise ValueError("malformed plain data: dict entries must be pairs")
        raise ValueError("malformed plain data")

    def loads(text: str):
        try:
            tree, end = scan(text, 0)
            if text[end:].strip():
                raise ValueError("malformed plain data: trailing text")
            return build(tree)
        except StopIteration as e:
            raise ValueError("malformed plain data: nothing at %s" % e.value) from None
        except (TypeError, RecursionError) as e:  # an unhashable key, nesting too deep
            raise ValueError("malformed plain data: %s" % e) from None

    return loads


class _ScannerContext:
    """What ``_json.make_scanner`` reads from a ``json.JSONDecoder()`` with default arguments:
    strict strings, no hooks, exact ``int``/``float``, and the three non-finite constants."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


def type_name(t, _name=type.__dict__["__name__"].__get__, _type=type, _str=str) -> str:
    """The class's name without running its code (a metaclass could override ``__name__``).
    Defaults bind the builtins used, before any user code runs."""
    name = _name(t)
    return name if _type(name) is _str else "?"
