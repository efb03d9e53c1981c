"""`binlens mcp FILE...`: serve MCP over stdio (for `mcpServers` configurations)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from binlens.cli.main import command, make_workspace
from binlens.cli.server_args import add_mcp_options, confinement, max_response_bytes, permissions, pin_live_pid

log = logging.getLogger("binlens.mcp")


def _mcp_args(p: argparse.ArgumentParser) -> None:
    """Serve MCP over stdio: stdout carries only protocol frames, logs go to stderr."""
    add_mcp_options(
        p,
        root_help="program.open reads only under DIR (repeatable; default: exactly the FILEs, else the current folder)",
        frame_help="input frame limit in bytes (default 1 MiB)",
    )


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
        permissions=permissions(args),
        corpus_store=args.corpus_store,
        **confinement(args.files, args.root),
        limits=Limits(max_concurrent=args.max_concurrent, max_response_bytes=max_response_bytes(args)),
    )
    opened = []
    for f in args.files:
        try:
            opened.append(ws.open(f, check_roots=False))
        except BinlensError as err:
            sys.stderr.write(f"binlens: error: {f}: {err.message}\n")
            return 1
    if args.allow_live_pid is not None and not opened:
        sys.stderr.write("binlens mcp: error: --allow-live-pid needs the program's FILE\n")
        return 2
    if opened and not pin_live_pid(args, ws, opened[0], "mcp"):
        return 1
    try:
        core = McpCore(ws, args.tool_prefix, max_concurrent=args.max_concurrent, separator=args.tool_separator)
    except ValueError as err:  # a prefix that makes some tool name longer than 64 characters
        sys.stderr.write(f"binlens mcp: error: {err}\n")
        return 2
    server = StdioServer(core, max_frame_bytes=args.max_frame_bytes, out=proto_out)
    import asyncio  # imported here: every other command starts faster without it

    asyncio.run(server.run())
    proto_out.close()
    if core.running:
        # A method that ignores cancellation may still be in a worker thread: do not wait for it.
        sys.stderr.flush()
        os._exit(0)
    core.pool.shutdown(wait=False)
    return 0
