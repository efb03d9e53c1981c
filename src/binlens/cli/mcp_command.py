"""`binlens mcp FILE...`: serve MCP over stdio (for `mcpServers` configurations)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from binlens.cli.main import command, make_workspace

log = logging.getLogger("binlens.mcp")


def _prefix(value: str) -> str:
    from binlens.server.mcp_tools import validate_prefix

    try:
        return validate_prefix(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def _mcp_args(p: argparse.ArgumentParser) -> None:
    """Serve MCP over stdio: stdout carries only protocol frames, logs go to stderr."""
    p.add_argument("files", nargs="*", metavar="FILE", help="programs to open at start")
    p.add_argument("--tool-prefix", type=_prefix, default="binlens", help="tool name prefix (default: binlens)")
    p.add_argument(
        "--tool-separator",
        choices=[".", "_"],
        default=os.environ.get("BINLENS_TOOL_SEPARATOR", "."),
        help="between prefix and domain in tool names (default '.': binlens.help; '_' for Claude Desktop)",
    )
    p.add_argument("--read-only", action="store_true", help="hide and refuse every mutation")
    p.add_argument("--root", action="append", type=Path, default=[], help="program.open reads only under DIR")
    p.add_argument("--max-concurrent", type=_positive, default=4, help="calls running at once; more get busy")
    p.add_argument("--max-frame-bytes", type=_positive, default=1 << 20, help="input frame limit (default 1 MiB)")


@command("mcp", _mcp_args)
def cmd_mcp(args: argparse.Namespace) -> int:
    """Open the files, then serve MCP on stdin/stdout until EOF."""
    from binlens.errors import BinlensError
    from binlens.server.mcp_protocol import McpCore
    from binlens.server.mcp_stdio import StdioServer
    from binlens.workspace import Limits

    # Protocol frames go to a private copy of stdout; anything else written to fd 1 (a library,
    # a child process) lands on stderr instead of corrupting the stream.
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    proto_out = os.fdopen(proto_fd, "wb", buffering=0)

    ws = make_workspace(
        args,
        read_only=args.read_only,
        roots=list(args.root),
        limits=Limits(max_concurrent=args.max_concurrent),
    )
    for f in args.files:
        try:
            ws.open(f, check_roots=False)
        except BinlensError as err:
            sys.stderr.write(f"binlens: error: {f}: {err.message}\n")
            return 1
    core = McpCore(ws, args.tool_prefix, max_concurrent=args.max_concurrent, separator=args.tool_separator)
    server = StdioServer(core, max_frame_bytes=args.max_frame_bytes, out=proto_out)
    asyncio.run(server.run())
    proto_out.close()
    if core.running:
        # A method that ignores cancellation may still be in a worker thread: do not wait for it.
        sys.stderr.flush()
        os._exit(0)
    core.pool.shutdown(wait=False)
    return 0
