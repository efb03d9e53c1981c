"""Helpers of the MCP tests: start real server processes (HTTP and stdio)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def env_for(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["BINLENS_HOME"] = str(home)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVE_SNIPPET = """
import sys
from binlens.cli.main import build_parser, COMMANDS, main
if "serve" in COMMANDS or (build_parser() and "serve" in COMMANDS):
    sys.exit(main(["serve", *sys.argv[1:]]))
# Until `binlens serve` lands: the same app on uvicorn.
import argparse, uvicorn
from pathlib import Path
from binlens.server.app import build_app
from binlens.server.options import ServerOptions
from binlens.workspace import Config, Limits, Workspace
p = argparse.ArgumentParser()
p.add_argument("files", nargs="*"); p.add_argument("--port", type=int)
p.add_argument("--max-concurrent", type=int, default=4)
p.add_argument("--tool-prefix", default="binlens"); p.add_argument("--read-only", action="store_true")
a = p.parse_args()
ws = Workspace(Config(read_only=a.read_only, limits=Limits(max_concurrent=a.max_concurrent)))
for f in a.files:
    ws.open(f, check_roots=False)
opts = ServerOptions(port=a.port, tool_prefix=a.tool_prefix)
uvicorn.run(build_app(ws, opts), host="127.0.0.1", port=a.port, log_level="warning")
"""


def start_http_server(home: Path, files: list[Path], *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start `binlens serve` (or its app on uvicorn) on a free port; returns (process, base URL)."""
    port = _free_port()
    args = [sys.executable, "-c", SERVE_SNIPPET, *map(str, files), "--port", str(port), *extra]
    proc = subprocess.Popen(args, env=env_for(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server process we started."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
