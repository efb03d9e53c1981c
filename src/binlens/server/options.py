"""How a server was started: the options every transport reads."""

from __future__ import annotations

from dataclasses import dataclass, field

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServerOptions:
    """Command-line options of `binlens serve` / `binlens mcp`."""

    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None  # bearer token; required when host is not loopback
    tool_prefix: str = "binlens"
    ws_clients: int = 1  # concurrent /ws clients; 1 = exclusive (409 for a second one)
    max_frame_bytes: int = 1 << 20  # stdio and WebSocket input frame limit
    allowed_origins: list[str] = field(default_factory=list)  # beyond loopback and the configured host

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS or self.host.startswith("127.")
