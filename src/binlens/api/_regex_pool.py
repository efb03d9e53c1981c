"""Client regular expressions run in killable processes, bounded by a wall-clock deadline.

The `regex` engine cannot be stopped from outside a match, and its own `timeout=` counts the
process's CPU time, which runs slower than the wall clock on a busy machine. So a client's
pattern runs in a child process (`_regex_child.py`) that this side waits on in short polls: past
the caller's deadline, or when the call is cancelled, the child is killed (the server's threads,
its event loop and its signal handling never wait on a match). Idle children are kept for the
next call, so only the first regex call of a process pays a child's start-up (~50 ms).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from binlens.errors import BinlensError

if TYPE_CHECKING:
    from binlens.api.registry import CallContext

CHILD = Path(__file__).with_name("_regex_child.py")
POLL_S = 0.05  # how often a waiting call looks at its cancellation
START_S = 30.0  # a child that is not ready by then is a broken installation
KEEP_IDLE = 2

_lock = threading.Lock()
_idle: list[RegexProcess] = []
_live: set[RegexProcess] = set()


class RegexProcess:
    """One child process and its pipes."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            close_fds=True,
            start_new_session=True,  # a kill of its group never reaches the server
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # (both are pipes)
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        with _lock:
            _live.add(self)

    def kill(self) -> None:
        """Kill the child (wherever it is in a match) and reap it."""
        if self.proc.returncode is None:  # (once reaped, its group id may belong to another process)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pipe in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        with _lock:
            _live.discard(self)

    def send(self, request: tuple[Any, ...]) -> None:
        """Write one request frame."""
        blob = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.stdin.write(len(blob).to_bytes(4, "little") + blob)
        except OSError:
            raise BinlensError("internal", "the regex process stopped unexpectedly") from None

    def receive(self, ctx: CallContext | None, deadline: float) -> Any:
        """The next answer; None past `deadline` (the child is killed), `cancelled` when the call is."""
        fd = self.stdout.fileno()
        while True:
            if ctx is not None and ctx.cancelled:
                self.kill()
                raise BinlensError("cancelled", "the request was cancelled")
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                return None
            ready, _, _ = select.select([fd], [], [], min(POLL_S, left))
            if ready:
                return pickle.loads(self._read_exactly(int.from_bytes(self._read_exactly(4), "little")))

    def _read_exactly(self, size: int) -> bytes:
        parts = []
        while size:
            part = self.stdout.read(size)
            if not part:
                self.kill()
                raise BinlensError("internal", "the regex process stopped unexpectedly")
            parts.append(part)
            size -= len(part)
        return b"".join(parts)


class SharedBytes:
    """An image's bytes as the children map them: a memfd (one copy, closed with this object) that
    a child opens through /proc; without one (not Linux) each window is sent in its request."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.token: tuple[str, int] | None = None
        try:
            fd = os.memfd_create("binlens-image", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            return
        weakref.finalize(self, os.close, fd)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        self.token = (f"/proc/{os.getpid()}/fd/{fd}", os.fstat(fd).st_ino)

    def window(self, offset: int, length: int) -> Any:
        """What a request names for these bytes."""
        if self.token is None:
            return self.data[offset : offset + length]
        return (*self.token, offset, length)


class UserRegex:
    """A compiled client pattern bound to a child process for the length of one call."""

    def __init__(self, pattern: str | bytes, flags: int, ctx: CallContext | None, child: RegexProcess) -> None:
        self.pattern = pattern
        self.flags = flags
        self.ctx = ctx
        self.child: RegexProcess | None = child

    def _ask(self, kind: str, payload: Any, stop: int, want: int, deadline: float) -> Any:
        if self.child is None:  # killed at an earlier deadline
            return None
        self.child.send((kind, self.pattern, self.flags, payload, stop, want))
        answer = self.child.receive(self.ctx, deadline)
        if answer is None:
            self.child = None
        return answer

    def find(
        self, source: SharedBytes, offset: int, length: int, stop: int, want: int, deadline: float
    ) -> list[tuple[int, int, bytes]] | None:
        """Up to `want` (start, end, first 64 bytes) matches in `source`'s bytes [offset, offset +
        length) starting before `stop` (relative to `offset`); None when `deadline` passed first."""
        answer = self._ask("bytes", source.window(offset, length), stop, want, deadline)
        if isinstance(answer, tuple) and source.token is not None:
            source.token = None  # the child cannot map it (no /proc access): send the bytes
            answer = self._ask("bytes", source.window(offset, length), stop, want, deadline)
        return _checked(answer)

    def pick(self, texts: list[str], want: int, deadline: float) -> list[int] | None:
        """Indices of up to `want` texts the pattern is found in; None when `deadline` passed first."""
        return _checked(self._ask("text", texts, 0, want, deadline))


def _checked(answer: Any) -> Any:
    if isinstance(answer, tuple):
        raise BinlensError("internal", f"the regex process failed: {answer[1]}")
    return answer


def _checkout(ctx: CallContext | None) -> RegexProcess:
    while True:
        with _lock:
            idle = _idle.pop() if _idle else None
        if idle is None:
            break
        if idle.proc.poll() is None:
            return idle
        idle.kill()  # (it died while idle: reaped and forgotten)
    child = RegexProcess()
    try:
        ready = child.receive(ctx, time.monotonic() + START_S)
    except BaseException:
        child.kill()
        raise
    if ready != "ready":
        child.kill()
        raise BinlensError("unavailable", "the regex process did not start")
    return child


def _checkin(child: RegexProcess | None) -> None:
    if child is None:
        return
    with _lock:
        if len(_idle) < KEEP_IDLE:
            _idle.append(child)
            return
    child.kill()


@contextlib.contextmanager
def user_regex(pattern: str | bytes, flags: int, ctx: CallContext | None) -> Iterator[UserRegex]:
    """A child process ready to run `pattern` (already compiled once here, so it is valid)."""
    rx = UserRegex(pattern, flags, ctx, _checkout(ctx))
    try:
        yield rx
    except BaseException:
        if rx.child is not None:
            rx.child.kill()
        raise
    _checkin(rx.child)


@atexit.register
def _kill_all() -> None:
    """No child outlives the server (a stuck one also ends on its own once this process is gone)."""
    with _lock:
        live = list(_live)
        _idle.clear()
    for child in live:
        child.kill()
