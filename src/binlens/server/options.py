"""How a server was started: the options every transport reads."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field


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
    # MCP (binlens.server.mcp_*): None = the workspace's Limits.max_concurrent
    max_concurrent: int | None = None
    sse_keepalive_s: float = field(default_factory=lambda: float(os.environ.get("BINLENS_SSE_KEEPALIVE_S", "15")))
    max_sse_sessions: int = 64  # legacy /sse sessions at once; a client that goes away frees its slot
    sse_queue: int = 64  # messages waiting for one legacy /sse client; beyond, its session is dropped
    # connections (binlens.server.connections): cap, header and idle timeouts
    max_connections: int = 256
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    # MCP tool names are {prefix}{sep}{domain}: "_" (SPEC §3) since Claude Desktop, claude.ai and Claude
    # Code accept only ^[a-zA-Z0-9_-]{1,64}$; "." gives Ghidra Bridge's dotted names
    tool_separator: str = field(default_factory=lambda: os.environ.get("BINLENS_TOOL_SEPARATOR", "_"))
    # Whether every address the host resolves to is loopback (`binlens serve` resolves it at start);
    # None: judged from the host as written, where only `localhost` and loopback IP literals count.
    host_is_loopback: bool | None = None

    @property
    def loopback(self) -> bool:
        """Whether the server listens on loopback addresses only."""
        if self.host_is_loopback is not None:
            return self.host_is_loopback
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False
