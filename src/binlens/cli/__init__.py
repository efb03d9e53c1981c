"""Command-line interfaces: human commands, `query`, `mcp`, `serve`."""
