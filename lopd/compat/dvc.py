"""Every read of a DVC internal, in one place.

lopd drives DVC through its command line (``dvc.cli.main``) and its public ``Repo`` API; this module
holds what neither offers:

* DVC's own parse and lock-file schema, to tell a torn ``dvc.lock`` from a valid one
  (:func:`lock_schema_problem`; ``dvc.schema``, ``dvc.utils.serialize``);
* the lock writer, wrapped by fault injection to tear a rewrite of ``dvc.lock`` mid-write
  (:func:`wrap_lock_writes`; ``dvc.dvcfile.Lockfile.dump_stages``, ``dvc.utils.serialize._yaml._dump``,
  the function DVC writes the lock's YAML through, in place: ``dvc/utils/serialize/_common.py``).

DVC itself is imported only inside the functions. :data:`INTERNALS` lists what is read, checked
against DVC :data:`CHECKED_VERSION` (``pyproject.toml`` bounds the version); ``tests/unit/test_compat.py``
fails with the name of whichever has moved.
"""

from __future__ import annotations

from typing import Callable

CHECKED_VERSION = "3.67.1"
INTERNALS = [("dvc.schema", "COMPILED_LOCKFILE_SCHEMA"), ("dvc.utils.serialize", "parse_yaml"),
             ("dvc.utils.serialize", "YAMLFileCorruptedError"), ("dvc.dvcfile", "Lockfile"),
             ("dvc.utils.serialize._yaml", "_dump")]


def lock_schema_problem(text: str, name: str = "dvc.lock") -> str | None:
    """DVC's own parse and lock-schema check of ``text``; None if it passes or DVC is not importable."""
    try:
        import voluptuous as vol
        from dvc.schema import COMPILED_LOCKFILE_SCHEMA
        from dvc.utils.serialize import YAMLFileCorruptedError, parse_yaml
    except ImportError:
        return None
    try:
        COMPILED_LOCKFILE_SCHEMA(parse_yaml(text, name))
    except YAMLFileCorruptedError as e:
        return f"DVC cannot parse it ({e})"
    except vol.Invalid as e:
        return f"DVC's lock schema rejects it ({e})"
    return None


def wrap_lock_writes(on_stages: Callable[[list[str]], None], on_dump: Callable[[str, object], bool]) -> None:
    """Wrap DVC's lock writer in this process: ``on_stages(addresses)`` before each rewrite of
    ``dvc.lock`` (the stages it records), and ``on_dump(text, stream)`` with the YAML text of each dump
    before it is written; when ``on_dump`` returns True it has written the stream itself."""
    import io

    import dvc.dvcfile as dvcfile
    import dvc.utils.serialize._yaml as dvc_yaml

    dump_stages, dump = dvcfile.Lockfile.dump_stages, dvc_yaml._dump

    def dump_stages_watched(self, stages, **kwargs):
        on_stages([st.addressing for st in stages])
        try:
            return dump_stages(self, stages, **kwargs)
        finally:
            on_stages([])

    def dump_watched(data, stream):
        buf = io.StringIO()
        dump(data, buf)
        if not on_dump(buf.getvalue(), stream):
            stream.write(buf.getvalue())

    dvcfile.Lockfile.dump_stages = dump_stages_watched
    dvc_yaml._dump = dump_watched
