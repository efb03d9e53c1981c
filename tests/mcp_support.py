"""Helpers of the MCP tests: start real server processes (HTTP and stdio)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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


class SseReader:
    """A GET /sse stream read on a thread: events (name, data) and comments."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[str, str]] = []
        self.comments: list[str] = []
        self.cond = threading.Condition()
        self.client = httpx.Client(timeout=None)
        self._cm = self.client.stream("GET", url, headers={"Accept": "text/event-stream"})
        self.response = self._cm.__enter__()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        name = "message"
        try:
            for line in self.response.iter_lines():
                with self.cond:
                    if line.startswith(":"):
                        self.comments.append(line)
                    elif line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: "):
                        self.events.append((name, line[6:]))
                        name = "message"
                    self.cond.notify_all()
        except httpx.HTTPError:
            pass

    def wait(self, pred: Any, timeout: float = 30) -> Any:
        with self.cond:
            assert self.cond.wait_for(pred, timeout), "timed out waiting on the SSE stream"
            return pred()

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self.client.close()
