"""The parent side of the sandbox: a :class:`Session` is one child process that defines the
untrusted code once and answers calls to one of its functions, one at a time, in plain data.

The caller decides what the answers are worth, in its own process: the child never sees an
expected output or a test, so nothing it can do beats returning the right values.
"""

from __future__ import annotations

import collections
import os
import secrets
import select
import shutil
import signal
import tempfile
import time

from lopd.sandbox.limits import NOBODY, isolation, limit_args
from lopd.sandbox.plain import make_codec
from lopd.sandbox.results import CallError, NotPlainData, SandboxResult, SessionOver
from lopd.sandbox.server import Program, fork_server

RECURSION_LIMIT = 1000
_STDERR_TAIL = 16384
_REPLY_STATUSES = ("ok", "error", "refused")
_KILL_GRACE_S = 2.0  # after a kill, how long the rest of the child's output may take to arrive
_EXIT_GRACE_S = 0.5  # after its last answer, how long the child may take to exit before it is killed
_READ = select.POLLIN | select.POLLHUP | select.POLLERR
_CHUNK = 65536

# the one plain-data codec, shared with the child (exact types; tuples, dicts, sets tagged)
dumps_plain, loads_plain = make_codec()


class Session:
    """``with Session(code, fn_name) as s: s.call(*args)``: ``code`` is defined in a fresh
    sandboxed child; each :meth:`call` sends plain-data arguments and returns the plain-data
    return value, raises :class:`CallError` if the function raised, or :class:`SessionOver`
    once the run is over. :meth:`finish` ends it and returns the :class:`SandboxResult`;
    :meth:`run_all` sends every call and the finish at once.

    ``timeout_s`` bounds the whole session (wall clock, checked whenever the caller waits for the
    child: past it the child is killed; its CPU limit, one second more, holds in between),
    ``max_output_bytes`` the bytes the child may write to each of stdout and stderr.

    No thread of its own: the caller's thread moves the bytes (``poll`` on the three pipes, the
    deadline as its timeout) whenever it waits for an answer. A child blocked on a full pipe
    meanwhile is only paused; a flood is counted as it is read.
    """

    def __init__(self, code: str, fn_name: str, *, timeout_s: float = 2.0, mem_mb: int = 256,
                 max_output_bytes: int = 65536):
        self.code, self.fn_name = code, fn_name
        self.timeout_s, self.mem_mb, self.max_output_bytes = timeout_s, mem_mb, max_output_bytes
        self.outputs: list = []
        self.result: SandboxResult | None = None
        self._seq = 0  # the last sequence number sent
        self._ready = False
        self._said_goodbye = False  # the child answered the finish: it exits by itself
        self._marker = "@@LOPD-" + secrets.token_hex(16)
        self._head = (self._marker + " ").encode()
        self._replies: collections.deque = collections.deque()  # reply bodies, marker stripped, in order
        self._to_child = bytearray()  # not yet written to the child's stdin
        self._line = bytearray()  # stdout since its last newline
        self._bytes = {"_stdout": 0, "_stderr": 0}  # read so far, against max_output_bytes
        self._err_tail = bytearray()
        self._timed_out = self._flooded = False
        self._killed_at: float | None = None
        self._server = None
        self._program: Program | None = None
        self._stdin = self._stdout = self._stderr = None  # our ends, raw non-blocking fds; None once closed
        self._parked: list[int] = []  # ends no longer read (a flood), closed with the rest
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
        request = self._request(self._seq + 1, args, kwargs)
        if self.result is not None:
            raise SessionOver(self.result)
        self._send(request)
        self._await_ready()
        return self._answer(self._seq)

    def run_all(self, calls: list[list]) -> SandboxResult:
        """``fn(*args)`` for each of ``calls``, then the finish, all sent at once: the answers come
        back in order, and the first that is not ``ok`` decides, exactly as calling one at a time
        would (the child answers in order, and an answer is on its stdout before the next call
        starts). Raises :class:`CallError` or :class:`SessionOver` as :meth:`call` does."""
        requests = [self._request(self._seq + i + 1, args, {}) for i, args in enumerate(calls)]
        if self.result is not None:
            raise SessionOver(self.result)
        for request in requests:
            self._send(request, flush=False)
        self._send(dumps_plain([self._seq + 1, None, None]))
        self._await_ready()
        for seq in range(self._seq - len(requests), self._seq):
            self._answer(seq)
        return self._finished()

    def finish(self) -> SandboxResult:
        """End the session; ``ok`` unless the child refused something, even between calls.
        Raises :class:`SessionOver` if the run is already over."""
        if self.result is not None:
            raise SessionOver(self.result)
        self._send(dumps_plain([self._seq + 1, None, None]))
        self._await_ready()
        return self._finished()

    def close(self) -> None:
        """Kill the child's process group, reap it, remove the temp dir. Idempotent."""
        if self._program is not None and not self._program.exited.is_set():
            if not (self._said_goodbye and self._program.exited.wait(_EXIT_GRACE_S)):
                self._kill()
                self._program.exited.wait(timeout=5)
        for name in ("_stdin", "_stdout", "_stderr"):
            self._close(name)
        for fd in self._parked:
            os.close(fd)
        self._parked.clear()
        try:
            os.rmdir(self._tmp)  # the common case: the program left nothing behind
        except FileNotFoundError:
            pass
        except OSError:
            shutil.rmtree(self._tmp, ignore_errors=True)

    # -------------------------------------------------------------- child process
    def _spawn(self) -> None:
        """Have the fork server fork the child, with three fresh pipes as its stdin, stdout and
        stderr; the payload (marker, code, function name) is the first line of its stdin."""
        iso = isolation()
        if iso["drop_uid"]:
            os.chown(self._tmp, NOBODY, NOBODY)
        cpu_s, mem_bytes = limit_args(self.timeout_s, self.mem_mb)
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        self._stdin, self._stdout, self._stderr = in_w, out_r, err_r
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
        self._to_child += dumps_plain({"marker": self._marker, "code": self.code, "fn": self.fn_name,
                                       "recursion_limit": RECURSION_LIMIT}).encode() + b"\n"
        self._deadline = time.monotonic() + self.timeout_s
        try:
            self._server = fork_server(iso["netns"])
            self._program = self._server.spawn(self._tmp, cpu_s, mem_bytes, iso["drop_uid"], (in_r, out_w, err_w))
        finally:
            for fd in (in_r, out_w, err_w):  # the child's ends: it holds its own copies now
                os.close(fd)

    def _kill(self) -> None:
        if self._killed_at is None:
            self._killed_at = time.monotonic()
        if self._program is not None:
            self._server.kill(self._program)  # a no-op once the server has reaped it

    # -------------------------------------------------------------- pipes
    def _write(self) -> None:
        """Write what the child's stdin can take now; if the child is gone, drop the rest (its
        stdout's end says how it went)."""
        while self._to_child and self._stdin is not None:
            try:
                n = os.write(self._stdin, self._to_child)
            except BlockingIOError:
                return
            except OSError:  # EPIPE: the child is gone
                self._to_child.clear()
                return
            del self._to_child[:n]

    def _read(self, name: str) -> bytes | None:
        """A chunk of pipe ``name`` (``"_stdout"`` or ``"_stderr"``), counted against the output limit;
        ``None`` when there is nothing to use (not ready, its end, or a flood)."""
        try:
            chunk = os.read(getattr(self, name), _CHUNK)
        except BlockingIOError:
            return None
        except OSError:
            chunk = b""
        if not chunk:
            self._close(name)
            return None
        self._bytes[name] += len(chunk)
        if self._bytes[name] > self.max_output_bytes:
            self._on_flood(name)
            return None
        return chunk

    def _read_stdout(self) -> None:
        """Complete lines that start with this run's marker are replies; nothing else counts."""
        chunk = self._read("_stdout")
        if chunk is None:
            return
        self._line += chunk
        *lines, rest = self._line.split(b"\n")
        self._line = rest
        for line in lines:
            if line.startswith(self._head):
                self._replies.append(bytes(line[len(self._head):]))

    def _read_stderr(self) -> None:
        """Counted, and its last ``_STDERR_TAIL`` bytes kept for error messages."""
        chunk = self._read("_stderr")
        if chunk is not None:
            self._err_tail += chunk
            del self._err_tail[: max(0, len(self._err_tail) - _STDERR_TAIL)]

    def _close(self, name: str) -> None:
        fd = getattr(self, name)
        if fd is not None:
            setattr(self, name, None)
            os.close(fd)

    def _on_flood(self, name: str) -> None:
        """Past the output limit: kill, and stop reading that pipe (stdout's earlier lines stand)."""
        self._flooded = True
        self._parked.append(getattr(self, name))  # left open: a closed pipe would hand the child EPIPE, an answer
        setattr(self, name, None)
        self._kill()

    def _io(self, timeout_s: float) -> None:
        """One round: wait up to ``timeout_s`` for any of the three pipes, then move what is ready."""
        poller = select.poll()
        for fd, mask in ((self._stdout, _READ), (self._stderr, _READ),
                         (self._stdin if self._to_child else None, select.POLLOUT | select.POLLERR)):
            if fd is not None:
                poller.register(fd, mask)
        ready = {fd for fd, _ in poller.poll(max(0.0, timeout_s) * 1000.0)}
        if self._stdin is not None and self._stdin in ready:
            self._write()
        if self._stdout is not None and self._stdout in ready:
            self._read_stdout()
        if self._stderr is not None and self._stderr in ready:
            self._read_stderr()

    def _next_reply(self) -> bytes | None:
        """The next reply, or ``None`` once the child's stdout is closed (or, after a kill, silent
        for ``_KILL_GRACE_S``). At the deadline, what the pipes already hold still counts; then
        the child is killed, and the replies it wrote before that are read to the end."""
        while not self._replies:
            if self._stdout is None:
                return None
            now = time.monotonic()
            if self._killed_at is not None:
                wait = self._killed_at + _KILL_GRACE_S - now
                if wait <= 0:
                    self._close("_stdout")  # killed and still not closed: give up on it
                    return None
            else:
                wait = self._deadline - now
                if wait <= 0:
                    self._io(0.0)
                    if self._replies or self._stdout is None:
                        continue
                    self._timed_out = True
                    self._kill()
                    continue
            self._io(wait)
        return self._replies.popleft()

    # -------------------------------------------------------------- protocol
    @staticmethod
    def _request(seq: int, args, kwargs) -> str:
        try:
            return dumps_plain([seq, list(args), kwargs])
        except (TypeError, ValueError) as e:
            raise NotPlainData(f"argument for the sandboxed function is not plain data: {e}") from None

    def _send(self, request: str, flush: bool = True) -> None:
        """Queue one request (the next sequence number) for the child's stdin."""
        self._seq += 1
        self._to_child += request.encode() + b"\n"
        if flush:
            self._write()

    def _await_ready(self) -> None:
        if self.result is not None:
            raise SessionOver(self.result)
        if not self._ready:
            status, value = self._receive(0)
            if status == "error":
                self._end("error", value if type(value) is str else "error")
            self._ready = True

    def _answer(self, seq: int):
        """The return value of call ``seq``; :class:`CallError` if the function raised."""
        status, value = self._receive(seq)
        if status == "error":
            raise CallError(value if type(value) is str else "error")
        self.outputs.append(value)
        return value

    def _finished(self) -> SandboxResult:
        """The finish's answer (the last request sent): the run is ``ok``, and over."""
        self._receive(self._seq)
        self._said_goodbye = True
        self.result = SandboxResult("ok", list(self.outputs), "")
        self.close()
        return self.result

    def _receive(self, seq: int):
        item = self._next_reply()
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
        until = time.monotonic() + _KILL_GRACE_S
        while self._stderr is not None and time.monotonic() < until:  # the rest of its stderr, for the detail
            self._io(until - time.monotonic())
        if self._timed_out:
            self._end("timeout", f"wall clock limit {self.timeout_s:g}s")
        if self._flooded:
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
        self._end("error", _last_line(bytes(self._err_tail)) or f"exit code {rc}")


def _last_line(stderr: bytes) -> str:
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_calls(code: str, fn_name: str, calls: list[list], *, timeout_s: float = 2.0,
              mem_mb: int = 256, max_output_bytes: int = 65536) -> SandboxResult:
    """Define ``code`` in a sandboxed child and call ``fn_name(*args)`` for each of ``calls``;
    ``ok`` with every return value (plain data), or why not (the first failure ends it).
    The calls are sent at once (:meth:`Session.run_all`): one round trip, not one per call."""
    with Session(code, fn_name, timeout_s=timeout_s, mem_mb=mem_mb,
                 max_output_bytes=max_output_bytes) as session:
        try:
            return session.run_all(calls)
        except CallError as e:
            return SandboxResult("error", None, e.detail)
        except SessionOver as e:
            return e.result
