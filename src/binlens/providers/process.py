"""A provider session in a process of its own, spoken to in frames over a pipe.

`ProcessSession` starts `python -m binlens.providers.child` in its own process group, under a
memory limit, on first use; sends it the program (`open`) and then one request at a time. Every
wait is bounded and polled: past the call's deadline the whole group is killed (`timeout`), a
cancelled call kills it too (`cancelled`), a child that dies (a crash, a signal) or runs out of
memory is `internal` with the reason, and a child that cannot start is `unavailable`. The server
never dies with its provider: the next call starts a fresh process and opens the program again;
the failed call's failure is its result, never retried behind the client's back.

Calls on one session take turns, first come first served: a call that finds the process serving
another waits in a short queue (`max_waiting` calls; one more is `busy`), within its own timeout
(past it, `timeout` without touching the running call) and cancellation, reporting as progress
how many calls are ahead of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from binlens.errors import STATUS, BinlensError
from binlens.providers import frames
from binlens.providers.base import Cancellable

log = logging.getLogger("binlens")

POLL_S = 0.05  # how often a waiting call looks at its cancellation
CHUNK = 1 << 20
DEFAULT_MEMORY_LIMIT = 2 << 30
DEFAULT_START_TIMEOUT = 30.0
DEFAULT_MAX_ANSWER = 256 << 20  # bytes of one answer frame the server reads; a bigger one is refused unread
CLOSE_WAIT_S = 2.0
DEFAULT_MAX_WAITING = 4  # calls queued behind the running one; one more is `busy`
MAX_MESSAGE = 2000  # characters of a child's error message passed on


class _Deadline(Exception):
    pass


class _Cancelled(Exception):
    pass


class _Gone(Exception):
    pass


def _source_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ProcessSession:
    """One provider session: a child process (`handler` names its child side, "module:attribute")
    that gets `open_args`/`open_blob` as its first request and then the calls, one at a time."""

    def __init__(
        self,
        provider: str,
        handler: str,
        *,
        open_args: dict[str, Any] | None = None,
        open_blob: bytes = b"",
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> None:
        self.provider = provider
        self.handler = handler
        self.open_args = open_args or {}
        self.open_blob = open_blob
        self.memory_limit = memory_limit
        self.start_timeout = start_timeout
        self.max_answer_bytes = max_answer_bytes
        self.max_waiting = max_waiting
        self.starts = 0  # processes started so far (a crash or a timeout makes the next call start one)
        self._proc: subprocess.Popen[bytes] | None = None
        # the turn: `_serving` while a call (or close) talks to the child; `_queue` holds the
        # tickets of the calls waiting for it, first come first served
        self._turn = threading.Condition()
        self._serving = False
        self._queue: deque[object] = deque()
        self._closed = False
        # kills the running child when the session is dropped unclosed, or when the server exits
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # --- the calls ------------------------------------------------------------------------
    def call(
        self,
        op: str,
        args: dict[str, Any],
        blob: bytes = b"",
        *,
        timeout: float,
        ctx: Cancellable | None = None,
        reuse: Callable[[], dict[str, Any] | None] | None = None,
        keep: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[dict[str, Any], bytes]:
        """Send request `op` and return the child's (result, blob) within `timeout` seconds, the wait
        for the session's turn included (starting the process, when it is not running, has its own
        bound: `start_timeout`). `keep(result)` runs before the turn passes on (to store it where
        the calls waiting can find it); a call that had to wait first asks `reuse` for such an
        answer and returns it, with no blob, instead of sending `op`."""
        deadline = time.monotonic() + timeout
        waited = self._take_turn(deadline, ctx, timeout)
        try:
            if waited and reuse is not None and not self._closed:
                answer = reuse()
                if answer is not None:
                    return answer, b""
            if self._closed:
                raise BinlensError(
                    "unavailable",
                    f"the {self.provider} session is closed",
                    details={"provider": self.provider, "reason": "closed"},
                )
            started = time.monotonic()
            self._ensure_started(ctx)
            deadline += time.monotonic() - started
            result, answer_blob = self._exchange(op, args, blob, deadline, ctx, timeout)
            if keep is not None:
                keep(result)
            return result, answer_blob
        finally:
            self._end_turn()

    def _take_turn(self, deadline: float, ctx: Cancellable | None, timeout: float) -> bool:
        """Wait until this call may talk to the child: at once when nobody does, else in the queue
        (`busy` when it is full) until the calls ahead are done, the deadline passes (`timeout`),
        the call is cancelled or the session closes (`unavailable`). True when it waited."""
        ticket = object()
        with self._turn:
            if not self._serving and not self._queue:
                self._serving = True
                return False
            if len(self._queue) >= self.max_waiting:
                raise BinlensError(
                    "busy",
                    f"the {self.provider} session of this program is serving a call and "
                    f"{len(self._queue)} more are waiting; retry shortly",
                    details={"provider": self.provider, "waiting": len(self._queue)},
                )
            self._queue.append(ticket)
        told = -1
        try:
            while True:
                with self._turn:
                    if self._closed:
                        raise BinlensError(
                            "unavailable",
                            f"the {self.provider} session was closed while the call waited for it",
                            details={"provider": self.provider, "reason": "closed"},
                        )
                    if not self._serving and self._queue[0] is ticket:
                        self._queue.popleft()
                        self._serving = True
                        self._turn.notify_all()
                        return True
                    ahead = self._queue.index(ticket) + (1 if self._serving else 0)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BinlensError(
                            "timeout",
                            f"the {self.provider} session of this program was serving other calls for the "
                            f"whole {timeout:g} s of this call's timeout",
                            details={"provider": self.provider, "reason": "queued", "timeout_ms": int(timeout * 1000)},
                        )
                    if ctx is not None and ctx.cancelled:
                        raise BinlensError("cancelled", "the request was cancelled while it waited for its turn")
                    if ahead == told:
                        self._turn.wait(min(POLL_S, left))
                        continue
                told = ahead
                self._report_wait(ahead, ctx)
        except BaseException:
            with self._turn:
                if ticket in self._queue:
                    self._queue.remove(ticket)
                self._turn.notify_all()
            raise

    def _report_wait(self, ahead: int, ctx: Cancellable | None) -> None:
        relay = getattr(ctx, "progress", None)
        if callable(relay):
            calls = "call" if ahead == 1 else "calls"
            relay(0.0, None, f"waiting for the {self.provider} session: {ahead} {calls} ahead")

    def _end_turn(self) -> None:
        with self._turn:
            self._serving = False
            self._turn.notify_all()

    @property
    def pid(self) -> int | None:
        """The running child's process id, or None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def close(self) -> None:
        """Refuse later calls and end the child: asked to exit (killed if it does not within a
        moment), or killed at once when a call is running (that call then answers `unavailable`,
        as do the calls waiting for their turn)."""
        with self._turn:
            self._closed = True
            self._turn.notify_all()
            if self._serving:
                proc = self._proc
                if proc is not None and proc.returncode is None:  # (the running call reaps it)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                return
            self._serving = True
        try:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                self._reap()
                return
            with contextlib.suppress(OSError, _Deadline, _Gone, _Cancelled):
                self._send(frames.encode({"op": "close", "args": {}}), time.monotonic() + CLOSE_WAIT_S, None)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(CLOSE_WAIT_S)
            self._reap()
        finally:
            self._end_turn()

    def kill(self) -> None:
        """Kill the child's whole process group now (whatever it is doing) and reap it."""
        proc = self._proc
        if proc is not None and proc.returncode is None:  # (once reaped, its group id may be reused)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._reap()

    # --- the process ----------------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PYTHONPATH"] = _source_root() + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "binlens.providers.child", "--memory-limit", str(self.memory_limit), self.handler]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            env=env,
            close_fds=True,
            start_new_session=True,  # a kill of its group takes what it runs, never the server
        )
        for pipe in (proc.stdin, proc.stdout):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
        self._finalizer = weakref.finalize(self, _kill_group, proc)
        self.starts += 1
        return proc

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            _kill_group(proc)

    def _ensure_started(self, ctx: Cancellable | None) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._reap()
        self._proc = self._spawn()
        deadline = time.monotonic() + self.start_timeout
        try:
            self._exchange_raw(None, deadline, ctx)  # the ready frame
            self._exchange_raw(frames.encode({"op": "open", "args": self.open_args}, self.open_blob), deadline, ctx)
        except BinlensError as err:
            if err.code in ("cancelled", "busy"):
                raise
            self.kill()
            raise BinlensError(
                "unavailable",
                f"the {self.provider} provider did not start: {err.message}",
                details={**err.details, "provider": self.provider, "reason": "start_failed"},
            ) from None

    # --- one request ----------------------------------------------------------------------
    def _exchange(
        self, op: str, args: dict[str, Any], blob: bytes, deadline: float, ctx: Cancellable | None, timeout: float
    ) -> tuple[dict[str, Any], bytes]:
        try:
            return self._exchange_raw(frames.encode({"op": op, "args": args}, blob), deadline, ctx, timeout)
        except BinlensError as err:
            err.details.setdefault("provider", self.provider)
            raise

    def _exchange_raw(
        self,
        request: list[bytes | memoryview] | None,
        deadline: float,
        ctx: Cancellable | None,
        timeout: float | None = None,
    ) -> tuple[dict[str, Any], bytes]:
        """Send `request` (None: only read) and read the answer, turning every failure into a BinlensError."""
        try:
            if request is not None:
                self._send(request, deadline, ctx)
            message, blob = self._receive(deadline, ctx)
            while "progress" in message:  # reports ahead of the answer
                self._relay(message["progress"], ctx)
                message, blob = self._receive(deadline, ctx)
        except _Deadline:
            self.kill()
            seconds = timeout if timeout is not None else self.start_timeout
            raise BinlensError(
                "timeout",
                f"the {self.provider} provider did not answer within {seconds:g} s; its process was stopped",
                details={"provider": self.provider, "reason": "timeout", "timeout_ms": int(seconds * 1000)},
            ) from None
        except _Cancelled:
            self.kill()
            raise BinlensError("cancelled", "the request was cancelled") from None
        except frames.FrameError as err:
            self.kill()
            log.error("provider %s: %s", self.provider, err)
            raise BinlensError(
                "internal",
                f"the {self.provider} provider sent an answer that is not a frame or is too large; "
                "its process was stopped",
                details={"provider": self.provider, "reason": "bad_answer", "max_answer_bytes": self.max_answer_bytes},
            ) from None
        except _Gone as err:
            if self._closed:
                self.kill()
                raise BinlensError(
                    "unavailable",
                    f"the {self.provider} session was closed during the call",
                    details={"provider": self.provider, "reason": "closed"},
                ) from None
            raise self._died(str(err)) from None
        if message.get("ok") is True:
            result = message.get("result")
            return (result if isinstance(result, dict) else {}), blob
        if message.get("fatal"):
            self.kill()
        raise self._failure(message.get("error"))

    def _relay(self, report: Any, ctx: Cancellable | None) -> None:
        """Pass a child's progress report (its types checked, its text bounded) to the call's context."""
        relay = getattr(ctx, "progress", None)
        if not callable(relay) or not isinstance(report, dict):
            return
        done, total, text = report.get("done"), report.get("total"), report.get("message")
        if not isinstance(done, (int, float)) or not (total is None or isinstance(total, (int, float))):
            return
        try:
            relay(float(done), None if total is None else float(total), str(text)[:200] if text is not None else None)
        except BinlensError as err:
            if err.code == "cancelled":  # (the context checks cancellation as it reports)
                raise _Cancelled from None
            raise

    def _failure(self, error: Any) -> BinlensError:
        """The BinlensError of a child's error frame (its code checked, its text bounded)."""
        if not isinstance(error, dict):
            error = {}
        code = error.get("code") if error.get("code") in STATUS else "internal"
        message = str(error.get("message") or "the provider failed")[:MAX_MESSAGE]
        details = error.get("details") if isinstance(error.get("details"), dict) else {}
        details = {**details, "provider": self.provider}
        if details.get("reason") == "memory_limit":
            details["memory_limit_bytes"] = self.memory_limit
            message = f"the {self.provider} provider ran out of memory (limit {self.memory_limit >> 20} MiB)"
        if code == "internal":
            log.error("provider %s: %s", self.provider, message)
        return BinlensError(code, message, details=details)

    def _died(self, why: str) -> BinlensError:
        """The error of a child that went away: reaped, its fate reported."""
        proc = self._proc
        status: int | None = None
        if proc is not None:
            try:
                status = proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
                status = proc.returncode
        self._reap()
        details: dict[str, Any] = {"provider": self.provider, "reason": "crashed"}
        if status is not None and status < 0:
            with contextlib.suppress(ValueError):
                details["signal"] = signal.Signals(-status).name
            what = f"was killed by {details.get('signal', -status)}"
        elif status is not None:
            details["exit_status"] = status
            what = f"exited with status {status}"
        else:
            what = "stopped answering"
        log.error("provider %s: its process %s (%s)", self.provider, what, why)
        return BinlensError("internal", f"the {self.provider} provider's process {what}", details=details)

    # --- the pipe -------------------------------------------------------------------------
    def _wait(self, fd: int, write: bool, deadline: float, ctx: Cancellable | None) -> None:
        while True:
            if ctx is not None and ctx.cancelled:
                raise _Cancelled
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Deadline
            r, w, _ = select.select([] if write else [fd], [fd] if write else [], [], min(POLL_S, left))
            if r or w:
                return

    def _send(self, parts: list[bytes | memoryview], deadline: float, ctx: Cancellable | None) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise _Gone("no process")
        fd = proc.stdin.fileno()
        for part in parts:
            view = memoryview(part).cast("B")
            while view:
                self._wait(fd, True, deadline, ctx)
                try:
                    n = os.write(fd, view[:CHUNK])
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    raise _Gone("peer closed its input") from None
                view = view[n:]

    def _read(self, fd: int, n: int, deadline: float, ctx: Cancellable | None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self._wait(fd, False, deadline, ctx)
            try:
                chunk = os.read(fd, min(n - len(buf), CHUNK))
            except BlockingIOError:
                continue
            if not chunk:
                raise _Gone("peer closed")
            buf += chunk
        return bytes(buf)

    def _receive(self, deadline: float, ctx: Cancellable | None) -> tuple[dict[str, Any], bytes]:
        proc = self._proc
        if proc is None or proc.stdout is None:
            raise _Gone("no process")
        fd = proc.stdout.fileno()
        size, blob = frames.decode_header(self._read(fd, frames.HEADER.size, deadline, ctx), self.max_answer_bytes)
        message = frames.decode_body(self._read(fd, size, deadline, ctx))
        return message, self._read(fd, blob, deadline, ctx)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a child's process group (unless it is reaped: its group id may be reused) and close its pipes."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
