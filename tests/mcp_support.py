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
    """The environment of a child binlens: this checkout on PYTHONPATH, an isolated BINLENS_HOME."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["BINLENS_HOME"] = str(home)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_http_server(
    home: Path, files: list[Path], *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `binlens serve` on a free port; returns (process, base URL)."""
    port = _free_port()
    args = [sys.executable, "-m", "binlens", "serve", *map(str, files), "--port", str(port), *extra]
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / f"server-{port}.log", "wb")  # noqa: SIM115 - the child owns it (a pipe could fill up)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env={**env_for(home), **(env or {})})
    log.close()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {(home / f'server-{port}.log').read_text()[-2000:]}")
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
