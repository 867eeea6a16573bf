"""Profiles as DVC experiments: ``lopd exp run --profile profiles/smoke.yaml [dvc exp run args]``.

A profile is a YAML mapping laid over ``params.yaml`` by :func:`lopd.config.deep_merge`: mappings
merge key by key, anything else (a list too) replaces the committed value. Here each of its
leaves becomes one ``dvc exp run -S section.key=value`` override, so DVC records the experiment
(``dvc exp show`` lists it). Run in the workspace, ``dvc exp run -S`` leaves the experiment's values
in ``params.yaml``; ``lopd exp run`` puts the file back as it was afterwards (the experiment's
outputs, ``dvc.lock`` and the MLflow runs stay in the workspace). The merged params are validated
first: a bad profile stops with exit status 2 before DVC starts.

``-S`` values go through Hydra's override grammar (DVC parses them with it): each value is
written as a Hydra literal (:func:`hydra_literal`), so a list, ``null``, a float such as
``5e-05`` or a string with a ``:`` arrive with the type they have in the profile
(``tests/integration/test_params.py`` checks this against DVC's own parser for every shipped profile).
A key the committed file lacks (a new stage under ``launch.resources``) is added with Hydra's
``++`` ("add or override").
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from lopd.errors import BadInput


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HYDRA_WORDS = {"null", "true", "false", "inf", "nan"}  # unquoted, Hydra reads these (any case) as values


def hydra_literal(value: Any) -> str:
    """``value`` as a Hydra override literal that parses back to the same YAML value.

    ``None`` → ``null``; booleans → ``true``/``false``; numbers as Python writes them, with a point in
    an exponent's mantissa (``5.0e-05``); an identifier as itself (``lopd``); any other string
    single-quoted, quotes (and backslashes before them) escaped, so ``'123'`` stays a string and
    ``'a, b'`` one string; lists → ``[a,b]``; mappings → ``{key:value}``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadInput(f"a profile value {value!r} is not a finite number")
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        # Hydra reads 5e-05 as a string: its float grammar wants a point in the mantissa
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    if isinstance(value, str) and _PLAIN.match(value) and value.lower() not in _HYDRA_WORDS:
        return value  # an identifier (an arm, a stage) reads as itself: [base,lopd]
    if isinstance(value, str):
        # Hydra's quoted strings: a backslash is literal unless it precedes a quote (or the closing
        # one), so only those runs are doubled; then each quote is escaped, and ${ (interpolation)
        text = re.sub(r"(\\+)(?='|$)", r"\1\1", value).replace("'", "\\'")
        return "'" + text.replace("${", "\\${") + "'"  # and no OmegaConf interpolation
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_hydra_key(k)}:{hydra_literal(v)}" for k, v in value.items()) + "}"
    raise BadInput(f"a profile value {value!r} ({type(value).__name__}) cannot be passed to dvc exp run -S")


def _hydra_key(key: Any) -> str:
    k = str(key)
    if not k.replace("_", "").isalnum():
        raise BadInput(f"profile key {k!r}: dvc exp run -S takes keys of letters, digits and '_' only")
    return k


def profile_leaves(profile: dict, committed: dict, prefix: str = "") -> list[tuple[str, Any, bool]]:
    """The profile's leaves as ``(dotted key, value, key exists in committed)``, in profile order.

    A mapping over a mapping descends (deep_merge merges it key by key); anything else is one leaf."""
    out: list[tuple[str, Any, bool]] = []
    for k, v in profile.items():
        key = prefix + _hydra_key(k)
        if isinstance(v, dict) and isinstance(committed.get(k), dict):
            out += profile_leaves(v, committed[k], key + ".")
        else:
            out.append((key, v, k in committed))
    return out


def set_param_args(profile: dict, committed: dict) -> list[str]:
    """``["-S", "section.key=value", ...]``: one override per profile leaf (``++key=value`` for a key
    the committed params lack)."""
    args: list[str] = []
    for key, value, exists in profile_leaves(profile, committed):
        args += ["-S", f"{'' if exists else '++'}{key}={hydra_literal(value)}"]
    return args


def exp_run_argv(params_file: str | Path, profile_file: str | Path | None, dvc_args: list[str]) -> list[str]:
    """The ``dvc`` argv of ``lopd exp run``: ``exp run``, the profile's ``-S`` overrides, then
    ``dvc_args``. The committed params merged with the profile must validate (else :class:`BadInput`)."""
    from lopd.config import deep_merge, parse_params, read_yaml_mapping

    committed = read_yaml_mapping(params_file, "params file")
    overrides: list[str] = []
    if profile_file is not None:
        profile = read_yaml_mapping(profile_file, "profile")
        parse_params(deep_merge(committed, profile), f"{params_file} + {profile_file}")
        overrides = set_param_args(profile, committed)
    return ["exp", "run", *overrides, *dvc_args]


def guarded_dvc(argv: list[str]) -> int:
    """Run ``dvc <argv>`` in this process behind the lock guard of ``lopd repro``
    (:func:`lopd.workflow.lockguard.guard`: a torn ``dvc.lock`` restored, stale DVC locks cleared; 1 if a
    live DVC process works here). This interpreter's directory goes first on ``PATH`` so the
    stages' ``lopd`` and ``python`` are this environment's."""
    from lopd.workflow.lockguard import find_root, guard

    root = find_root(Path.cwd())
    if root is None:
        raise BadInput(f"{Path.cwd()} is not in a DVC repository (no .dvc directory above it): run `dvc init` "
                       "in the git repository first (`make repro` does)")
    if rc := guard(root):
        return rc
    bindir = os.path.dirname(sys.executable)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "")])
    from dvc.cli import main as dvc_main

    print("lopd: dvc " + " ".join(_shell_quote(a) for a in argv), file=sys.stderr, flush=True)
    return dvc_main(argv)


def run_profile_experiment(params_file: str | Path, profile_file: str | Path | None, dvc_args: list[str]) -> int:
    """``lopd exp run``: :func:`exp_run_argv` through :func:`guarded_dvc`, then ``params.yaml`` put back
    byte for byte as it was before (run in the workspace, DVC leaves the experiment's values in it;
    they stay in the experiment, which ``dvc exp show`` lists and ``dvc exp apply`` restores), even
    when the run fails or is interrupted."""
    from lopd.workflow.lockguard import find_root
    from lopd.utils import atomic_write_bytes

    argv = exp_run_argv(params_file, profile_file, dvc_args)
    root = find_root(Path.cwd())
    committed = root / "params.yaml" if root is not None else None
    before = committed.read_bytes() if committed is not None and committed.exists() else None
    try:
        return guarded_dvc(argv)
    finally:
        if before is not None and committed.read_bytes() != before:
            atomic_write_bytes(committed, before)
            print(f"lopd: put {committed.name} back as it was; the experiment's params are in `dvc exp show` "
                  "(`dvc exp apply <name>` brings them into the workspace)", file=sys.stderr, flush=True)


def _shell_quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
