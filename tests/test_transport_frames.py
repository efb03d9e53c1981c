"""Hostile JSON-RPC frames on every transport: each gets a JSON-RPC error and the server keeps serving.

Nesting deeper than the parser's recursion limit and lone surrogate escapes (in the id, the method
or a parameter) once killed `binlens mcp`, gave a text/plain 500 over HTTP and went unanswered on
/ws. Real servers (`binlens mcp`, `binlens serve`), real clients (pipes, httpx, websockets).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from mcp_support import ROOT, SseReader
from mcp_support import env_for as mcp_env
from serve_support import ServerProcess

pytestmark = pytest.mark.timeout(120)

DEEP = '{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":' + "[" * 5000 + "]" * 5000 + "}}"
LONE_ID = r'{"jsonrpc":"2.0","id":"\ud800","method":"ping"}'
LONE_METHOD = r'{"jsonrpc":"2.0","id":8,"method":"\udc00ping"}'
LONE_PARAM = (
    r'{"jsonrpc":"2.0","id":9,"method":"tools/call",'
    r'"params":{"name":"binlens_help","arguments":{"operation":"x\ud800"}}}'
)
BROKEN = '{"jsonrpc": "2.0", "id": 10, "method": "ping"'
# (frame, expected code, expected id: None = no id could be read)
HOSTILE = [
    (DEEP, -32700, None),
    (LONE_ID, -32600, None),
    (LONE_METHOD, -32600, 8),
    (LONE_PARAM, -32600, 9),
    (BROKEN, -32700, None),
]
PAIR_ID = r'{"jsonrpc":"2.0","id":"\ud83d\ude00","method":"ping"}'  # a valid pair: an emoji id, served
INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
JSON = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def _no_python_text(message: str) -> None:
    """An error message of our own: not the decoder's ("Expecting value: line 1 column 2 (char 1)")."""
    for leak in ("Expecting", "line 1", "column", "(char", "Traceback", "maximum recursion"):
        assert leak not in message, message


def _check(frame: dict[str, Any], code: int, rid: Any) -> None:
    assert frame["jsonrpc"] == "2.0" and "result" not in frame, frame
    assert frame["error"]["code"] == code, frame
    assert frame.get("id") == rid, frame
    _no_python_text(frame["error"]["message"])


@pytest.fixture(scope="module")
def sample(compile_c) -> Path:  # noqa: ANN001
    return compile_c("sample.c")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sample: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("frames-home"), str(sample), "--ws-clients", "2")
    yield srv
    srv.stop()


def test_stdio_answers_every_hostile_frame_and_keeps_serving(tmp_path: Path) -> None:
    lines = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT})]
    lines += [frame for frame, _, _ in HOSTILE]
    lines += [PAIR_ID, json.dumps({"jsonrpc": "2.0", "id": 99, "method": "ping"})]
    proc = subprocess.run(
        [sys.executable, "-m", "binlens", "mcp"],
        input=("\n".join(lines) + "\n").encode(),
        capture_output=True,
        env=mcp_env(tmp_path),
        cwd=ROOT,
        timeout=60,
    )
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err[-3000:]
    frames = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(frames) == len(lines), frames
    for frame, (_, code, rid) in zip(frames[1:], HOSTILE, strict=False):
        _check(frame, code, rid)
    assert frames[-2] == {"jsonrpc": "2.0", "id": "\U0001f600", "result": {}}
    assert frames[-1] == {"jsonrpc": "2.0", "id": 99, "result": {}}
    assert "Traceback" not in err


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25", "2026-07-28"])
def test_mcp_http_answers_hostile_bodies_with_json_rpc_errors(server: ServerProcess, version: str) -> None:
    headers = {**JSON, "MCP-Protocol-Version": version}
    for frame, code, rid in HOSTILE:
        r = httpx.post(server.base + "/mcp", content=frame.encode(), headers=headers, timeout=30)
        assert r.status_code == 400, (frame[:60], r.status_code, r.text[:300])
        assert r.headers["content-type"] == "application/json"
        body = r.json()
        if rid is None and version == "2025-06-18":
            assert body["id"] is None
        _check(body, code, rid)
    ping = httpx.post(
        server.base + "/mcp",
        json={"jsonrpc": "2.0", "id": 5, "method": "ping"},
        headers=headers | {"MCP-Protocol-Version": "2025-11-25"},
    )
    assert ping.json() == {"jsonrpc": "2.0", "id": 5, "result": {}}
    assert "Traceback" not in server.stderr


def test_legacy_sse_answers_hostile_bodies_and_keeps_the_session(server: ServerProcess) -> None:
    sse = SseReader(server.base + "/sse")
    try:
        _, endpoint = sse.wait(lambda: sse.events and sse.events[0])
        url = server.base + endpoint
        for frame, code, rid in HOSTILE:
            r = httpx.post(url, content=frame.encode(), headers={"Content-Type": "application/json"}, timeout=30)
            assert r.status_code == 400, (frame[:60], r.status_code, r.text[:300])
            assert r.headers["content-type"] == "application/json"
            _check(r.json(), code, rid)
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}
        assert httpx.post(url, json=init).status_code == 202
        r = httpx.post(url, content=PAIR_ID.encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 202
        _, data = sse.wait(lambda: len(sse.events) >= 3 and sse.events[2])
        assert json.loads(data) == {"jsonrpc": "2.0", "id": "\U0001f600", "result": {}}
    finally:
        sse.close()
    assert "Traceback" not in server.stderr


def test_ws_answers_hostile_frames_and_stays_open(server: ServerProcess) -> None:
    async def go() -> None:
        async with connect(server.ws_url, open_timeout=10) as c:
            await asyncio.wait_for(c.recv(), 20)  # the ready notification
            for frame, code, rid in HOSTILE:
                await c.send(frame)
                reply = json.loads(await asyncio.wait_for(c.recv(), 20))
                assert reply["id"] == rid
                _check(reply, code, rid)
            await c.send(PAIR_ID)  # served: `ping` is no registry method, and the emoji id is echoed
            reply = json.loads(await asyncio.wait_for(c.recv(), 20))
            assert reply["id"] == "\U0001f600" and reply["error"]["code"] == -32601
            await c.send(json.dumps({"jsonrpc": "2.0", "id": "alive", "method": "session.get", "params": {}}))
            reply = json.loads(await asyncio.wait_for(c.recv(), 20))
            assert reply["result"]["server"] == "binlens"

    asyncio.run(go())
    assert "Traceback" not in server.stderr
