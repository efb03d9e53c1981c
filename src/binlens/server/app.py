"""The one ASGI app of `binlens serve`: /mcp, /sse + /messages, /ws, /healthz.

Owned by the WebSocket/security engineer; the MCP engineer provides `mcp_routes` in
`binlens.server.mcp_http`. Auth (bearer token), query-token refusal and the Origin/Host checks
(`binlens.server.auth.SecurityMiddleware`) wrap every route here, WebSocket handshakes included.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import Receive, Scope, Send

from binlens.server.auth import SecurityMiddleware
from binlens.server.options import ServerOptions
from binlens.server.ws import WsHub
from binlens.workspace import Workspace


class AsgiEndpoint:
    """Wrap a bound coroutine so Starlette routes to it as a raw ASGI app (not a request handler)."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Delegate to the wrapped handler."""
        await self.handler(scope, receive, send)


def build_app(ws: Workspace, opts: ServerOptions, hub: WsHub | None = None) -> Starlette:
    """Assemble the routes of every transport into one app; `app.state.ws_hub` is the /ws hub."""
    hub = hub or WsHub(ws, opts)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "version": ws.version, "programs": len(ws.programs)})

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/ws", AsgiEndpoint(hub.endpoint), methods=None),
        WebSocketRoute("/ws", AsgiEndpoint(hub.endpoint)),
    ]
    try:
        from binlens.server.mcp_http import mcp_routes
    except ModuleNotFoundError as err:  # until the MCP transport lands
        if err.name != "binlens.server.mcp_http":
            raise
    else:
        routes += mcp_routes(ws, opts)
    routes.append(WebSocketRoute("/{path:path}", AsgiEndpoint(hub.not_found)))
    app = Starlette(routes=routes, middleware=[Middleware(SecurityMiddleware, opts=opts)])
    app.state.ws_hub = hub
    return app
