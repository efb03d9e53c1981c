"""uvicorn's sans-I/O WebSocket protocol with two changes.

- A denial response completes the handshake: uvicorn 0.54 sends the ASGI "WebSocket Denial
  Response" (our 400/401/403/404/409 before the upgrade) correctly, but then logs "ASGI callable
  returned without completing handshake" and tries a 500 on the closed transport. Marking the
  handshake complete once the denial body is sent keeps the log honest.
- A fragmented message (a first frame without FIN) is refused with close code 1003, as Ghidra
  Bridge does: every JSON-RPC message travels in one frame, so the server never buffers a
  message of unknown length across frames.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame

CLOSE_UNSUPPORTED = 1003
FRAGMENTED = "fragmented messages are not supported: send each JSON-RPC message in one frame"


class BinlensWebSocketProtocol(WebSocketsSansIOProtocol):
    """The protocol `binlens serve` gives uvicorn (`Config(ws=...)`)."""

    async def send(self, message: Any) -> None:
        """Send one ASGI message; a finished denial response ends the handshake."""
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True

    def handle_text(self, event: Frame) -> None:
        """A text frame: one whole message, or the start of a fragmented one (refused)."""
        if not event.fin:
            self._refuse_fragments()
            return
        super().handle_text(event)

    def handle_bytes(self, event: Frame) -> None:
        """A binary frame: the app closes with 1003; a fragmented one is refused here already."""
        if not event.fin:
            self._refuse_fragments()
            return
        super().handle_bytes(event)

    def handle_cont(self, event: Frame) -> None:
        """A continuation frame: after a refused first fragment there is nothing to continue."""
        if self.close_sent:
            return
        super().handle_cont(event)

    def _refuse_fragments(self) -> None:
        """Close with 1003 and tell the app the client is gone. The closing handshake runs as for an
        app's close: the rest of the message is read and dropped until the client's close frame (or
        the close timeout), since closing the socket with its later frames unread would reset the
        connection and could lose the close frame on the way."""
        if self.close_sent:
            return
        self.conn.send_close(CLOSE_UNSUPPORTED, FRAGMENTED)
        self.queue.put_nowait({"type": "websocket.disconnect", "code": CLOSE_UNSUPPORTED, "reason": FRAGMENTED})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.frames = []
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)
