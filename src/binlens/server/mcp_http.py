"""MCP over HTTP: Streamable HTTP at /mcp (stateless in every era) and legacy HTTP+SSE at /sse + /messages.

`/mcp`: every POST stands alone (no Mcp-Session-Id, no standalone GET stream). A request answers
with JSON, or with an SSE stream scoped to that request when it carries a progress token and the
client accepts `text/event-stream`; closing the response cancels the call. GET and other methods
get 405 with `Allow: POST, OPTIONS`; OPTIONS is a CORS preflight (204); a body that is not
`application/json` gets 415; a notification or response gets 202 with no body.

`/sse` (2024-11-05 transport): one session per GET stream, announced by an `endpoint` event;
`POST /messages?sessionId=...` answers 202 and the response arrives as a `message` event.
Auth and Origin checks are the app's middleware (binlens.server.app), not repeated here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any
from urllib.parse import parse_qs

from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER, find_duplicated_routing_header
from mcp_types import HEADER_MISMATCH, INTERNAL_ERROR, INVALID_REQUEST
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from binlens.server.asgi import AsgiEndpoint
from binlens.server.auth import caller_peer
from binlens.server.http_io import (
    ALLOW,
    CORS_HEADERS,
    cors_headers,
    guarded,
    header_map,
    is_json,
    raw_headers,
    read_body,
    respond,
    start_event_stream,
)
from binlens.server.mcp_protocol import (
    MODERN,
    RESOURCE_NOT_FOUND,
    McpCore,
    RpcError,
    Session,
    classify,
    error_response,
    internal_error,
    modern_meta,
)
from binlens.server.options import ServerOptions
from binlens.server.wire import FrameError, decode, dump_bytes, valid_id
from binlens.workspace import Workspace

log = logging.getLogger("binlens.mcp")

MAX_BODY = 4 << 20
SSE_KEEPALIVE_S = 15.0
MAX_SSE_SESSIONS = 64
SSE_QUEUE = 64  # messages waiting for one legacy SSE stream; beyond, the session is dropped


class McpEndpoint:
    """ASGI endpoint of /mcp."""

    def __init__(self, core: McpCore) -> None:
        self.core = core
        # In-flight requests for `notifications/cancelled` (handshake eras): keyed by who asks
        # (client address, Authorization) and the request id. /mcp has no sessions, so a cancel
        # acts only when exactly one request matches; an ambiguous one is ignored.
        self.inflight: dict[tuple[str, str, str], list[Session]] = {}

    @staticmethod
    def _caller(scope: Scope, headers: dict[str, str], request_id: Any) -> tuple[str, str, str]:
        client = scope.get("client") or ("", 0)
        return str(client[0]), headers.get("authorization", ""), json.dumps(request_id)

    def _cancel(self, scope: Scope, headers: dict[str, str], params: Any) -> None:
        rid = params.get("requestId") if isinstance(params, dict) else None
        matches = self.inflight.get(self._caller(scope, headers, rid), [])
        if len(matches) == 1 and matches[0].cancel(rid):
            log.info("cancelled /mcp request %r", rid)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request to /mcp; a failure inside is answered with -32603."""
        await guarded(self._serve, scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope)
        cors = cors_headers(headers)
        method = scope["method"]
        if method == "OPTIONS":
            extra = [
                *cors,
                (b"access-control-allow-methods", ALLOW.encode()),
                (b"access-control-allow-headers", CORS_HEADERS.encode()),
                (b"access-control-max-age", b"600"),
                (b"allow", ALLOW.encode()),
            ]
            await respond(send, 204, extra=extra)
            return
        if method != "POST":
            body = dump_bytes(
                {"error": f"{method} is not served on /mcp: POST JSON-RPC messages (no standalone stream)"}
            )
            await respond(send, 405, body, "application/json", [*cors, (b"allow", ALLOW.encode())])
            return
        if not is_json(headers.get("content-type")):
            body = dump_bytes({"error": "POST /mcp needs Content-Type: application/json"})
            await respond(send, 415, body, "application/json", cors)
            return
        try:
            await self._post(scope, receive, send, headers, cors)
        except ConnectionResetError:
            log.info("client went away before its request was read")

    async def _post(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], cors: list[tuple[bytes, bytes]]
    ) -> None:
        header_version = headers.get(MCP_PROTOCOL_VERSION_HEADER)

        async def fail(status: int, err: RpcError, msg_id: Any = None, identifiable: bool = False) -> None:
            body = dump_bytes(error_response(err, msg_id, header_version, identifiable=identifiable))
            await respond(send, status, body, "application/json", cors)

        raw = await read_body(receive, MAX_BODY)
        if raw is None:
            await fail(413, RpcError(INVALID_REQUEST, f"request body over {MAX_BODY} bytes"))
            return
        try:
            msg = decode(raw)
        except FrameError as err:
            await fail(400, RpcError(err.code, err.message), err.id, err.identifiable)
            return
        try:
            inbound = classify(msg, header_version)
        except RpcError as err:
            rid = msg.get("id") if isinstance(msg, dict) else None
            ok = valid_id(rid)
            await fail(400, err, rid, ok)
            return
        dup = find_duplicated_routing_header(raw_headers(scope))
        if dup is not None:
            await fail(
                400,
                RpcError(HEADER_MISMATCH, f"{dup} header given more than once"),
                inbound.id,
                inbound.kind == "request",
            )
            return
        if inbound.kind != "request":
            # Notifications and responses: accepted with no body; only a cancellation acts.
            if inbound.method == "notifications/cancelled" and not modern_meta(inbound.params):
                self._cancel(scope, headers, inbound.params)
            await respond(send, 202, extra=cors)
            return
        await self._request(scope, inbound, headers, receive, send, cors)

    async def _request(
        self,
        scope: Scope,
        inbound: Any,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
        cors: list[tuple[bytes, bytes]],
    ) -> None:
        """Serve one request: its era, then a JSON answer or a progress stream; track it for cancels."""
        header_version = headers.get(MCP_PROTOCOL_VERSION_HEADER)
        try:
            version = self.core.request_version(inbound, None, headers)
        except RpcError as err:
            body = dump_bytes(error_response(err, inbound.id, header_version))
            await respond(send, err.http_status if err.http_status != 200 else 400, body, "application/json", cors)
            return
        accept = headers.get("accept", "")
        meta = (inbound.params or {}).get("_meta")
        wants_progress = (
            inbound.method == "tools/call" and isinstance(meta, dict) and meta.get("progressToken") is not None
        )
        key = self._caller(scope, headers, inbound.id)
        session = Session(
            credential=headers.get("authorization"), peer=caller_peer(scope), authenticated=self.core.token_checked
        )
        self.inflight.setdefault(key, []).append(session)
        try:
            if wants_progress and "text/event-stream" in accept:
                await self._stream(inbound, version, session, receive, send, cors)
            else:
                await self._json(inbound, version, session, receive, send, cors)
        finally:
            entries = self.inflight.get(key, [])
            if session in entries:
                entries.remove(session)
            if not entries:
                self.inflight.pop(key, None)

    async def _json(
        self,
        inbound: Any,
        version: str,
        session: Session,
        receive: Receive,
        send: Send,
        cors: list[tuple[bytes, bytes]],
    ) -> None:
        """Answer one request with a JSON body."""
        task = asyncio.ensure_future(self.core.handle_request(inbound, version, session=session))
        response = await _until_disconnect(task, receive)
        if response is _GONE:
            log.info("client closed /mcp request %r (or the server is stopping): cancelled", inbound.id)
            await _abandoned(send, inbound.id, version, cors)
            return
        if response is _CANCELLED:  # by notifications/cancelled: no JSON-RPC response, as MCP asks
            await respond(send, 204, extra=cors)
            return
        status = 200
        if "error" in response and version == MODERN:
            status = RpcError(response["error"]["code"], "").http_status
        elif "error" in response and response["error"]["code"] == RESOURCE_NOT_FOUND:
            status = 404  # the handshake eras' unknown resource
        await respond(send, status, dump_bytes(response), "application/json", cors)

    async def _stream(
        self,
        inbound: Any,
        version: str,
        session: Session,
        receive: Receive,
        send: Send,
        cors: list[tuple[bytes, bytes]],
    ) -> None:
        """Answer one request as an SSE stream: progress notifications, then the response."""
        started = False
        lock = asyncio.Lock()

        async def emit(message: dict[str, Any]) -> None:
            nonlocal started
            async with lock:
                if not started:
                    started = True
                    await start_event_stream(send, cors)
                chunk = b"event: message\ndata: " + dump_bytes(message) + b"\n\n"
                await send({"type": "http.response.body", "body": chunk, "more_body": True})

        task = asyncio.ensure_future(self.core.handle_request(inbound, version, session=session, notify=emit))
        response = await _until_disconnect(task, receive)
        if response is _GONE:
            log.info("client closed the /mcp stream of request %r (or the server is stopping): cancelled", inbound.id)
            if not started:
                await _abandoned(send, inbound.id, version, cors)
            return
        if response is _CANCELLED:
            if not started:
                await respond(send, 204, extra=cors)
            else:  # end the stream without a response
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await emit(response)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _abandoned(send: Send, request_id: Any, version: str, cors: list[tuple[bytes, bytes]]) -> None:
    """Answer a request whose connection reported a disconnect: nobody reads it if the client left,
    and when the server is stopping (the app drains open requests that way) the client gets 503."""
    err = RpcError(INTERNAL_ERROR, "the request was abandoned: the client went away or the server is stopping")
    await respond(send, 503, dump_bytes(error_response(err, request_id, version)), "application/json", cors)


_GONE = object()  # the client disconnected
_CANCELLED = object()  # cancelled by notifications/cancelled


async def _until_disconnect(task: asyncio.Future[Any], receive: Receive) -> Any:
    """Await `task`; if the client disconnects first, cancel it and return _GONE (_CANCELLED if cancelled)."""

    async def watch() -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return _CANCELLED if task.cancelled() else task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return _GONE
    finally:
        watcher.cancel()


async def _end_dropped(send: Send, receive: Receive) -> None:
    """End a dropped session's stream; when its client does not read, wait until the server's idle
    timeout cuts the connection (which also frees what is buffered for it)."""
    try:
        await asyncio.wait_for(send({"type": "http.response.body", "body": b"", "more_body": False}), 1.0)
        return
    except (TimeoutError, OSError, RuntimeError):
        pass
    while (await receive())["type"] != "http.disconnect":
        pass


class SseSession:
    """One legacy HTTP+SSE connection: its messages wait in a bounded queue for the stream."""

    def __init__(self, max_queue: int = SSE_QUEUE) -> None:
        self.id = uuid.uuid4().hex
        self.session = Session()
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(max(1, max_queue))
        self.tasks: set[asyncio.Task[Any]] = set()
        self.dropped = asyncio.Event()  # set when the client fell too far behind


class LegacySse:
    """`GET /sse` and `POST /messages?sessionId=` (the 2024-11-05 HTTP+SSE transport)."""

    def __init__(
        self,
        core: McpCore,
        keepalive_s: float = SSE_KEEPALIVE_S,
        max_sessions: int = MAX_SSE_SESSIONS,
        max_queue: int = SSE_QUEUE,
    ) -> None:
        self.core = core
        self.keepalive_s = keepalive_s
        self.max_sessions = max_sessions
        self.max_queue = max_queue
        self.sessions: dict[str, SseSession] = {}

    def _deliver(self, sess: SseSession, message: dict[str, Any]) -> None:
        """Queue a message for the stream; a full queue (the client is not reading) drops the session."""
        if sess.dropped.is_set():
            return
        try:
            sess.queue.put_nowait(message)
        except asyncio.QueueFull:
            self._drop(sess)

    def _drop(self, sess: SseSession) -> None:
        """Forget a session whose client does not read: its calls are cancelled, its queue freed."""
        log.warning(
            "SSE session %s dropped: %d messages are waiting and its client is not reading", sess.id, self.max_queue
        )
        sess.dropped.set()
        self.sessions.pop(sess.id, None)
        sess.session.cancel_all()
        for task in list(sess.tasks):
            task.cancel()
        while not sess.queue.empty():
            sess.queue.get_nowait()

    async def sse(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The event stream: `endpoint` first, then `message` events and keep-alive comments."""
        headers = header_map(scope)
        cors = cors_headers(headers)
        if scope["method"] != "GET":
            await respond(send, 405, b"", None, [*cors, (b"allow", b"GET")])
            return
        if len(self.sessions) >= self.max_sessions:
            body = dump_bytes({"error": f"{self.max_sessions} SSE sessions are open; retry later"})
            await respond(send, 503, body, "application/json", [*cors, (b"retry-after", b"5")])
            return
        sess = SseSession(self.max_queue)
        sess.session.credential = headers.get("authorization")
        sess.session.peer = caller_peer(scope)
        sess.session.authenticated = self.core.token_checked
        self.sessions[sess.id] = sess
        root = scope.get("root_path", "")
        await start_event_stream(send, cors)
        endpoint = f"{root}/messages?sessionId={sess.id}"
        await send(
            {"type": "http.response.body", "body": f"event: endpoint\ndata: {endpoint}\n\n".encode(), "more_body": True}
        )

        async def pump() -> None:
            while True:
                try:
                    message = await asyncio.wait_for(sess.queue.get(), self.keepalive_s)
                except TimeoutError:
                    await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
                    continue
                chunk = b"event: message\ndata: " + dump_bytes(message) + b"\n\n"
                await send({"type": "http.response.body", "body": chunk, "more_body": True})

        async def until_gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        # debugger stop events (from gdb's reader threads) as `{prefix}.debug.event` messages
        from binlens.api.debug_target import listeners as debug_listeners  # (the domain loads with the catalog)

        loop = asyncio.get_running_loop()
        event_method = f"{self.core.tools.prefix}.debug.event"

        def push(event: dict[str, Any]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(
                    self._deliver, sess, {"jsonrpc": "2.0", "method": event_method, "params": event}
                )

        pushers = debug_listeners(self.core.ws)
        pushers.append(push)
        watchers = [asyncio.ensure_future(c) for c in (pump(), until_gone(), sess.dropped.wait())]
        try:
            await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watcher in watchers:
                watcher.cancel()
            pushers.remove(push)
            self.sessions.pop(sess.id, None)
            sess.session.cancel_all()
            log.info("SSE session %s closed", sess.id)
        if sess.dropped.is_set():
            await _end_dropped(send, receive)

    async def messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`POST /messages?sessionId=...`: 202, the answer goes to that session's stream."""
        await guarded(self._messages, scope, receive, send)

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope)
        cors = cors_headers(headers)
        if scope["method"] != "POST":
            await respond(send, 405, b"", None, [*cors, (b"allow", b"POST")])
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        # The endpoint event names the session in the query; clients that carry it as a header
        # (as /mcp sessions do elsewhere) send Mcp-Session-Id instead.
        in_query = (query.get("sessionId") or [None])[0]
        in_header = headers.get("mcp-session-id")
        if in_query and in_header and in_query != in_header:
            body = dump_bytes({"error": "sessionId and the Mcp-Session-Id header name different sessions"})
            await respond(send, 400, body, "application/json", cors)
            return
        sid = in_query or in_header
        if not sid:
            body = dump_bytes({"error": "sessionId (query) or Mcp-Session-Id (header) is required"})
            await respond(send, 400, body, "application/json", cors)
            return
        sess = self.sessions.get(sid)
        if sess is None:
            await respond(send, 404, dump_bytes({"error": "no such session"}), "application/json", cors)
            return
        if not is_json(headers.get("content-type")):
            body = dump_bytes({"error": "POST /messages needs Content-Type: application/json"})
            await respond(send, 415, body, "application/json", cors)
            return
        try:
            raw = await read_body(receive, MAX_BODY)
        except ConnectionResetError:
            return
        version = sess.session.negotiated
        if raw is None:
            err = RpcError(INVALID_REQUEST, f"request body over {MAX_BODY} bytes")
            await respond(
                send, 413, dump_bytes(error_response(err, None, version, identifiable=False)), "application/json", cors
            )
            return
        try:
            msg = decode(raw)
        except FrameError as err:
            rpc = RpcError(err.code, err.message)
            body = dump_bytes(error_response(rpc, err.id, version, identifiable=err.identifiable))
            await respond(send, 400, body, "application/json", cors)
            return
        try:
            inbound = classify(msg, version)
        except RpcError as err:
            rid = msg.get("id") if isinstance(msg, dict) else None
            ok = valid_id(rid)
            await respond(
                send, 400, dump_bytes(error_response(err, rid, version, identifiable=ok)), "application/json", cors
            )
            return
        await respond(send, 202, b"Accepted", "text/plain", cors)
        if inbound.kind == "notification":
            self.core.handle_notification(inbound, sess.session)
        elif inbound.kind == "request" and sess.session.running(inbound.id):
            reused = RpcError(INVALID_REQUEST, f"id {inbound.id!r} is already used by a running request")
            self._deliver(sess, error_response(reused, inbound.id, sess.session.negotiated))
        elif inbound.kind == "request":
            task = asyncio.ensure_future(self._request(sess, inbound))
            sess.session.begin(inbound.id, task)
            sess.tasks.add(task)
            task.add_done_callback(sess.tasks.discard)

    async def _request(self, sess: SseSession, inbound: Any) -> None:
        async def notify(message: dict[str, Any]) -> None:
            self._deliver(sess, message)

        try:
            version = self.core.request_version(inbound, sess.session, None)
        except RpcError as err:
            self._deliver(sess, error_response(err, inbound.id, sess.session.negotiated))
            return
        try:
            response = await self.core.handle_request(inbound, version, session=sess.session, notify=notify)
        except asyncio.CancelledError:
            return
        except Exception:  # noqa: BLE001 - the request is answered and the session keeps serving
            log.exception("internal error serving %s", inbound.method)
            response = error_response(internal_error(), inbound.id, version)
        self._deliver(sess, response)


def mcp_routes(ws: Workspace, opts: ServerOptions) -> list[Route]:
    """The MCP routes of `binlens serve`: /mcp, /sse and /messages over one McpCore."""
    core = McpCore(
        ws,
        getattr(opts, "tool_prefix", "binlens"),
        max_concurrent=getattr(opts, "max_concurrent", None) or ws.limits.max_concurrent,
        separator=getattr(opts, "tool_separator", "_"),
    )
    core.token_checked = bool(getattr(opts, "token", None))  # (the security middleware checked every request's)
    legacy = LegacySse(
        core,
        keepalive_s=getattr(opts, "sse_keepalive_s", SSE_KEEPALIVE_S),
        max_sessions=getattr(opts, "max_sse_sessions", MAX_SSE_SESSIONS),
        max_queue=getattr(opts, "sse_queue", SSE_QUEUE),
    )
    methods = ["GET", "POST", "OPTIONS", "DELETE", "PUT", "PATCH", "HEAD"]
    return [
        Route("/mcp", McpEndpoint(core), methods=methods),
        Route("/sse", AsgiEndpoint(legacy.sse), methods=None),
        Route("/messages", AsgiEndpoint(legacy.messages), methods=None),
    ]
