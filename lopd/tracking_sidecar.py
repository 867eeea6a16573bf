"""The MLflow sidecar: ``python -m lopd.tracking_sidecar <uri>`` (started by :func:`lopd.tracking.start_sidecar`).

Reads one JSON call per line on stdin (``{"id", "op", "args", "kwargs"}``), runs it on
:class:`lopd.tracking.MlflowOps` and answers one JSON line (``{"id", "result"}`` or
``{"id", "error": "<ExceptionType>: <message>"}``). Exits when stdin closes. Anything MLflow
prints goes to stderr, so the reply stream carries replies only.
"""

from __future__ import annotations

import json
import os
import sys


def main(uri: str) -> int:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from libraries must not corrupt the reply stream
    sys.stdout = sys.stderr
    from lopd.tracking import OPS, MlflowOps

    try:
        ops, init_error = MlflowOps(uri), None
    except Exception as e:  # noqa: BLE001 - reported to the caller on its first call
        ops, init_error = None, f"{type(e).__name__}: {e}"
    for line in sys.stdin:
        call = json.loads(line)
        reply = {"id": call["id"]}
        if init_error is not None:
            reply["error"] = init_error
        elif call["op"] not in OPS:
            reply["error"] = f"ValueError: unknown operation {call['op']!r}"
        else:
            try:
                reply["result"] = getattr(ops, call["op"])(*call["args"], **call["kwargs"])
            except Exception as e:  # noqa: BLE001 - the caller decides (tracking.on_failure)
                reply["error"] = f"{type(e).__name__}: {e}"
        replies.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
