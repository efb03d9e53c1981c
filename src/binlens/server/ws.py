"""WebSocket JSON-RPC 2.0 at `/ws` (SPEC §4), generated from the method registry.

One text frame = one JSON-RPC message. On connect the server sends the notification
`{prefix}.ready` with the session id and the open programs. A request is exactly
`{"jsonrpc": "2.0", "id": string|integer, "method": "domain.verb", "params": {...}}`
(`params` may be left out; no other member is allowed). Answers:

- invalid JSON: -32700 with `id: null`; not a request object (or a batch array): -32600;
- an unknown method: -32601 with the `not_found` error object in `data`;
- a method failure (validation included): -32000 with the error object
  `{status, code, message, target, details}` in `data`;
- the socket stays open after any of these.

Methods run in worker threads (`binlens.api.invoke` is synchronous), at most `max_concurrent`
at once across all connections; beyond that a request fails at once with `busy`. Long calls push
`$/progress` notifications `{id, progress, total, message}`; the client cancels a running request
with the notification `{"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": ...}}`
(the request then answers -32000 `cancelled`). `WsHub.notify`/`broadcast` (in the loop) and
`WsHub.post` (from any thread) push any other notification (debugger events) to connected clients.

Handshake refusals happen before the upgrade (denial response): 404 on other paths, 409 when
`ws_clients` clients are already connected; the security middleware adds 400/401/403. A plain
HTTP request to /ws gets 400 (GET without upgrade headers) or 405 (any other method).
Close codes: 1000 normal, 1001 server stopping, 1003 binary frame or fragmented message
(ws_protocol), 1009 frame over the limit (enforced by the protocol layer before the frame is
buffered).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import uuid
from typing import Any

from starlette.types import Receive, Scope, Send

from binlens.api.registry import (
    REGISTRY,
    CallContext,
    frame_size,
    invoke,
    program_identity,
    response_too_large,
    retained_reference,
)
from binlens.errors import BinlensError
from binlens.server.auth import caller_peer, client_label, refuse, user_agent_product
from binlens.server.options import ServerOptions
from binlens.server.slots import shared_slots
from binlens.server.wire import FrameError, decode, dumps, valid_id
from binlens.workspace import Workspace

log = logging.getLogger("binlens.ws")

INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
METHOD_NOT_FOUND = -32601
METHOD_FAILED = -32000
CANCEL_METHOD = "$/cancelRequest"
PROGRESS_METHOD = "$/progress"
REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003


def rpc_error(msg_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response (`data` only when given)."""
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": msg_id, "error": err}


class WsHub:
    """The connected /ws clients of one server: slots, notifications, shutdown."""

    def __init__(self, ws: Workspace, opts: ServerOptions) -> None:
        self.ws = ws
        self.opts = opts
        self.max_clients = max(1, opts.ws_clients)
        self.max_concurrent = opts.max_concurrent or ws.limits.max_concurrent
        self.sessions: dict[str, WsSession] = {}
        self.slots = shared_slots(ws, self.max_concurrent)
        self.max_concurrent = self.slots.limit
        self.pool = concurrent.futures.ThreadPoolExecutor(self.max_concurrent, thread_name_prefix="binlens-ws")
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        # debugger stop events, from gdb's reader threads, to every connected client
        from binlens.api.debug_target import listeners as debug_listeners  # (the domain loads with the catalog)

        event_method = f"{opts.tool_prefix}.debug.event"

        def push(event: dict[str, Any]) -> None:
            self.post(event_method, event)

        debug_listeners(ws).append(push)

    # --- work slots -----------------------------------------------------------------------
    def try_start(self) -> bool:
        """Take one of the server's `max_concurrent` call slots (shared with MCP), or say there is none free."""
        return self.slots.try_take()

    def finish(self) -> None:
        """Give a call slot back."""
        self.slots.give()

    @property
    def running(self) -> int:
        """Calls of any transport holding a slot right now."""
        return self.slots.running

    # --- notifications --------------------------------------------------------------------
    async def notify(self, session_id: str, method: str, params: dict[str, Any]) -> bool:
        """Send a notification to one connected client; False when it is gone."""
        sess = self.sessions.get(session_id)
        if sess is None:
            return False
        return await sess.notify(method, params)

    async def broadcast(self, method: str, params: dict[str, Any]) -> int:
        """Send a notification to every connected client; returns how many got it."""
        sent = 0
        for sess in list(self.sessions.values()):
            sent += await sess.notify(method, params)
        return sent

    def post(self, method: str, params: dict[str, Any], session_id: str | None = None) -> bool:
        """Thread-safe: queue a notification for one client (or all when `session_id` is None).

        For producers outside the event loop (debugger event threads). False when no client has
        connected yet, so there is no loop to post to.
        """
        loop = self.loop
        if loop is None or loop.is_closed():
            return False
        coro: Any = self.broadcast(method, params) if session_id is None else self.notify(session_id, method, params)
        try:
            asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop stopped between the check and the call
            coro.close()
            return False
        return True

    async def close_all(self, code: int = CLOSE_GOING_AWAY, reason: str = "server stopping") -> None:
        """Close every client (1001 when the server stops) and cancel their calls."""
        self.stopping = True
        await asyncio.gather(*(s.close(code, reason) for s in list(self.sessions.values())), return_exceptions=True)

    # --- ASGI -----------------------------------------------------------------------------
    async def endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI app of /ws for both scope types: HTTP gets 400/405, a WebSocket is served."""
        if scope["type"] == "http":
            if scope["method"] == "GET":
                why = "/ws needs a WebSocket upgrade (Connection: Upgrade, Upgrade: websocket)"
                await refuse(scope, send, 400, why)
            else:
                await refuse(scope, send, 405, f"{scope['method']} is not allowed on /ws", [(b"allow", b"GET")])
            return
        if scope["type"] != "websocket":
            return
        self.loop = asyncio.get_running_loop()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        version = headers.get("sec-websocket-version", "13").strip()
        if version != "13":
            await refuse(scope, send, 400, f"WebSocket version {version!r} is not supported; use 13")
            return
        if self.stopping:
            await refuse(scope, send, 503, "the server is stopping")
            return
        # Checked and taken with no await in between: two handshakes cannot both pass.
        if len(self.sessions) >= self.max_clients:
            what = "exclusive mode" if self.max_clients == 1 else f"--ws-clients {self.max_clients}"
            await refuse(scope, send, 409, f"a WebSocket client is already connected ({what})")
            return
        sess = WsSession(self, scope, receive, send)
        self.sessions[sess.id] = sess
        try:
            await sess.run()
        finally:
            self.sessions.pop(sess.id, None)
            sess.cancel_all()

    async def not_found(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket handshake on any other path: 404 before the upgrade."""
        await refuse(scope, send, 404, f"no WebSocket endpoint at {scope.get('path')}; use /ws")


class WsSession:
    """One connected client: reads frames, dispatches requests, writes responses and notifications."""

    def __init__(self, hub: WsHub, scope: Scope, receive: Receive, send: Send) -> None:
        self.hub = hub
        self.id = "ws-" + uuid.uuid4().hex[:16]
        self.scope = scope
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        # the journal's name for this client: stable across its connections, unlike `id`
        self.client = client_label("ws", user_agent_product(headers.get("user-agent")), headers.get("authorization"))
        self._receive = receive
        self._send = send
        self._send_lock = asyncio.Lock()
        self.open = False
        self.closing = False
        self.calls: dict[str | int, CallContext] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def prefix(self) -> str:
        return self.hub.opts.tool_prefix

    # --- output ---------------------------------------------------------------------------
    async def send(self, message: dict[str, Any]) -> bool:
        """Write one JSON-RPC message; False when the socket is already closed."""
        if not self.open:
            return False
        text = dumps(message)
        async with self._send_lock:
            if not self.open:
                return False
            try:
                await self._send({"type": "websocket.send", "text": text})
            except (OSError, RuntimeError):  # the client went away mid-write
                self.open = False
                return False
        return True

    async def notify(self, method: str, params: dict[str, Any]) -> bool:
        """Send a notification (no id)."""
        return await self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def close(self, code: int, reason: str = "") -> None:
        """Close the socket with `code` and cancel every running call of this client."""
        self.cancel_all()
        async with self._send_lock:
            if not self.open or self.closing:
                return
            self.closing = True
            with contextlib.suppress(OSError, RuntimeError):
                await self._send({"type": "websocket.close", "code": code, "reason": reason})
            self.open = False

    def cancel_all(self) -> None:
        """Ask every running call of this client to stop."""
        for ctx in list(self.calls.values()):
            ctx.cancel()

    # --- input ----------------------------------------------------------------------------
    async def run(self) -> None:
        """Accept, announce, then serve frames until the client or the server closes."""
        first = await self._receive()
        if first["type"] != "websocket.connect":
            return
        await self._send({"type": "websocket.accept"})
        self.open = True
        ws = self.hub.ws
        log.info("WebSocket client %s connected", self.id)
        await self.notify(
            f"{self.prefix}.ready",
            {
                "session": self.id,
                "server": ws.config.server_name,
                "version": ws.version,
                "read_only": ws.read_only,
                "programs": [p.identity for p in list(ws.programs.values())],
                "limits": {"max_concurrent": self.hub.max_concurrent, "max_frame_bytes": self.hub.opts.max_frame_bytes},
                "cancel_method": CANCEL_METHOD,
                "progress_method": PROGRESS_METHOD,
            },
        )
        while True:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                self.open = False
                log.info("WebSocket client %s left (code %s)", self.id, message.get("code"))
                return
            if kind != "websocket.receive":
                continue
            text = message.get("text")
            if text is None:
                await self.close(CLOSE_UNSUPPORTED, "binary frames are not supported: send JSON-RPC as text")
                continue  # wait for the disconnect that follows our close
            if self.closing:
                continue
            try:
                await self.handle_text(text)
            except Exception:  # noqa: BLE001 - every frame gets an answer and the socket stays open
                log.exception("internal error serving a frame of %s", self.id)
                await self.send(rpc_error(None, INTERNAL_ERROR, "Internal error: see the server log"))

    async def handle_text(self, text: str) -> None:
        """Parse and validate one frame, then answer it or start its call."""
        try:
            msg = decode(text, reject_constants=True)
        except FrameError as err:
            await self.send(rpc_error(err.id if err.identifiable else None, err.code, err.message))
            return
        if isinstance(msg, list):
            await self.send(rpc_error(None, INVALID_REQUEST, "Invalid Request: batches are not supported"))
            return
        if not isinstance(msg, dict):
            await self.send(rpc_error(None, INVALID_REQUEST, "Invalid Request: a message is a JSON object"))
            return
        has_id = "id" in msg
        msg_id = msg.get("id")
        reply_id = msg_id if has_id and valid_id(msg_id) else None

        async def invalid(why: str) -> None:
            await self.send(rpc_error(reply_id, INVALID_REQUEST, f"Invalid Request: {why}"))

        extra = sorted(set(msg) - REQUEST_KEYS)
        if extra:
            await invalid(f"unknown member(s) {', '.join(map(repr, extra))}")
            return
        if msg.get("jsonrpc") != "2.0":
            await invalid('"jsonrpc" must be "2.0"')
            return
        method = msg.get("method")
        if not isinstance(method, str) or not method:
            await invalid('"method" must be a non-empty string')
            return
        if "params" in msg and not isinstance(msg["params"], dict):
            await invalid('"params" must be an object')
            return
        params: dict[str, Any] = msg.get("params") or {}
        if has_id and not valid_id(msg_id):
            await invalid('"id" must be a string or an integer')
            return
        if method == CANCEL_METHOD:
            found = self.cancel(params.get("id"))
            if has_id:
                await self.send({"jsonrpc": "2.0", "id": msg_id, "result": {"cancelled": found}})
            return
        if not has_id or not valid_id(msg_id):  # (an id that is not valid is answered above)
            await invalid(f'"id" is required (the only notification accepted is {CANCEL_METHOD})')
            return
        if msg_id in self.calls:
            await invalid(f"id {msg_id!r} is already used by a running request")
            return
        if method not in REGISTRY:
            missing = BinlensError(
                "not_found", f"unknown method {method!r}; interface.get lists them", target="/method"
            )
            await self.send(rpc_error(msg_id, METHOD_NOT_FOUND, "Method not found", missing.to_dict()))
            return
        if not self.hub.try_start():
            busy = BinlensError(
                "busy",
                f"{self.hub.max_concurrent} requests are already running; retry shortly",
                details={"max_concurrent": self.hub.max_concurrent},
            )
            await self.send(rpc_error(msg_id, METHOD_FAILED, busy.message, busy.to_dict()))
            return
        ctx = CallContext(
            client=self.client,
            progress=self._progress_sender(msg_id),
            transport="websocket",
            peer=caller_peer(self.scope),
            authenticated=bool(self.hub.opts.token),  # (the handshake's token was checked)
        )
        self.calls[msg_id] = ctx
        task = asyncio.get_running_loop().create_task(self._call(msg_id, method, params, ctx))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def cancel(self, target: Any) -> bool:
        """Cancel the running request `target` of this client; False when there is none."""
        if not valid_id(target):
            return False
        ctx = self.calls.get(target)
        if ctx is None:
            return False
        ctx.cancel()
        return True

    def _progress_sender(self, msg_id: str | int) -> Any:
        loop = asyncio.get_running_loop()

        def report(done: float, total: float | None, message: str | None) -> None:
            params: dict[str, Any] = {"id": msg_id, "progress": done}
            if total is not None:
                params["total"] = total
            if message:
                params["message"] = message
            if not self.open or loop.is_closed():
                return
            coro = self.notify(PROGRESS_METHOD, params)
            try:
                asyncio.run_coroutine_threadsafe(coro, loop)
            except RuntimeError:  # the loop stopped between the check and the call
                coro.close()

        return report

    async def _call(self, msg_id: str | int, method: str, params: dict[str, Any], ctx: CallContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(self.hub.pool, invoke, self.hub.ws, method, params, ctx)
            try:
                result = await fut
                if ctx.cancelled:
                    raise BinlensError("cancelled", "the request was cancelled")
                reply = {"jsonrpc": "2.0", "id": msg_id, "result": result}
                identity = program_identity(self.hub.ws, method, params, result)
                if identity is not None:
                    reply["program"] = identity  # extension member: SPEC §1, identity in every response
                budget = self.hub.ws.limits.max_response_bytes
                size = frame_size(reply)  # (the whole frame: the budget counts the envelope too)
                if size > budget:
                    raise response_too_large(size, budget, reference=retained_reference(result))
            except BinlensError as err:
                reply = rpc_error(msg_id, METHOD_FAILED, err.message, err.to_dict())
            except Exception:  # noqa: BLE001 - nothing internal crosses the wire
                log.exception("internal error serving %s", method)
                internal = BinlensError("internal", f"internal error in {method}; see the server log")
                reply = rpc_error(msg_id, METHOD_FAILED, internal.message, internal.to_dict())
        finally:
            self.hub.finish()
            self.calls.pop(msg_id, None)
        await self.send(reply)
