"""Helpers of the `binlens serve` tests: a real server process on a free port, raw HTTP, big binaries."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parents[1]
READY_RE = re.compile(r"binlens serve: ready.*?http://([^/\s]+):(\d+)/mcp")
TOKEN = "t0k3n-" + "s3cr3t-" * 4  # 34 characters, long enough for validate_token

# 16 MiB of file-backed data: a memory.search over it with a backtracking regex takes seconds,
# long enough to observe progress, cancellation and busy.
BIG_C = r"""
#include <stdio.h>
const unsigned char blob[16 << 20] = { 1, 2, 3 };
int main(int argc, char **argv) { return blob[argc * 4096] + (int)(argc > 5 ? printf("%s", argv[0]) : 0); }
"""
# About 0.5 s per MiB of zeros in the `regex` engine (it backtracks over each run of NULs): the
# scan reports progress per chunk.
SLOW_REGEX = r"\x00{0,30}[^\x00]\x00{3}z"


def long_search_params(timeout_ms: int = 60000) -> dict[str, object]:
    """Params of a memory.search that runs for many seconds on the big binary."""
    return {"regex": SLOW_REGEX, "scan": {"timeout_ms": timeout_ms}, "page": {"limit": 10}}


def build_big(directory: Path) -> Path:
    """Compile the 16 MiB-data program into `directory` (skips without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "big.c"
    src.write_text(BIG_C)
    out = directory / "big"
    subprocess.run([cc, "-O1", "-o", str(out), str(src)], check=True, capture_output=True)
    return out


def env_for(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a child binlens: this checkout's sources, an isolated home."""
    env = dict(os.environ)
    env.pop("BINLENS_TOKEN", None)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["BINLENS_HOME"] = str(home)
    env.update(extra)
    return env


def _limit_files(n: int) -> None:
    """In the child before exec: at most `n` open files (soft and hard), as `ulimit -n n` would."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def rss_mb(pid: int) -> float:
    """Resident memory of a process (Linux /proc), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class ServerProcess:
    """`python -m binlens serve ARGS --port 0`, started and waited for (its ready line names the port)."""

    def __init__(
        self,
        home: Path,
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 60,
        cwd: Path | None = None,
        nofile: int | None = None,
    ) -> None:
        self.args = [sys.executable, "-m", "binlens", "serve", *args]
        if "--port" not in args:
            self.args += ["--port", "0"]
        self.proc = subprocess.Popen(
            self.args,
            env=env or env_for(home),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=None if nofile is None else lambda: _limit_files(nofile),
        )
        self.stderr_lines: list[str] = []
        self.stdout_lines: list[str] = []
        self._ready = threading.Event()
        self.port = 0
        self.host = "127.0.0.1"
        threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr_lines, True), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.proc.stdout, self.stdout_lines, False), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the drain threads collect the last lines
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.stderr[-3000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"server did not start: {self.stderr[-3000:]}")

    def _drain(self, stream, lines: list[str], watch: bool) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            lines.append(line)
            if watch and not self._ready.is_set():
                m = READY_RE.search(line)
                if m:
                    self.port = int(m.group(2))
                    self._ready.set()

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    @property
    def stdout(self) -> str:
        return "".join(self.stdout_lines)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Signal the server and wait for it; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        time.sleep(0.1)
        return self.proc.returncode

    def kill(self) -> None:
        """Kill the server we started (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ws_call(url: str, method: str, params: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    """One JSON-RPC request over a fresh /ws connection."""

    async def go() -> dict[str, Any]:
        async with connect(url, open_timeout=10, additional_headers=headers or {}) as c:
            json.loads(await c.recv())  # ready
            await c.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            return json.loads(await asyncio.wait_for(c.recv(), 30))

    return asyncio.run(go())


def ws_reply(url: str, method: str, params: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """One JSON-RPC request over a fresh /ws connection: its response, past any notifications
    (progress) sent before it."""

    async def go() -> dict[str, Any]:
        async with connect(url, open_timeout=10) as c:
            json.loads(await c.recv())  # ready
            await c.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            while True:
                reply = json.loads(await asyncio.wait_for(c.recv(), timeout))
                if reply.get("id") == 1:
                    return dict(reply)

    return asyncio.run(go())


def raw_http(port: int, request: str, timeout: float = 5) -> tuple[int, dict[str, str], bytes]:
    """Send one raw HTTP/1.1 request; returns (status, headers, body) of the first response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request.encode("latin-1"))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if status != 101:
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                chunk = s.recv(65536)
                if not chunk:
                    break
                body += chunk
        return status, headers, body


def upgrade_request(path: str = "/ws", *, version: str = "13", method: str = "GET", extra: str = "") -> str:
    """A WebSocket opening handshake as raw text."""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: {version}\r\n{extra}"
        + ("Content-Length: 0\r\n" if method != "GET" else "")
        + "\r\n"
    )
