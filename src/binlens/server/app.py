"""The one ASGI app of `binlens serve`: /mcp, /sse + /messages, /ws, /healthz.

Owned by the WebSocket/security engineer; the MCP engineer provides `mcp_routes` in
`binlens.server.mcp_http`. Auth (bearer token), query-token refusal and the Origin/Host checks
(`binlens.server.auth.SecurityMiddleware`) wrap every route here, WebSocket handshakes included.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import Receive, Scope, Send

from binlens.server.asgi import AsgiEndpoint
from binlens.server.auth import SecurityMiddleware
from binlens.server.options import ServerOptions
from binlens.server.ws import WsHub
from binlens.workspace import Workspace


class DrainMiddleware:
    """Ends long-lived HTTP responses (legacy SSE streams, progress streams) when the server stops.

    Every HTTP request's `receive` is raced against the `stop` event (`app.state.stop_http`);
    once it is set, pending and later `receive()` calls return `http.disconnect`, which streaming
    handlers already treat as "the client went away". Without it uvicorn waits out its graceful
    timeout on open streams and then cancels them with a traceback.
    """

    def __init__(self, app: Any, stop: asyncio.Event) -> None:
        self.app = app
        self._stop = stop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with a stop-aware `receive`."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stop = self._stop

        async def drained_receive() -> Any:
            if stop.is_set():
                return {"type": "http.disconnect"}
            incoming = asyncio.ensure_future(receive())
            stopping = asyncio.ensure_future(stop.wait())
            try:
                done, _ = await asyncio.wait({incoming, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            if incoming in done:
                return incoming.result()
            incoming.cancel()
            return {"type": "http.disconnect"}

        state = {"started": False, "done": False}

        async def tracked_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["done"] = True
            await send(message)

        await self.app(scope, drained_receive, tracked_send)
        if stop.is_set() and state["started"] and not state["done"]:
            # The handler left its stream open because it saw our disconnect: end it properly.
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})


def build_app(ws: Workspace, opts: ServerOptions, hub: WsHub | None = None) -> Starlette:
    """Assemble the routes of every transport into one app.

    `app.state.ws_hub` is the /ws hub; setting `app.state.stop_http` ends open HTTP streams.
    """
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
    stop_http = asyncio.Event()
    middleware = [Middleware(SecurityMiddleware, opts=opts), Middleware(DrainMiddleware, stop=stop_http)]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.ws_hub = hub
    app.state.stop_http = stop_http  # set it to end every open HTTP stream (server stop)
    return app
