"""What a sandboxed run comes back as: its :class:`SandboxResult`, and the exceptions a
:class:`lopd.sandbox.Session` raises."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("ok", "timeout", "error", "killed", "refused", "no_output")


@dataclass
class SandboxResult:
    status: str  # one of STATUSES
    outputs: list | None  # plain-data return values of every call, in order, when ok
    detail: str  # short human-readable reason


class CallError(Exception):
    """The sandboxed function raised; ``detail`` names the exception. The session goes on."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class NotPlainData(TypeError):
    """An argument the *caller* passed is not plain data (a bug of the caller, not a score)."""


class SessionOver(BaseException):
    """The run ended without an answer: timeout, kill, refusal, crash or malformed reply.

    A ``BaseException``, so that test code calling the sandboxed function through a proxy
    cannot swallow it with ``except Exception``."""

    def __init__(self, result: SandboxResult):
        super().__init__(result.detail)
        self.result = result
