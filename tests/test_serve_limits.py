"""`binlens serve` keeps its connections bounded: a cap, header and idle timeouts, bounded SSE queues.

Real server processes on 127.0.0.1, raw sockets for the half-open and never-reading clients,
httpx/websockets for the legitimate ones. Counts and times are small and bounds generous: the
tests are about connections held forever, not about speed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from mcp_support import SseReader
from serve_support import ServerProcess, env_for, rss_mb

pytestmark = pytest.mark.timeout(240)

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}


@pytest.mark.parametrize(
    "args",
    [
        ["--max-connections", "0"],
        ["--header-timeout", "0"],
        ["--idle-timeout", "-1"],
        ["--keep-alive", "nan"],
        ["--idle-timeout", "inf"],
        ["--sse-queue", "x"],
    ],
)
def test_bad_limits_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "binlens", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        env=env_for(tmp_path),
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert args[0] in proc.stderr


def _closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """True when the server ends the connection (EOF or reset) within `timeout` (whatever it sent first)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            return False
        except OSError:  # ECONNRESET: the server aborted the connection
            return True


def _open_many(port: int, count: int, budget_s: float = 60) -> list[socket.socket]:
    """Open up to `count` connections that send nothing or half a request head (within a time budget)."""
    socks: list[socket.socket] = []
    deadline = time.monotonic() + budget_s
    for i in range(count):
        if time.monotonic() > deadline:
            break
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            continue
        if i % 2:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never the blank line
        socks.append(s)
    return socks


def _healthz_within(base: str, seconds: float) -> int:
    """Status of the first /healthz answer within `seconds` (retrying refused or cut connections)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return httpx.get(base + "/healthz", timeout=5).status_code
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                return 0
            time.sleep(0.2)


def test_half_open_connections_are_capped_and_closed(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path, "--max-connections", "50", "--header-timeout", "2", "--idle-timeout", "2")
    socks: list[socket.socket] = []
    try:
        socks = _open_many(srv.port, 200)
        assert len(socks) > 100  # well over the cap
        # a request body that stops arriving is cut by the idle timeout
        stalled = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        stalled.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"jsonrpc"'
        )
        assert _healthz_within(srv.base, 30) == 200  # a real client gets in while the idle ones wait
        assert all(_closed_by_server(s, 30) for s in socks), "an idle connection was held open"
        assert _closed_by_server(stalled, 30), "a stalled request body held its connection"
        stalled.close()
        assert _healthz_within(srv.base, 30) == 200
        assert len(srv.stderr_lines) < 60, srv.stderr[-3000:]  # refusals are logged a few times, not each
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_out_of_descriptors_neither_locks_out_clients_nor_floods_the_log(tmp_path: Path) -> None:
    # 128 open files and default options: the cap is lowered to fit, so accept() never runs out.
    srv = ServerProcess(tmp_path, nofile=128)
    socks: list[socket.socket] = []
    try:
        start = len(srv.stderr_lines)
        socks = _open_many(srv.port, 300)
        assert _healthz_within(srv.base, 30) == 200
        time.sleep(3)
        flood = srv.stderr_lines[start:]
        assert len(flood) < 100, "".join(flood[:40])
    finally:
        for s in socks:
            s.close()
        srv.stop()
    assert "does not fit the open-file limit" in srv.stderr


def _interface_get(rid: int) -> dict[str, object]:
    """A tools/call whose answer is large (about 400 KB: the whole method catalog)."""
    arguments = {"operation": "get", "params": {}}
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": "binlens_interface", "arguments": arguments},
    }


def test_sse_client_that_never_reads_is_dropped_and_memory_stays_bounded(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path, "--sse-queue", "4", "--idle-timeout", "2")
    reader = socket.socket()
    try:
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", srv.port))
        reader.sendall(b"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        head = b""
        while b"sessionId=" not in head or not head.split(b"sessionId=", 1)[1].count(b"\n"):
            head += reader.recv(4096)
        url = srv.base + head.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode()
        with httpx.Client(timeout=60) as client:
            version = {"Accept": "application/json", "MCP-Protocol-Version": "2025-11-25"}
            warm = client.post(srv.base + "/mcp", json=_interface_get(1), headers=version)
            assert len(warm.content) > 100_000
            assert (
                client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}).status_code
                == 202
            )
            before = rss_mb(srv.proc.pid)
            statuses = []
            for rid in range(10, 410):  # the reader never reads: its answers pile up
                statuses.append(client.post(url, json=_interface_get(rid)).status_code)
                if statuses[-1] != 202:
                    break
            assert statuses[-1] == 404, f"the session was never dropped ({len(statuses)} answers queued)"
            grown = rss_mb(srv.proc.pid) - before
        assert grown < 64, f"server memory grew by {grown:.0f} MiB"
        assert _closed_by_server(reader, 60), "the dropped session's connection stayed open"
        assert "dropped" in srv.stderr
    finally:
        reader.close()
        srv.stop()


def test_timeouts_spare_live_streams_and_websockets(tmp_path: Path) -> None:
    env = env_for(tmp_path, BINLENS_SSE_KEEPALIVE_S="0.3")
    srv = ServerProcess(tmp_path, "--header-timeout", "1", "--idle-timeout", "1", "--keep-alive", "1", env=env)
    try:
        sse = SseReader(srv.base + "/sse")
        try:

            async def ws_session() -> dict[str, object]:
                async with connect(srv.ws_url, open_timeout=10) as c:
                    await asyncio.wait_for(c.recv(), 20)
                    await asyncio.sleep(3)  # three header and idle timeouts
                    await c.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.get", "params": {}}))
                    return json.loads(await asyncio.wait_for(c.recv(), 20))

            reply = asyncio.run(ws_session())
            assert reply["result"]["server"] == "binlens"
            seen = len(sse.comments)
            sse.wait(lambda: len(sse.comments) >= seen + 2, timeout=20)  # the stream still flows
            _, endpoint = sse.events[0]
            r = httpx.post(
                srv.base + endpoint, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}
            )
            assert r.status_code == 202
        finally:
            sse.close()
    finally:
        srv.stop()
