"""WebSocket JSON-RPC 2.0 at /ws (SPEC §4), one test per rule, against a real `binlens serve` with `websockets`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from serve_support import ServerProcess, build_big, long_search_params

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sample(compile_c) -> Path:  # noqa: ANN001
    return compile_c("sample.c")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_big(tmp_path_factory.mktemp("ws-big"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sample: Path, big: Path) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("ws-home")
    srv = ServerProcess(home, str(sample), str(big), "--ws-clients", "8", "--max-concurrent", "2")
    yield srv
    srv.stop()


async def recv_json(c: ClientConnection, timeout: float = 20) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(c.recv(), timeout))


async def opened(url: str) -> tuple[ClientConnection, dict[str, Any]]:
    """Connect and read the ready notification."""
    c = await connect(url, open_timeout=10)
    ready = await recv_json(c)
    return c, ready


async def call(c: ClientConnection, msg_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Send a request and return its response (skipping notifications)."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        msg["params"] = params
    await c.send(json.dumps(msg))
    while True:
        reply = await recv_json(c)
        if "id" in reply:
            return reply


async def still_open(c: ClientConnection) -> None:
    """The socket keeps serving after an error."""
    reply = await call(c, "alive", "session.get", {})
    assert reply["result"]["server"] == "binlens"


def handle_of(ready: dict[str, Any], path: Path) -> str:
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return next(p["program"] for p in ready["params"]["programs"] if p["sha256"] == sha)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- connect ------------------------------------------------------------------------------------
def test_ready_notification_names_the_session_and_open_programs(server: ServerProcess, sample: Path, big: Path) -> None:
    async def go() -> None:
        c, ready = await opened(server.ws_url)
        async with c:
            assert ready["jsonrpc"] == "2.0" and "id" not in ready
            assert ready["method"] == "binlens.ready"
            params = ready["params"]
            assert params["session"].startswith("ws-") and len(params["session"]) > 8
            shas = {p["sha256"] for p in params["programs"]}
            assert shas == {
                hashlib.sha256(sample.read_bytes()).hexdigest(),
                hashlib.sha256(big.read_bytes()).hexdigest(),
            }
            assert params["cancel_method"] == "$/cancelRequest"
            c2, ready2 = await opened(server.ws_url)
            async with c2:
                assert ready2["params"]["session"] != params["session"]

    run(go())


def test_request_with_string_and_integer_ids(server: ServerProcess, sample: Path) -> None:
    async def go() -> None:
        c, ready = await opened(server.ws_url)
        async with c:
            prog = handle_of(ready, sample)
            for msg_id in ("req-1", 7, 0, -3):
                reply = await call(c, msg_id, "symbol.list", {"program": prog, "page": {"limit": 3}})
                assert reply["jsonrpc"] == "2.0" and reply["id"] == msg_id and "error" not in reply
                assert len(reply["result"]["items"]) == 3
            names = set()
            reply = await call(c, 8, "symbol.list", {"program": prog, "page": {"limit": 1000}})
            names = {s["name"] for s in reply["result"]["items"]}
            assert "main" in names
            # a response about a program carries its identity beside the result
            assert reply["program"]["program"] == prog
            assert reply["program"]["sha256"] == hashlib.sha256(sample.read_bytes()).hexdigest()
            # params may be left out: session.get takes none (and concerns no one program)
            reply = await call(c, 9, "session.get")
            assert reply["result"]["read_only"] is False and "program" not in reply

    run(go())


def test_journal_client_is_stable_across_connections(server: ServerProcess, sample: Path) -> None:
    """Edits over /ws are journaled under the client's name (its User-Agent product and a digest of
    its credential), the same on each of its connections, never under a per-connection id."""
    secret = "Bearer ws-s3cret-" + "y" * 20

    async def comment(text: str, headers: dict[str, str] | None = None) -> None:
        agent = "probe/2.1 extra/9"
        c = await connect(server.ws_url, open_timeout=10, user_agent_header=agent, additional_headers=headers)
        async with c:
            ready = await recv_json(c)
            params = {"program": handle_of(ready, sample), "selector": {"name": "main"}, "kind": "eol", "text": text}
            assert "error" not in await call(c, 1, "comment.upsert", params)

    async def go() -> list[str]:
        await comment("ws journal 1")
        await comment("ws journal 2")
        await comment("ws journal 3", {"Authorization": secret})
        c, ready = await opened(server.ws_url)
        async with c:
            params = {"program": handle_of(ready, sample), "newest_first": True, "page": {"limit": 3}}
            reply = await call(c, 2, "journal.list", params)
            assert "s3cret" not in json.dumps(reply)
            return [e["client"] for e in reversed(reply["result"]["items"])]

    clients = run(go())
    assert clients[:2] == ["ws:probe/2.1", "ws:probe/2.1"]
    assert clients[2].startswith("ws:probe/2.1#") and len(clients[2]) == len("ws:probe/2.1#") + 12


# --- errors keep the socket open ----------------------------------------------------------------
def test_invalid_json_is_32700_with_null_id(server: ServerProcess) -> None:
    async def go() -> None:
        c, _ = await opened(server.ws_url)
        async with c:
            for text in ("{not json", '{"jsonrpc": "2.0", "id": 1, "method": "session.get", "params": {}', "NaN", ""):
                await c.send(text)
                reply = await recv_json(c)
                assert reply == {"jsonrpc": "2.0", "id": None, "error": reply["error"]}
                assert reply["error"]["code"] == -32700
            await still_open(c)

    run(go())


INVALID = [
    ([{"jsonrpc": "2.0", "id": 1, "method": "session.get"}], None),  # batch
    (42, None),
    ("a string", None),
    ({"id": 1, "method": "session.get", "params": {}}, 1),  # no jsonrpc
    ({"jsonrpc": "1.0", "id": 2, "method": "session.get", "params": {}}, 2),
    ({"jsonrpc": "2.0", "id": 3, "method": 5, "params": {}}, 3),
    ({"jsonrpc": "2.0", "id": 4, "method": "", "params": {}}, 4),
    ({"jsonrpc": "2.0", "id": 5, "method": "session.get", "params": [1, 2]}, 5),
    ({"jsonrpc": "2.0", "id": 6, "method": "session.get", "params": "x"}, 6),
    ({"jsonrpc": "2.0", "id": 1.5, "method": "session.get", "params": {}}, None),
    ({"jsonrpc": "2.0", "id": True, "method": "session.get", "params": {}}, None),
    ({"jsonrpc": "2.0", "id": None, "method": "session.get", "params": {}}, None),
    ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "session.get", "params": {}}, None),
    ({"jsonrpc": "2.0", "id": 7, "method": "session.get", "params": {}, "extra": 1}, 7),
    ({"jsonrpc": "2.0", "method": "session.get", "params": {}}, None),  # a notification other than cancel
]


def test_invalid_requests_are_32600_and_the_socket_stays_open(server: ServerProcess) -> None:
    async def go() -> None:
        c, _ = await opened(server.ws_url)
        async with c:
            for message, expected_id in INVALID:
                await c.send(json.dumps(message))
                reply = await recv_json(c)
                assert reply["error"]["code"] == -32600, message
                assert reply["id"] == expected_id, message
                assert "result" not in reply
            await still_open(c)

    run(go())


def test_unknown_method_is_32601_with_not_found(server: ServerProcess) -> None:
    async def go() -> None:
        c, _ = await opened(server.ws_url)
        async with c:
            reply = await call(c, "u1", "nosuch.method", {})
            assert reply["id"] == "u1"
            assert reply["error"]["code"] == -32601
            data = reply["error"]["data"]
            assert data["code"] == "not_found" and data["status"] == 404 and data["target"] == "/method"
            await still_open(c)

    run(go())


def test_method_failure_is_32000_with_the_error_object(server: ServerProcess, sample: Path) -> None:
    async def go() -> None:
        c, ready = await opened(server.ws_url)
        async with c:
            prog = handle_of(ready, sample)
            reply = await call(c, 1, "symbol.list", {"program": prog, "page": {"limit": 0}})
            err = reply["error"]
            assert err["code"] == -32000
            assert set(err["data"]) == {"status", "code", "message", "target", "details"}
            assert err["data"]["code"] == "invalid_argument" and err["data"]["target"] == "/params/page/limit"
            reply = await call(c, 2, "symbol.list", {"program": prog, "bogus": 1})
            assert reply["error"]["data"]["target"] == "/params/bogus"
            # two programs are open: leaving `program` out is an error pointing at it
            reply = await call(c, 3, "symbol.list", {})
            assert reply["error"]["data"]["target"] == "/params/program"
            reply = await call(c, 4, "program.get", {"program": "pdeadbeef"})
            assert reply["error"]["data"]["code"] == "not_found" and reply["error"]["data"]["status"] == 404
            assert "Traceback" not in json.dumps(reply)
            await still_open(c)

    run(go())


# --- long calls: progress, cancellation, busy ----------------------------------------------------
def test_progress_notifications_then_cancellation(server: ServerProcess, big: Path) -> None:
    async def go() -> None:
        c, ready = await opened(server.ws_url)
        async with c:
            prog = handle_of(ready, big)
            await c.send(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": "long",
                        "method": "memory.search",
                        "params": {"program": prog, **long_search_params()},
                    }
                )
            )
            progress = []
            while len(progress) < 2:
                msg = await recv_json(c, 30)
                assert "id" not in msg, f"the search ended before it could be cancelled: {msg}"
                if msg.get("method") == "$/progress":
                    progress.append(msg["params"])
            assert all(p["id"] == "long" for p in progress)
            assert progress[0]["total"] >= 16 << 20
            assert progress[1]["progress"] > progress[0]["progress"]
            # cancelling an unknown id, as a request, says so
            reply = await call(c, "c0", "$/cancelRequest", {"id": "nosuch"})
            assert reply["result"] == {"cancelled": False}
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await c.send(json.dumps({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": "long"}}))
            while True:
                msg = await recv_json(c, 30)
                if msg.get("id") == "long":
                    break
            assert msg["error"]["code"] == -32000 and msg["error"]["data"]["code"] == "cancelled"
            assert loop.time() - t0 < 10
            await still_open(c)

    run(go())


def test_busy_beyond_max_concurrent(server: ServerProcess, big: Path) -> None:
    async def go() -> None:
        c, ready = await opened(server.ws_url)
        async with c:
            prog = handle_of(ready, big)
            for i in (1, 2):  # --max-concurrent 2
                req = {
                    "jsonrpc": "2.0",
                    "id": f"L{i}",
                    "method": "memory.search",
                    "params": {"program": prog, **long_search_params()},
                }
                await c.send(json.dumps(req))
            await asyncio.sleep(0.3)
            reply = await call(c, "third", "session.get", {})
            assert reply["error"]["code"] == -32000
            assert reply["error"]["data"]["code"] == "busy" and reply["error"]["data"]["status"] == 429
            # a duplicate id of a running request is refused
            dup = await call(c, "L1", "session.get", {})
            assert dup["error"]["code"] == -32600
            for i in (1, 2):
                await c.send(json.dumps({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": f"L{i}"}}))
            done = set()
            while len(done) < 2:
                msg = await recv_json(c, 30)
                if msg.get("id") in ("L1", "L2"):
                    assert msg["error"]["data"]["code"] == "cancelled"
                    done.add(msg["id"])
            await still_open(c)  # slots are free again

    run(go())


# --- frames and close codes ---------------------------------------------------------------------
def test_ws_and_mcp_share_the_call_slots(server: ServerProcess, big: Path) -> None:
    """--max-concurrent bounds the whole server: two long /ws calls leave no slot for MCP."""
    import httpx

    modern = "2026-07-28"
    meta = {
        "io.modelcontextprotocol/protocolVersion": modern,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "binlens_session", "arguments": {"operation": "get"}, "_meta": meta},
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": modern,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "binlens_session",
    }

    def mcp_call() -> dict[str, Any]:
        r = httpx.post(server.base + "/mcp", content=json.dumps(body), headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["result"]

    async def go() -> None:
        assert (await asyncio.to_thread(mcp_call))["isError"] is False
        c, ready = await opened(server.ws_url)
        async with c:
            prog = handle_of(ready, big)
            for i in (1, 2):  # --max-concurrent 2
                req = {"jsonrpc": "2.0", "id": f"S{i}", "method": "memory.search"}
                req["params"] = {"program": prog, **long_search_params()}
                await c.send(json.dumps(req))
            await asyncio.sleep(0.3)
            busy = await asyncio.to_thread(mcp_call)
            assert busy["isError"] is True and busy["structuredContent"]["error"]["code"] == "busy"
            for i in (1, 2):
                await c.send(json.dumps({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": f"S{i}"}}))
            done = set()
            while len(done) < 2:
                msg = await recv_json(c, 30)
                if msg.get("id") in ("S1", "S2"):
                    done.add(msg["id"])
        for _ in range(50):  # the slots come back once the cancelled searches return
            if not (await asyncio.to_thread(mcp_call))["isError"]:
                return
            await asyncio.sleep(0.1)
        raise AssertionError("MCP stayed busy after the /ws calls ended")

    run(go())


def test_fragmented_text_message_closes_with_1003(server: ServerProcess) -> None:
    """A JSON-RPC message split over continuation frames is refused, not reassembled."""

    async def go() -> None:
        c, _ = await opened(server.ws_url)
        await c.send(['{"jsonrpc": "2.0", "id": 1, ', '"method": "session.get", "params": {}}'])  # two frames
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(c.recv(), 10)
        assert c.close_code == 1003 and "fragmented" in (c.close_reason or "")
        # the slot is free again: a new client connects and is served
        again, _ = await opened(server.ws_url)
        await again.send('{"jsonrpc": "2.0", "id": 2, "method": "session.get", "params": {}}')
        assert (await recv_json(again, 30))["id"] == 2
        await again.close()

    run(go())


def test_binary_frame_closes_with_1003(server: ServerProcess) -> None:
    async def go() -> None:
        c, _ = await opened(server.ws_url)
        await c.send(b'{"jsonrpc": "2.0", "id": 1, "method": "session.get", "params": {}}')
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(c.recv(), 10)
        assert c.close_code == 1003
        assert "binary" in c.close_reason

    run(go())


def test_normal_close_is_1000(server: ServerProcess) -> None:
    async def go() -> None:
        c, _ = await opened(server.ws_url)
        await c.close(1000, "bye")
        assert c.close_code == 1000  # the server answered our close with 1000

    run(go())


def test_oversized_frame_is_refused(server: ServerProcess) -> None:
    async def go() -> None:
        c, _ = await opened(server.ws_url)
        pad = "x" * (1 << 20)  # over the default 1 MiB --max-frame-bytes
        await c.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.get", "params": {"pad": pad}}))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(c.recv(), 10)
        assert c.close_code == 1009  # message too big
        c, _ = await opened(server.ws_url)  # the server keeps serving
        async with c:
            await still_open(c)
            # just under the limit is read (and answered: session.get takes no 'pad')
            near = "x" * ((1 << 20) - 200)
            reply = await call(c, 2, "session.get", {"pad": near})
            assert reply["error"]["data"]["target"] == "/params/pad"

    run(go())


def test_server_stop_closes_clients_with_1001(tmp_path: Path, sample: Path) -> None:
    srv = ServerProcess(tmp_path, str(sample))

    async def go() -> None:
        c, _ = await opened(srv.ws_url)
        srv.proc.send_signal(signal.SIGINT)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(c.recv(), 15)
        assert c.close_code == 1001

    try:
        run(go())
        assert srv.proc.wait(15) == 0
        assert "binlens serve: stopped" in srv.stderr
    finally:
        srv.kill()
