"""The parent side of the sandbox: a :class:`Session` is one child process that defines the
untrusted code once and answers calls to one of its functions, one at a time, in plain data.

The caller decides what the answers are worth, in its own process: the child never sees an
expected output or a test, so nothing it can do beats returning the right values.
"""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass

from lopd.sandbox.plain import make_codec
from lopd.sandbox.limits import NOBODY, isolation, limit_args
from lopd.sandbox.server import Program, fork_server

STATUSES = ("ok", "timeout", "error", "killed", "refused", "no_output")
RECURSION_LIMIT = 1000
_STDERR_TAIL = 16384
_REPLY_STATUSES = ("ok", "error", "refused")

# the one plain-data codec, shared with the child (exact types; tuples, dicts, sets tagged)
dumps_plain, loads_plain = make_codec()


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


class _Drain(threading.Thread):
    """Drains one pipe of the child; past ``cap`` bytes in total it calls ``on_flood`` and
    stops reading. With ``on_line``, complete lines are handed over; otherwise the last
    ``_STDERR_TAIL`` bytes are kept for error messages. ``on_eof`` runs when it stops."""

    def __init__(self, stream, cap: int, on_flood, on_line=None, on_eof=None):
        super().__init__(daemon=True)
        self.stream, self.cap, self.on_flood, self.on_line, self.on_eof = stream, cap, on_flood, on_line, on_eof
        self.tail = bytearray()

    def run(self) -> None:
        total, pending = 0, bytearray()
        try:
            while True:
                chunk = self.stream.read1(65536)
                if not chunk:
                    break
                total += len(chunk)
                if total > self.cap:
                    self.on_flood()
                    break
                if self.on_line is None:
                    self.tail += chunk
                    del self.tail[: max(0, len(self.tail) - _STDERR_TAIL)]
                    continue
                pending += chunk
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest)
                for line in lines:
                    self.on_line(bytes(line))
        except (OSError, ValueError):
            pass
        finally:
            if self.on_eof is not None:
                self.on_eof()


class Session:
    """``with Session(code, fn_name) as s: s.call(*args)``: ``code`` is defined in a fresh
    sandboxed child; each :meth:`call` sends plain-data arguments and returns the plain-data
    return value, raises :class:`CallError` if the function raised, or :class:`SessionOver`
    once the run is over. :meth:`finish` ends it and returns the :class:`SandboxResult`.

    ``timeout_s`` bounds the whole session (wall clock; the CPU limit is one second more),
    ``max_output_bytes`` the bytes the child may write to each of stdout and stderr.
    """

    def __init__(self, code: str, fn_name: str, *, timeout_s: float = 2.0, mem_mb: int = 256,
                 max_output_bytes: int = 65536):
        self.code, self.fn_name = code, fn_name
        self.timeout_s, self.mem_mb, self.max_output_bytes = timeout_s, mem_mb, max_output_bytes
        self.outputs: list = []
        self.result: SandboxResult | None = None
        self._seq = 0
        self._ready = False
        self._replies: queue.Queue = queue.Queue()
        self._timed_out = threading.Event()
        self._flooded = threading.Event()
        self._marker = "@@LOPD-" + secrets.token_hex(16)
        self._server = None
        self._program: Program | None = None
        self._stdin = self._stdout = self._stderr = None
        self._drains: list[_Drain] = []
        self._watchdog: threading.Timer | None = None
        self._tmp = tempfile.mkdtemp(prefix="lopd-sbx-")
        try:
            self._spawn()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------- public
    def call(self, *args, **kwargs):
        """``fn(*args, **kwargs)`` in the child; the return value as plain data."""
        try:
            request = dumps_plain([self._seq + 1, list(args), kwargs])
        except (TypeError, ValueError) as e:
            raise NotPlainData(f"argument for the sandboxed {self.fn_name}() is not plain data: {e}") from None
        self._await_ready()
        self._seq += 1
        status, value = self._exchange(request)
        if status == "error":
            raise CallError(value if type(value) is str else "error")
        self.outputs.append(value)
        return value

    def finish(self) -> SandboxResult:
        """End the session; ``ok`` unless the child refused something, even between calls.
        Raises :class:`SessionOver` if the run is already over."""
        self._await_ready()
        self._seq += 1
        self._exchange(dumps_plain([self._seq, None, None]))
        self.result = SandboxResult("ok", list(self.outputs), "")
        self.close()
        return self.result

    def close(self) -> None:
        """Kill the child's process group, reap it, remove the temp dir. Idempotent."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._program is not None:
            self._kill()
            self._program.exited.wait(timeout=5)
            for d in self._drains:
                d.join(timeout=2.0)
        for f in (self._stdin, self._stdout, self._stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        shutil.rmtree(self._tmp, ignore_errors=True)

    # -------------------------------------------------------------- child process
    def _spawn(self) -> None:
        """Write the payload into the temp dir, then have the fork server fork the child, with
        three fresh pipes as its stdin, stdout and stderr."""
        iso = isolation()
        payload = os.path.join(self._tmp, "payload.json")
        with open(payload, "w") as fh:
            fh.write(dumps_plain({"marker": self._marker, "code": self.code, "fn": self.fn_name,
                                  "recursion_limit": RECURSION_LIMIT}))
        if iso["drop_uid"]:
            for p in (self._tmp, payload):
                os.chown(p, NOBODY, NOBODY)
        cpu_s, mem_bytes = limit_args(self.timeout_s, self.mem_mb)
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        self._stdin, self._stdout, self._stderr = open(in_w, "wb"), open(out_r, "rb"), open(err_r, "rb")
        self._deadline = time.monotonic() + self.timeout_s
        try:
            self._server = fork_server()
            self._program = self._server.spawn(self._tmp, cpu_s, mem_bytes, iso["netns"], iso["drop_uid"],
                                                (in_r, out_w, err_w))
        finally:
            for fd in (in_r, out_w, err_w):  # the child's ends: it holds its own copies now
                os.close(fd)
        self._drains = [
            _Drain(self._stdout, self.max_output_bytes, self._on_flood,
                   on_line=self._on_line, on_eof=lambda: self._replies.put(None)),
            _Drain(self._stderr, self.max_output_bytes, self._on_flood),
        ]
        for d in self._drains:
            d.start()
        self._watchdog = threading.Timer(self.timeout_s, self._on_timeout)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _kill(self) -> None:
        if self._program is not None:
            self._server.kill(self._program)  # a no-op once the server has reaped it

    def _on_timeout(self) -> None:
        self._timed_out.set()
        self._kill()

    def _on_flood(self) -> None:
        self._flooded.set()
        self._kill()

    def _on_line(self, line: bytes) -> None:
        """A line of the reply channel: only those that start with this run's marker count."""
        head = (self._marker + " ").encode()
        if line.startswith(head):
            self._replies.put(line[len(head):])

    # -------------------------------------------------------------- protocol
    def _await_ready(self) -> None:
        if self.result is not None:
            raise SessionOver(self.result)
        if not self._ready:
            status, value = self._receive(0)
            if status == "error":
                self._end("error", value if type(value) is str else "error")
            self._ready = True

    def _exchange(self, request: str):
        try:
            self._stdin.write(request.encode() + b"\n")
            self._stdin.flush()
        except (OSError, ValueError):
            pass  # the child is gone: its stdout's end says how
        return self._receive(self._seq)

    def _receive(self, seq: int):
        wait = self._deadline - time.monotonic() + 2.0  # the watchdog kills at the deadline
        try:
            item = self._replies.get(timeout=max(wait, 0.1))
        except queue.Empty:
            self._timed_out.set()
            item = None
        if item is None:
            self._end_after_exit()
        try:
            got, status, body = item.split(b" ", 2)
            got, status, value = int(got), status.decode(), loads_plain(body.decode())
        except (ValueError, UnicodeDecodeError, RecursionError):
            self._end("error", "malformed reply")
        if got != seq or status not in _REPLY_STATUSES:
            self._end("error", "malformed reply")
        if status == "refused":
            self._end("refused", str(value)[:300])
        return status, value

    def _end(self, status: str, detail: str):
        self.result = SandboxResult(status, None, detail)
        self._kill()
        raise SessionOver(self.result)

    def _end_after_exit(self):
        """The child is gone (or must go): say why, from how it ended."""
        self._kill()
        self._program.exited.wait(timeout=5)
        rc = self._program.returncode  # None: not reaped in time, or the fork server died
        for d in self._drains:
            d.join(timeout=2.0)
        if self._timed_out.is_set():
            self._end("timeout", f"wall clock limit {self.timeout_s:g}s")
        if self._flooded.is_set():
            self._end("killed", f"output limit {self.max_output_bytes} bytes exceeded")
        if rc is not None and rc < 0:
            if -rc == signal.SIGXCPU:
                self._end("timeout", "cpu limit (SIGXCPU)")
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            self._end("killed", name)
        if rc is None and self._server.dead:
            self._end("killed", "the sandbox's fork server died")  # not the program's doing: never cached
        if rc == 0:
            self._end("no_output", "exited without a result")
        self._end("error", _last_line(bytes(self._drains[1].tail)) or f"exit code {rc}")


def _last_line(stderr: bytes) -> str:
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_calls(code: str, fn_name: str, calls: list[list], *, timeout_s: float = 2.0,
              mem_mb: int = 256, max_output_bytes: int = 65536) -> SandboxResult:
    """Define ``code`` in a sandboxed child and call ``fn_name(*args)`` for each of ``calls``;
    ``ok`` with every return value (plain data), or why not (the first failure ends it)."""
    with Session(code, fn_name, timeout_s=timeout_s, mem_mb=mem_mb,
                 max_output_bytes=max_output_bytes) as session:
        try:
            for args in calls:
                session.call(*args)
            return session.finish()
        except CallError as e:
            return SandboxResult("error", None, e.detail)
        except SessionOver as e:
            return e.result
