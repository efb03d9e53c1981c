"""uvicorn's sans-I/O WebSocket protocol with one change: a denial response completes the handshake.

uvicorn 0.54 sends the ASGI "WebSocket Denial Response" (our 400/401/403/404/409 before the
upgrade) correctly, but then logs "ASGI callable returned without completing handshake" and
tries a 500 on the closed transport. Marking the handshake complete once the denial body is sent
keeps the log honest.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class BinlensWebSocketProtocol(WebSocketsSansIOProtocol):
    """The protocol `binlens serve` gives uvicorn (`Config(ws=...)`)."""

    async def send(self, message: Any) -> None:
        """Send one ASGI message; a finished denial response ends the handshake."""
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True
