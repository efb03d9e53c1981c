"""session.shutdown: real server processes (HTTP, WebSocket, stdio) stop cleanly and exit 0 for a
caller on loopback or holding the token; a remote caller without the token is refused."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from binlens.api import invoke
from binlens.api.registry import CallContext
from binlens.errors import BinlensError
from serve_support import TOKEN, ServerProcess, env_for, ws_call

MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}


def _tool_call(base: str, operation: str, params: dict, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "binlens_session", "arguments": {"operation": operation, "params": params}, "_meta": META},
    }
    hdrs = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "binlens_session",
        **(headers or {}),
    }
    return httpx.post(base + "/mcp", content=json.dumps(body), headers=hdrs, timeout=30)


def _wait_exit(server: ServerProcess, timeout: float = 30) -> int:
    try:
        return server.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError(f"the server did not exit: {server.stderr[-2000:]}") from None


def test_http_loopback_caller_stops_the_server_and_it_exits_0(home, compile_c):
    sample = compile_c("sample.c")
    server = ServerProcess(home, str(sample))
    try:
        # a proxy on this machine forwarding a remote client: refused, and the server keeps serving
        refused = _tool_call(server.base, "shutdown", {}, {"X-Forwarded-For": "203.0.113.7"}).json()["result"]
        assert refused["isError"] is True
        err = refused["structuredContent"]["error"]
        assert (err["code"], err["status"], err["details"]["requirement"]) == (
            "permission_denied",
            403,
            "caller:trusted",
        )
        refused = _tool_call(server.base, "shutdown", {}, {"Forwarded": 'for="[2001:db8::1]";proto=http'})
        assert refused.json()["result"]["structuredContent"]["error"]["code"] == "permission_denied"
        assert httpx.get(server.base + "/healthz", timeout=5).status_code == 200

        ok = _tool_call(server.base, "shutdown", {"grace_ms": 2000}).json()["result"]
        assert ok["isError"] is False
        assert ok["structuredContent"] == {"stopping": True, "grace_ms": 2000, "transport": "mcp"}
        assert _wait_exit(server) == 0
        time.sleep(0.2)  # (the drain threads read the last lines)
        assert "binlens serve: stopped" in server.stderr and "Traceback" not in server.stderr
    finally:
        server.kill()


def test_websocket_remote_is_refused_and_loopback_stops(home, compile_c):
    sample = compile_c("sample.c")
    server = ServerProcess(home, str(sample))
    try:
        refused = ws_call(server.ws_url, "session.shutdown", {}, headers={"X-Real-IP": "198.51.100.4"})
        assert refused["error"]["data"]["code"] == "permission_denied"
        ok = ws_call(server.ws_url, "session.shutdown", {"grace_ms": 1000})
        assert ok["result"] == {"stopping": True, "grace_ms": 1000, "transport": "websocket"}
        assert _wait_exit(server) == 0
    finally:
        server.kill()


def _other_address() -> str | None:
    """A non-loopback address of this machine that a socket can bind and reach, or None."""
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        addrs = set()
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    for a in [*out, *sorted(addrs)]:
        if ":" in a or a.startswith("127."):
            continue
        try:
            with socket.socket() as s:
                s.bind((a, 0))
                s.listen(1)
                with socket.create_connection(s.getsockname(), timeout=2):
                    return a
        except OSError:
            continue
    return None


def test_non_loopback_peer_needs_the_token(home, compile_c):
    addr = _other_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback address to listen on")
    sample = compile_c("sample.c")
    server = ServerProcess(home, str(sample), "--host", addr, "--token", TOKEN)
    try:
        base = f"http://{addr}:{server.port}"
        assert _tool_call(base, "shutdown", {}).status_code == 401  # no token: refused before any method
        ok = _tool_call(base, "shutdown", {}, {"Authorization": f"Bearer {TOKEN}"}).json()["result"]
        assert ok["structuredContent"]["stopping"] is True  # a remote peer with the token may
        assert _wait_exit(server) == 0
    finally:
        server.kill()


def test_stdio_server_stops_without_eof_and_exits_0(home, compile_c):
    sample = compile_c("sample.c")
    proc = subprocess.Popen(
        [sys.executable, "-m", "binlens", "mcp", str(sample)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_for(home),
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "binlens_session", "arguments": {"operation": "shutdown", "params": {}}, "_meta": META},
        }
        proc.stdin.write((json.dumps(call) + "\n").encode())
        proc.stdin.flush()  # stdin stays open: the server ends by itself
        answer = json.loads(proc.stdout.readline())
        assert answer["id"] == 2 and answer["result"]["structuredContent"]["stopping"] is True
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_in_process_rules(workspace, compile_c):
    workspace.open(compile_c("sample.c"), check_roots=False)
    with pytest.raises(BinlensError) as err:  # a one-shot call has no server to stop
        invoke(workspace, "session.shutdown", {})
    assert err.value.code == "unsupported"
    remote = CallContext(peer="203.0.113.7", transport="mcp")
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "session.shutdown", {}, remote)
    assert (err.value.code, err.value.status) == ("permission_denied", 403)
    listed = invoke(workspace, "session.get", {}, remote)["tool_availability"]["session.shutdown"]
    assert listed["available"] is False and "loopback" in listed["reason"]
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "session.shutdown", {"grace_ms": 60001})
    assert err.value.target == "/params/grace_ms"

    stops: list[float] = []
    workspace.stop_server = stops.append  # what a transport gives
    for ctx in (CallContext(peer="::1"), CallContext(peer="203.0.113.7", authenticated=True)):
        workspace.stopping = False
        assert invoke(workspace, "session.shutdown", {"grace_ms": 250}, ctx)["stopping"] is True
    assert stops == [0.25, 0.25]
    with pytest.raises(BinlensError) as err:  # once stopping, every call is refused
        invoke(workspace, "program.list", {})
    assert err.value.code == "unavailable" and err.value.details["reason"] == "stopping"


def test_peer_address_forms():
    from binlens.api.requirements import is_loopback_address
    from binlens.server.auth import caller_peer

    assert all(map(is_loopback_address, ["127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"]))
    assert not any(map(is_loopback_address, ["192.0.2.2", "2001:db8::1", "unknown", "", "10.0.0.1"]))

    def scope(headers: dict[str, str], client: tuple[str, int] | None = ("127.0.0.1", 5)) -> dict:
        return {"headers": [(k.encode(), v.encode()) for k, v in headers.items()], "client": client}

    assert caller_peer(scope({})) == "127.0.0.1"
    assert caller_peer(scope({}, None)) == "unknown"
    assert caller_peer(scope({"x-forwarded-for": "203.0.113.7, 10.0.0.1"})) == "203.0.113.7"
    assert caller_peer(scope({"forwarded": 'for="[2001:db8::1]:4711";proto=https'})) == "2001:db8::1"
    assert caller_peer(scope({"forwarded": "proto=http;for=198.51.100.9"})) == "198.51.100.9"
    # a forwarded address never makes a caller more trusted than its socket
    assert caller_peer(scope({"x-forwarded-for": "127.0.0.1, 203.0.113.7"})) == "203.0.113.7"
    assert caller_peer(scope({"x-forwarded-for": "127.0.0.1"}, ("203.0.113.8", 9))) == "203.0.113.8"
    assert caller_peer(scope({"x-real-ip": "::1", "forwarded": "for=127.0.0.1"})) == "127.0.0.1"


def test_a_running_call_gets_the_grace_and_the_server_still_exits_0(home, tmp_path):
    """A long memory.search runs on /ws when a loopback caller shuts the server down: the search
    ends (answered, or its socket closed with 1001 once the grace is over) and the process exits 0."""
    import asyncio

    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from serve_support import build_big, long_search_params

    big = build_big(tmp_path / "big")
    server = ServerProcess(home, str(big))

    async def go() -> tuple[str, float]:
        async with connect(server.ws_url, open_timeout=10) as c:
            ready = json.loads(await c.recv())
            prog = ready["params"]["programs"][0]["program"]
            params = {"program": prog, **long_search_params()}
            await c.send(json.dumps({"jsonrpc": "2.0", "id": "long", "method": "memory.search", "params": params}))
            while json.loads(await asyncio.wait_for(c.recv(), 30)).get("method") != "$/progress":
                pass  # (the search runs)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            stopped = await asyncio.to_thread(_tool_call, server.base, "shutdown", {"grace_ms": 500})
            assert stopped.json()["result"]["structuredContent"]["stopping"] is True
            try:
                while True:
                    msg = json.loads(await asyncio.wait_for(c.recv(), 30))
                    if msg.get("id") == "long":
                        return "answered", loop.time() - t0
            except ConnectionClosed as closed:
                assert closed.rcvd is not None and closed.rcvd.code == 1001
                return "closed", loop.time() - t0

    try:
        how, after = asyncio.run(go())
        assert how in ("answered", "closed") and after < 30
        assert _wait_exit(server) == 0
    finally:
        server.kill()
