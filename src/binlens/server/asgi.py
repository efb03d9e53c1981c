"""A bound coroutine served as a raw ASGI app by a Starlette route (shared by /ws, /sse, /messages)."""

from __future__ import annotations

from typing import Any

from starlette.types import Receive, Scope, Send


class AsgiEndpoint:
    """Wrap a bound coroutine so Starlette routes to it as a raw ASGI app (not a request handler).

    Starlette calls a plain function or method with a `Request`; any other callable gets
    `(scope, receive, send)`, which is what a streaming or WebSocket handler needs."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Delegate to the wrapped handler."""
        await self.handler(scope, receive, send)
