"""The one formatter of params validation errors, and look-ups of keys and their descriptions.

Every place that validates params (:func:`lopd.config.parse_params`, ``lopd launch``'s
``load_launch_params``) turns a pydantic ``ValidationError`` into a :class:`lopd.errors.BadInput`
message through :func:`format_validation_error`: each error names the dotted key, the problem, the
value given and the key's description; an unknown key also gets the keys allowed in its section,
each with its description, and the closest ones as suggestions.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterator, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

PARAMS_HINT = "`lopd params` prints every key with its value and description"


def sub_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model holding the keys under a field: the field's own model, or (``keyed`` = True) the
    value model of a ``dict[str, Model]`` whose keys are free names (``launch.resources.<stage>``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if get_origin(annotation) is dict:
        value = get_args(annotation)[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value, True
    return None, False


def resolve(root: type[BaseModel], loc: tuple) -> tuple[FieldInfo | None, type[BaseModel] | None]:
    """The field at ``loc`` below ``root`` (``None`` at the root or off the schema) and the model
    whose fields are the keys allowed under it. List indices in ``loc`` stay on their list's field."""
    field, model, keyed = None, root, False
    for part in loc:
        if isinstance(part, int):
            continue
        if keyed:  # a free name, e.g. the stage in launch.resources.<stage>
            keyed = False
            continue
        if model is None or str(part) not in model.model_fields:
            return None, None
        field = model.model_fields[str(part)]
        model, keyed = sub_model(field.annotation)
    return field, model


def iter_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every field of ``model`` and of the section models under it, depth first, as (dotted key, field);
    a ``dict[str, Model]`` field's value model is walked under ``<key>.*``."""
    for name, field in model.model_fields.items():
        yield prefix + name, field
        sub, keyed = sub_model(field.annotation)
        if sub is not None:
            yield from iter_fields(sub, prefix + name + (".*." if keyed else "."))


def _allowed_lines(model: type[BaseModel], given: str) -> list[str]:
    fields = model.model_fields
    allowed = sorted(fields)
    lines = [f"unknown key; allowed keys here: {', '.join(allowed)}"]
    close = difflib.get_close_matches(given, allowed, n=3, cutoff=0.6)
    if close:
        lines.append("did you mean " + " or ".join(f"`{k}`" for k in close) + "?")
    width = max(map(len, allowed))
    lines += [f"  {k:<{width}}  {fields[k].description or ''}".rstrip() for k in allowed]
    return lines


def _problem(err: dict) -> str:
    msg = err["msg"]
    if "input" in err and not isinstance(err["input"], dict):
        msg = f"{msg} (got {err['input']!r})"
    return msg


def format_validation_error(e: ValidationError, source: str, root: type[BaseModel], within: tuple = ()) -> str:
    """The message of ``e``: one entry per error, ``<dotted key>: <problem> (got <value>)`` and the
    key's description on the next line; for an unknown key, the allowed keys with their
    descriptions. ``root`` is the schema of the whole params file; ``within``: the location of the
    validated model inside it (``("launch",)`` when only that section was validated)."""
    lines = [f"invalid parameters in {source}:"]
    for err in e.errors():
        loc = (*within, *err["loc"])
        key = ".".join(str(p) for p in loc) or "(root)"
        if err["type"] == "extra_forbidden":
            _, model = resolve(root, loc[:-1])
            entry = _allowed_lines(model, str(loc[-1])) if model is not None else ["unknown key"]
        else:
            field, _ = resolve(root, loc)
            entry = [_problem(err)]
            if field is not None and field.description:
                entry.append(f"{'.'.join(str(p) for p in loc if not isinstance(p, int))}: {field.description}")
        lines.append(f"  {key}: {entry[0]}")
        lines += [f"      {ln}" for ln in entry[1:]]
    lines.append(f"({PARAMS_HINT})")
    return "\n".join(lines)
