"""Raw ASGI HTTP for the MCP transports: request headers, CORS, plain and event-stream responses,
bounded bodies, and a handler guard that turns a crash into a 500."""

from __future__ import annotations

import logging
from typing import Any

from starlette.types import Receive, Scope, Send

from binlens.server.mcp_protocol import (
    error_response,
    internal_error,
)
from binlens.server.wire import dump_bytes

log = logging.getLogger("binlens.mcp")

ALLOW = "POST, OPTIONS"
CORS_HEADERS = (
    "Content-Type, Accept, Authorization, MCP-Protocol-Version, Mcp-Method, Mcp-Name, Mcp-Session-Id, Last-Event-ID"
)


def header_map(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def raw_headers(scope: Scope) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]


def cors_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    origin = headers.get("origin")
    out = [(b"access-control-allow-origin", (origin or "*").encode("latin-1"))]
    if origin:
        out.append((b"vary", b"Origin"))
    out.append((b"access-control-expose-headers", b"MCP-Protocol-Version"))
    return out


async def start_event_stream(send: Any, cors: list[tuple[bytes, bytes]]) -> None:
    """Start a 200 `text/event-stream` response (no caching, no proxy buffering)."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                *cors,
                (b"content-type", b"text/event-stream"),
                (b"cache-control", b"no-cache, no-transform"),
                (b"x-accel-buffering", b"no"),
            ],
        }
    )


async def respond(
    send: Send,
    status: int,
    body: bytes = b"",
    content_type: str | None = None,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = list(extra or [])
    if content_type:
        headers.append((b"content-type", content_type.encode()))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Tracked:
    """A `send` that remembers whether the response has started (to answer a failure properly)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


async def guarded(handler: Any, scope: Scope, receive: Receive, send: Send) -> None:
    """Run an HTTP handler; a failure inside it is logged and answered with a JSON-RPC -32603 (500)."""
    tracked = _Tracked(send)
    try:
        await handler(scope, receive, tracked)
    except Exception:  # noqa: BLE001 - nothing internal crosses the wire, and the server keeps serving
        log.exception("internal error serving %s %s", scope.get("method"), scope.get("path"))
        if not tracked.started:
            body = dump_bytes(error_response(internal_error(), None, None, identifiable=False))
            await respond(send, 500, body, "application/json", cors_headers(header_map(scope)))


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None when it exceeds `limit`."""
    chunks = bytearray()
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionResetError
        chunks += msg.get("body", b"")
        if len(chunks) > limit:
            return None
        if not msg.get("more_body"):
            return bytes(chunks)


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "application/json"
