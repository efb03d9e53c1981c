"""Bounded connections for `binlens serve`: a cap, a header timeout, an idle timeout, quiet logs.

uvicorn's h11 protocol arms no timer until a first response is sent (its keep-alive timeout), so a
client that connects and sends nothing, or half a request head, holds its connection (and a file
descriptor) forever, and `limit_concurrency` only answers 503 to complete requests. This subclass
of the protocol adds, per connection:

- a **cap** on open connections (HTTP and upgraded WebSockets alike): at the cap a new connection
  evicts the oldest one still waiting for its request head, or, when none is waiting, gets a 503
  and is closed; a flood of idle sockets cannot lock out a client that sends a request at once;
- a **header timeout**: a request head must arrive complete within it, from the connection's
  start or from the first byte of the next request on a kept-alive connection;
- an **idle timeout**: a request body that stops arriving, or a client that stops reading a
  response (the server's write buffer stays full), closes the connection, which also frees what
  was buffered for it.

`RateLimitFilter` keeps a storm of identical log records (accept errors when descriptors run
out, refused connections, invalid requests) to a few lines per interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("binlens.server")

_FULL_BODY = b'{"error": {"status": 503, "message": "too many connections; retry shortly"}}'
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: " + str(len(_FULL_BODY)).encode() + b"\r\n\r\n" + _FULL_BODY
)


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of `binlens serve` (options `--max-connections`, `--header-timeout`, `--idle-timeout`)."""

    max_connections: int = 256
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0


class BinlensH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap, a header timeout and an idle timeout."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    # Connections waiting for a request head, oldest first (a dict keeps insertion order).
    waiting: ClassVar[dict[BinlensH11Protocol, None]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = ""

    # --- connection life -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as H11Protocol does
        """Count the connection; over the cap evict the oldest idle one or refuse this one."""
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._evict_oldest_waiting():
            self.connections.discard(self)
            log.warning("connection refused: %d connections are open (--max-connections)", self.limits.max_connections)
            transport.write(_FULL)
            transport.close()
            return
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection's timer."""
        self._disarm()
        super().connection_lost(exc)

    def _evict_oldest_waiting(self) -> bool:
        for other in list(self.waiting):
            if other is not self and other.transport is not None and not other.transport.is_closing():
                log.warning("at --max-connections: closed the oldest connection still waiting for a request head")
                other._abort()
                return True
        return False

    # --- events that change what the connection waits for ------------------------------------
    def data_received(self, data: bytes) -> None:
        """Feed h11, then re-arm for what comes next (a head, a body, nothing)."""
        super().data_received(data)
        self._watch(fresh=True)

    def on_response_complete(self) -> None:
        """After a response the keep-alive timeout governs the idle connection."""
        super().on_response_complete()
        self._watch()

    def pause_writing(self) -> None:
        """The client stopped reading: it has `idle_timeout_s` to resume."""
        super().pause_writing()
        self._watch()

    def resume_writing(self) -> None:
        """The client reads again."""
        super().resume_writing()
        self._watch()

    # --- the one timer -----------------------------------------------------------------------
    def _watch(self, fresh: bool = False) -> None:
        """Arm the timer for what the connection waits on, or disarm it when it waits on the server."""
        transport = self.transport
        if transport is None or transport.is_closing() or transport.get_protocol() is not self:
            self._disarm()
            return
        if self.flow is not None and self.flow.write_paused:
            self._arm("write", self.limits.idle_timeout_s, reset=False)
            return
        state = self.conn.their_state
        if state is h11.IDLE and (fresh or self.cycle is None):
            # a new head: from the connection's start or the first byte after a keep-alive pause
            self._arm("head", self.limits.header_timeout_s, reset=False)
        elif state is h11.SEND_BODY and self.conn.our_state is not h11.DONE:
            self._arm("body", self.limits.idle_timeout_s, reset=fresh)
        else:
            self._disarm()

    def _arm(self, kind: str, delay: float, *, reset: bool) -> None:
        if self._timer is not None and self._timer_kind == kind and not reset:
            return
        self._disarm()
        self._timer = self.loop.call_later(delay, self._expired, kind)
        self._timer_kind = kind
        if kind == "head":
            self.waiting[self] = None

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_kind = ""
        self.waiting.pop(self, None)

    def _expired(self, kind: str) -> None:
        self._timer = None
        what = {"head": "no complete request head", "body": "the request body stalled", "write": "not reading"}
        log.info("closed an idle connection (%s)", what.get(kind, kind))
        self._abort()

    def _abort(self) -> None:
        """Close at once, dropping whatever is buffered for the client."""
        self._disarm()
        if self.transport is not None and self.transport.get_protocol() is self:
            self.transport.abort()


def http_protocol(limits: ConnectionLimits) -> type[BinlensH11Protocol]:
    """The protocol class to give uvicorn (`Config(http=...)`) for these limits."""
    return type("BinlensH11Protocol", (BinlensH11Protocol,), {"limits": limits, "waiting": {}})


class RateLimitFilter(logging.Filter):
    """Let through at most `burst` records with the same logger and message template per `interval_s`.

    The first record of the next interval says how many were suppressed. Keys are message
    templates, not their arguments, so the table stays small whatever clients send.
    """

    def __init__(self, interval_s: float = 10.0, burst: int = 3) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.burst = burst
        self._seen: dict[tuple[str, str], list[float]] = {}  # key -> [window start, passed, suppressed]

    def filter(self, record: logging.LogRecord) -> bool:
        """True to write the record."""
        key = (record.name, record.msg if isinstance(record.msg, str) else type(record.msg).__name__)
        now = time.monotonic()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] >= self.interval_s:
            suppressed = int(entry[2]) if entry is not None else 0
            self._seen[key] = [now, 1, 0]
            if suppressed and isinstance(record.msg, str):
                record.msg = record.msg + f" ({suppressed} more like it in the last {self.interval_s:g} s not logged)"
            return True
        if entry[1] < self.burst:
            entry[1] += 1
            return True
        entry[2] += 1
        return False


def install_log_rate_limit(interval_s: float = 10.0, burst: int = 3) -> RateLimitFilter:
    """Rate-limit the loggers clients can make noisy (asyncio accept errors, uvicorn, ours)."""
    flt = RateLimitFilter(interval_s, burst)
    for name in ("asyncio", "uvicorn.error", "binlens.server"):
        logging.getLogger(name).addFilter(flt)
    return flt


def accept_backlog(max_connections: int) -> int:
    """The listen backlog: also how many connections asyncio accepts in one go, before any is checked."""
    return max(4, min(64, max_connections // 4))


def fit_fd_limit(max_connections: int, reserve: int = 32) -> tuple[int, int]:
    """Raise the soft descriptor limit to fit the cap (up to the hard limit); the (cap, backlog) that fit.

    Each connection holds a descriptor, and asyncio accepts up to a backlog of connections at a
    time (a few rounds of them before the ones over the cap are closed), so the budget is
    cap + 3 x backlog + `reserve` (database, program files, pipes, the listening socket): accept()
    then never runs out of descriptors.
    """
    backlog = accept_backlog(max_connections)
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return max_connections, backlog
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + 3 * backlog + reserve
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= want:
        return max_connections, backlog
    cap = max(1, (soft - reserve) * 4 // 7)
    return cap, accept_backlog(cap)
