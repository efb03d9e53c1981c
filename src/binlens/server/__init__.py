"""Transports: MCP (stdio, Streamable HTTP, legacy SSE) and WebSocket JSON-RPC, generated from the registry."""
