"""MCP over stdio: newline-delimited JSON-RPC on stdin/stdout; logs go to stderr only.

A reader thread cuts stdin into frames (refusing any over the limit and draining it to the next
newline); every request runs as its own task so `notifications/cancelled` can stop it; EOF cancels
whatever is still running and ends the loop. `session.shutdown` (`Workspace.stop_server`) ends it
too: no frame is read after it, and the calls already running get the grace to finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from mcp_types import INVALID_REQUEST

from binlens.server.mcp_protocol import McpCore, RpcError, Session, classify, error_response, internal_error
from binlens.server.wire import FrameError, decode, dump_bytes, valid_id

log = logging.getLogger("binlens.mcp")

# Requests that run in worker threads: served concurrently (and cancellable); the rest inline, in order.
_CONCURRENT = frozenset({"tools/call", "resources/read"})
_EOF = object()
_OVERSIZE = object()
_STOP = object()  # session.shutdown: (_STOP, grace in seconds) ends the loop like EOF, after the grace


def _reader(fd: int, limit: int, put: Callable[[list[Any]], None]) -> None:
    """Read `fd` until EOF, handing the complete lines (bytes) and _OVERSIZE markers of each read to `put`.

    One `put` per read: the loop then serves a request and a cancel written right behind it in one
    pass, before the request's task starts.
    """
    buf = bytearray()
    dropping = False
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            if buf and not dropping:
                put([bytes(buf), _EOF])
            else:
                put([_EOF])
            return
        items: list[Any] = []
        dropping = _cut(chunk, buf, dropping, limit, items.append)
        if items:
            put(items)


def _cut(chunk: bytes, buf: bytearray, dropping: bool, limit: int, put: Callable[[Any], None]) -> bool:
    """Append `chunk` to `buf`, handing out each complete line; returns whether an oversize line is being dropped."""
    start = 0
    while True:
        nl = chunk.find(b"\n", start)
        if nl < 0:
            if not dropping:
                buf += chunk[start:]
                if len(buf) > limit:
                    buf.clear()
                    dropping = True
                    put(_OVERSIZE)
            return dropping
        if dropping:
            dropping = False
        else:
            buf += chunk[start:nl]
            if len(buf) > limit:
                put(_OVERSIZE)
            elif buf.strip():
                put(bytes(buf))
            buf.clear()
        start = nl + 1


class StdioServer:
    """One stdio connection: a Session plus the frame loop."""

    def __init__(self, core: McpCore, *, max_frame_bytes: int = 1 << 20, out: BinaryIO | None = None) -> None:
        self.core = core
        self.limit = max_frame_bytes
        self.session = Session()
        self.out = out
        self._tasks: set[asyncio.Task[Any]] = set()

    def _write(self, message: dict[str, Any]) -> None:
        assert self.out is not None
        try:
            data = dump_bytes(message) + b"\n"
        except Exception:  # noqa: BLE001 - one message the encoder refuses must not end the server
            log.exception("could not encode a message; dropped")
            return
        try:
            self.out.write(data)
            self.out.flush()
        except (BrokenPipeError, ValueError):
            log.info("stdout closed; dropping a message")

    async def _notify(self, message: dict[str, Any]) -> None:
        self._write(message)

    async def run(self, fd: int = 0) -> None:
        """Serve until EOF on `fd`; outstanding calls are cancelled at EOF."""
        if self.out is None:
            import sys

            self.out = sys.stdout.buffer
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        thread = threading.Thread(
            target=_reader,
            args=(fd, self.limit, lambda items: loop.call_soon_threadsafe(queue.put_nowait, items)),
            name="binlens-stdin",
            daemon=True,
        )
        thread.start()
        # debugger stop events (from gdb's reader threads) as `{prefix}.debug.event` notifications
        from binlens.api.debug_target import listeners as debug_listeners  # (the domain loads with the catalog)

        event_method = f"{self.core.tools.prefix}.debug.event"

        def push(event: dict[str, Any]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._write, {"jsonrpc": "2.0", "method": event_method, "params": event})

        pushers = debug_listeners(self.core.ws)
        pushers.append(push)

        def stop(grace_s: float) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, [(_STOP, grace_s)])

        self.core.ws.stop_server = stop
        try:
            while await self._items(await queue.get()):
                pass
        finally:
            self.core.ws.stop_server = None
            pushers.remove(push)
        self.session.cancel_all()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _items(self, items: list[Any]) -> bool:
        """Serve the frames of one read in order; False at EOF."""
        for item in items:
            if item is _EOF:
                return False
            if isinstance(item, tuple) and item[0] is _STOP:
                if self._tasks:  # (the shutdown call's own task among them: its answer goes out first)
                    await asyncio.wait(set(self._tasks), timeout=item[1])
                return False
            if item is _OVERSIZE:
                err = RpcError(INVALID_REQUEST, f"frame over the {self.limit}-byte limit; dropped up to the newline")
                self._write(error_response(err, None, self.session.negotiated, identifiable=False))
                continue
            try:
                await self._frame(item)
            except Exception:  # noqa: BLE001 - every frame gets an answer and the server keeps serving
                log.exception("internal error serving a frame")
                self._write(error_response(internal_error(), None, self.session.negotiated, identifiable=False))
        return True

    async def _frame(self, data: bytes) -> None:
        version = self.session.negotiated
        try:
            msg = decode(data)
        except FrameError as err:
            rpc = RpcError(err.code, err.message)
            self._write(error_response(rpc, err.id, version, identifiable=err.identifiable))
            return
        try:
            inbound = classify(msg, version)
        except RpcError as err:
            rid = msg.get("id") if isinstance(msg, dict) else None
            ok = valid_id(rid)
            self._write(error_response(err, rid, version, identifiable=ok))
            return
        if inbound.kind == "response":
            return  # this server sends no requests, so there is nothing to match
        if inbound.kind == "notification":
            if inbound.method == "notifications/initialized":
                return
            self.core.handle_notification(inbound, self.session)
            return
        if self.session.running(inbound.id):
            reused = RpcError(INVALID_REQUEST, f"id {inbound.id!r} is already used by a running request")
            self._write(error_response(reused, inbound.id, version))
            return
        if inbound.method not in _CONCURRENT:
            await self._request(inbound)  # cheap and in order: initialize settles the era before the next frame
            return
        task = asyncio.ensure_future(self._request(inbound))
        self.session.begin(inbound.id, task)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _request(self, inbound: Any) -> None:
        try:
            version = self.core.request_version(inbound, self.session, None)
        except RpcError as err:
            self._write(error_response(err, inbound.id, self.session.negotiated))
            return
        try:
            response = await self.core.handle_request(inbound, version, session=self.session, notify=self._notify)
        except asyncio.CancelledError:
            return  # cancelled by the client (or EOF): no response, as MCP asks
        except Exception:  # noqa: BLE001 - the request is answered and the server keeps serving
            log.exception("internal error serving %s", inbound.method)
            response = error_response(internal_error(), inbound.id, version)
        self._write(response)


def serve_stdio(core: McpCore, *, max_frame_bytes: int = 1 << 20) -> int:
    """Run the stdio server until EOF; returns the exit status (0)."""
    server = StdioServer(core, max_frame_bytes=max_frame_bytes)
    asyncio.run(server.run())
    return 0
