"""`binlens serve FILE...`: one HTTP server with MCP (/mcp, /sse + /messages), WebSocket JSON-RPC (/ws) and /healthz."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from binlens.cli.main import command, make_workspace
from binlens.cli.server_args import (
    add_mcp_options,
    confinement,
    has_password,
    max_response_bytes,
    permissions,
    pin_live_pid,
    positive,
    seconds,
)

if TYPE_CHECKING:
    from binlens.server.connections import ConnectionLimits
    from binlens.server.options import ServerOptions
    from binlens.workspace import Workspace

log = logging.getLogger("binlens.server")

TOKEN_ENV = "BINLENS_TOKEN"


def _port(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError("a port is 0..65535 (0: any free port)")
    return n


def _serve_args(p: argparse.ArgumentParser) -> None:
    """Serve MCP (/mcp, legacy /sse), WebSocket JSON-RPC (/ws) and /healthz over HTTP."""
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1; others need a token)")
    p.add_argument(
        "--port", metavar="PORT", type=_port, default=8765, help="listen port (default 8765; 0 picks a free one)"
    )
    p.add_argument(
        "--token",
        default=None,
        help=f"bearer token clients must send (default: ${TOKEN_ENV}); required for a non-loopback --host",
    )
    add_mcp_options(
        p,
        root_help="program.open from clients reads only under DIR "
        "(repeatable; default: exactly the FILEs, else the current folder)",
        frame_help="WebSocket frame limit in bytes (default 1 MiB)",
    )
    p.add_argument(
        "--ws-clients", metavar="N", type=positive, default=1, help="WebSocket clients at once (default 1: exclusive)"
    )
    p.add_argument(
        "--allow-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="a browser Origin to accept beyond loopback (repeatable)",
    )
    p.add_argument(
        "--print-mcp-config", action="store_true", help="print the mcpServers entries (stdio and HTTP) on stdout"
    )
    _limit_args(p)


def _limit_args(p: argparse.ArgumentParser) -> None:
    """Connection bounds: cap, timeouts, legacy SSE queue."""
    p.add_argument(
        "--max-connections",
        metavar="N",
        type=positive,
        default=256,
        help="open connections at once (default 256); at the cap the oldest one still waiting for its "
        "request head is closed, else the new one gets 503",
    )
    p.add_argument(
        "--header-timeout",
        metavar="S",
        type=seconds,
        default=10.0,
        help="seconds a client has to send a complete request head (default 10)",
    )
    p.add_argument(
        "--idle-timeout",
        metavar="S",
        type=seconds,
        default=30.0,
        help="seconds a request body may stall or a client may stop reading a response (default 30)",
    )
    p.add_argument(
        "--keep-alive",
        metavar="S",
        type=seconds,
        default=5.0,
        help="seconds an idle kept-alive connection stays open between requests (default 5)",
    )
    p.add_argument(
        "--sse-queue",
        metavar="N",
        type=positive,
        default=64,
        help="messages waiting for a legacy /sse client that does not read; beyond, its session is dropped "
        "(default 64)",
    )


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def mcp_config(args: argparse.Namespace, base: str, files: list[Path]) -> dict[str, Any]:
    """The `mcpServers` entries for this server: stdio (`binlens mcp FILE`) and HTTP (url .../mcp)."""
    exe = Path(sys.executable).with_name("binlens")
    binlens = str(exe) if exe.exists() else (shutil.which("binlens") or "binlens")
    stdio: dict[str, Any] = {"command": binlens, "args": ["mcp", *map(str, files)]}
    if args.read_only:
        stdio["args"].append("--read-only")
    # the stdio server names its tools as this one does
    if args.tool_prefix != "binlens":
        stdio["args"] += ["--tool-prefix", args.tool_prefix]
    if args.tool_separator != "_":
        stdio["args"] += ["--tool-separator", args.tool_separator]
    if args.allow_debug:
        stdio["args"].append("--allow-debug")
    if args.corpus_store and not has_password(args.corpus_store):  # (never a password: PGPASSWORD can hold it)
        stdio["args"] += ["--corpus-store", args.corpus_store]
    http: dict[str, Any] = {"type": "http", "url": f"{base}/mcp"}
    if args.token:
        http["headers"] = {"Authorization": f"Bearer ${{{TOKEN_ENV}}}"}  # never the token itself
    return {"mcpServers": {"binlens": stdio, "binlens-http": http}}


@command("serve", _serve_args)
def cmd_serve(args: argparse.Namespace) -> int:
    """Open the files and serve every HTTP transport until SIGINT/SIGTERM."""
    from binlens.errors import BinlensError
    from binlens.server.auth import install_log_redaction, resolves_to_loopback, validate_token
    from binlens.server.options import ServerOptions
    from binlens.workspace import Limits

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    args.token = token
    if token is not None:
        try:
            validate_token(token)
        except ValueError as err:
            sys.stderr.write(f"binlens serve: error: {err}\n")
            return 2
    try:
        loopback = resolves_to_loopback(args.host)
    except ValueError as err:
        sys.stderr.write(f"binlens serve: error: {err}\n")
        return 2
    opts = ServerOptions(
        host=args.host,
        port=args.port,
        token=token,
        tool_prefix=args.tool_prefix,
        tool_separator=args.tool_separator,
        ws_clients=args.ws_clients,
        max_frame_bytes=args.max_frame_bytes,
        allowed_origins=list(args.allow_origin),
        max_concurrent=args.max_concurrent,
        host_is_loopback=loopback,
        sse_queue=args.sse_queue,
        max_connections=args.max_connections,
        header_timeout_s=args.header_timeout,
        idle_timeout_s=args.idle_timeout,
        keep_alive_s=args.keep_alive,
    )
    if not opts.loopback and not token:
        sys.stderr.write(
            f"binlens serve: error: --host {args.host} is not (or does not resolve only to) a loopback address; "
            f"refusing to listen without a token (give --token or set ${TOKEN_ENV})\n"
        )
        return 2
    if not opts.loopback:
        sys.stderr.write(
            "binlens serve: warning: plain HTTP: the token and the traffic cross the network unencrypted; "
            "put a TLS-terminating proxy in front for anything but a trusted network\n"
        )
    install_log_redaction(token)
    ws = make_workspace(
        args,
        read_only=args.read_only,
        permissions=permissions(args),
        corpus_store=args.corpus_store,
        **confinement(args.files, args.root),
        limits=Limits(max_concurrent=args.max_concurrent, max_response_bytes=max_response_bytes(args)),
    )
    opened: list[Path] = []
    programs: list[Any] = []
    for f in args.files:
        try:
            prog = ws.open(f, check_roots=False)
        except BinlensError as err:
            sys.stderr.write(f"binlens serve: error: {f}: {err.message}\n")
            return 1
        opened.append(prog.path)
        programs.append(prog)
    if args.allow_live_pid is not None and not programs:
        sys.stderr.write("binlens serve: error: --allow-live-pid needs the program's FILE\n")
        return 2
    if programs and not pin_live_pid(args, ws, programs[0], "serve"):
        return 1
    return _run_server(ws, opts, args, opened)


def _connection_limits(opts: ServerOptions) -> tuple[ConnectionLimits, int]:
    """The connection bounds, with the cap lowered to what the descriptor limit allows (and said so)."""
    from binlens.server.connections import ConnectionLimits, fit_fd_limit, install_log_rate_limit

    install_log_rate_limit()
    cap, backlog = fit_fd_limit(opts.max_connections)
    if cap < opts.max_connections:
        sys.stderr.write(
            f"binlens serve: warning: --max-connections {opts.max_connections} does not fit the open-file "
            f"limit (ulimit -n); using {cap}\n"
        )
    limits = ConnectionLimits(
        max_connections=cap, header_timeout_s=opts.header_timeout_s, idle_timeout_s=opts.idle_timeout_s
    )
    return limits, backlog


def _run_server(ws: Workspace, opts: ServerOptions, args: argparse.Namespace, opened: list[Path]) -> int:
    import uvicorn

    from binlens.server.app import build_app
    from binlens.server.connections import http_protocol
    from binlens.server.ws import WsHub
    from binlens.server.ws_protocol import BinlensWebSocketProtocol

    hub = WsHub(ws, opts)
    try:
        app = build_app(ws, opts, hub)
    except ValueError as err:  # a prefix that makes some tool name longer than 64 characters
        sys.stderr.write(f"binlens serve: error: {err}\n")
        hub.pool.shutdown(wait=False)
        return 2
    limits, backlog = _connection_limits(opts)
    config = uvicorn.Config(
        app,
        host=opts.host,
        port=opts.port,
        http=http_protocol(limits),
        backlog=backlog,
        timeout_keep_alive=opts.keep_alive_s,  # type: ignore[arg-type]  # a float works: it feeds call_later
        ws=BinlensWebSocketProtocol,
        ws_max_size=opts.max_frame_bytes,
        lifespan="off",
        log_config=None,  # our logging setup (stderr, redaction filter) applies to uvicorn too
        access_log=True,
        server_header=False,
        timeout_graceful_shutdown=5,
    )

    class Server(uvicorn.Server):
        """uvicorn with a ready line, WebSocket close 1001 on stop and a clean exit on signals."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.should_exit or not self.servers:
                return
            port = opts.port
            for server in self.servers:
                for sock in server.sockets:
                    port = sock.getsockname()[1]
            base = f"http://{_url_host(opts.host)}:{port}"
            wsbase = "ws" + base[4:]
            sys.stderr.write(
                f"binlens serve: ready, {len(ws.programs)} program(s): MCP {base}/mcp | legacy SSE {base}/sse"
                f" | WebSocket {wsbase}/ws | health {base}/healthz\n"
            )
            sys.stderr.flush()
            if args.print_mcp_config:
                sys.stdout.write(json.dumps(mcp_config(args, base, opened), indent=2) + "\n")
                sys.stdout.flush()

        async def shutdown(self, sockets: Any = None) -> None:
            await hub.close_all(1001, "server stopping")
            app.state.stop_http.set()  # legacy SSE and progress streams end as if their client left
            import asyncio  # imported here: every other command starts faster without it

            await asyncio.sleep(0.05)  # let the close frames reach the clients
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the signal after a graceful stop; a clean stop here exits 0.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    server = Server(config)
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits when it cannot bind or start (its error is logged above)
        if exc.code not in (0, None):
            sys.stderr.write(f"binlens serve: error: could not listen on {opts.host}:{opts.port}\n")
            hub.pool.shutdown(wait=False)
            return 1
    sys.stderr.write("binlens serve: stopped\n")
    sys.stderr.flush()
    hub.pool.shutdown(wait=False, cancel_futures=True)
    if hub.running:
        # A method that ignores cancellation may still hold a worker thread: do not wait for it.
        os._exit(0)
    return 0
