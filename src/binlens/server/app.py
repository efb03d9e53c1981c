"""The one ASGI app of `binlens serve`: /mcp, /sse + /messages, /ws, /healthz.

Owned by the WebSocket/security engineer; the MCP engineer provides `mcp_routes` in
`binlens.server.mcp_http`. Auth (bearer token) and Origin checks apply to every route here.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from binlens.server.options import ServerOptions
from binlens.workspace import Workspace


def build_app(ws: Workspace, opts: ServerOptions) -> Starlette:
    """Assemble the routes of every transport into one app."""

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "version": ws.version, "programs": len(ws.programs)})

    routes: list[BaseRoute] = [Route("/healthz", healthz, methods=["GET"])]
    try:
        from binlens.server.mcp_http import mcp_routes
    except ModuleNotFoundError as err:  # until the MCP transport lands
        if err.name != "binlens.server.mcp_http":
            raise
    else:
        routes += mcp_routes(ws, opts)
    return Starlette(routes=routes)
