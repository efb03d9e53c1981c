"""Debugger stop events pushed as `{prefix}.debug.event` notifications over WebSocket and stdio MCP,
from real servers (`binlens serve|mcp FILE --allow-debug`) debugging a stripped PIE the test compiles.
Timeouts are hang bounds only."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from mcp_support import SseReader
from serve_support import ServerProcess, env_for
from test_mcp_stdio import INIT, StdioClient, msg

pytestmark = [
    pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (apt-get install gdb)"),
    pytest.mark.timeout(180),
]
pytest.importorskip("pygdbmi", reason="pip install 'binlens[debug]'")


def work_address(compile_c: Any) -> tuple[Path, int]:
    """The stripped debuggee and the static address of its `work` function."""
    full = compile_c("debuggee.c", opt="-O1")
    out = subprocess.run(["nm", str(full)], check=True, capture_output=True, text=True).stdout
    work = next(int(line.split()[0], 16) for line in out.splitlines() if line.endswith(" work"))
    return compile_c("debuggee.c", opt="-O1", strip=True), work


def test_stop_events_are_pushed_over_websocket_and_legacy_sse(tmp_path: Path, compile_c: Any) -> None:
    path, work = work_address(compile_c)
    home = tmp_path / "home"

    async def go(url: str) -> list[dict[str, Any]]:
        async with connect(url, open_timeout=30) as c:
            json.loads(await c.recv())  # ready
            seq = 0

            async def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
                nonlocal seq
                seq += 1
                await c.send(json.dumps({"jsonrpc": "2.0", "id": seq, "method": method, "params": params}))
                while True:
                    frame = json.loads(await asyncio.wait_for(c.recv(), 60))
                    if frame.get("id") == seq:
                        assert "result" in frame, frame
                        return frame["result"]
                    pushed.append(frame)

            pushed: list[dict[str, Any]] = []
            await call("symbol.patch", {"selector": {"address": hex(work)}, "name": "accumulate"})
            d = (await call("debug.start", {"args": ["2"], "timeout_ms": 60000}))["debug_id"]
            await call("breakpoint.create", {"debug_id": d, "selector": {"name": "accumulate"}})
            await call("debug.continue", {"debug_id": d, "wait_ms": 0})
            while not any(f.get("params", {}).get("kind") == "breakpoint" for f in pushed):
                pushed.append(json.loads(await asyncio.wait_for(c.recv(), 60)))
            assert (await call("debug_variable.evaluate", {"debug_id": d, "expression": "$rdi"}))["value"] == "1"
            await call("breakpoint.delete", {"debug_id": d, "id": 1})
            await call("debug.continue", {"debug_id": d, "wait_ms": 0})
            while not any(f.get("params", {}).get("kind") == "exited" for f in pushed):
                pushed.append(json.loads(await asyncio.wait_for(c.recv(), 60)))
            return pushed

    with ServerProcess(home, str(path), "--allow-debug", env=env_for(home)) as srv:
        sse = SseReader(srv.base + "/sse")
        try:
            sse.wait(lambda: sse.events)  # the endpoint event: the session (and its listener) exists
            pushed = asyncio.run(go(srv.ws_url))
            on_sse = sse.wait(lambda: [json.loads(d) for n, d in sse.events[1:] if '"exited"' in d])
        finally:
            sse.close()
    assert on_sse[0]["method"] == "binlens.debug.event" and on_sse[0]["params"]["exit_code"] == 12
    events = [f["params"] for f in pushed if f.get("method") == "binlens.debug.event"]
    hit = next(e for e in events if e["kind"] == "breakpoint")
    assert hit["static_address"] == hex(work) and hit["debug_id"] == "dbg-1"
    assert events[-1]["kind"] == "exited" and events[-1]["exit_code"] == 12  # work(1) + work(2) = 3 + 9


def test_stop_events_are_pushed_over_stdio_mcp(tmp_path: Path, compile_c: Any) -> None:
    path, work = work_address(compile_c)
    client = StdioClient(tmp_path, str(path), "--allow-debug", "--tool-prefix", "dbg")
    rid = 0

    def call(tool: str, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        nonlocal rid
        rid += 1
        args = {"operation": operation, "params": params}
        client.send(
            msg({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": tool, "arguments": args}})
        )
        result = client.answer(rid)["result"]
        assert not result.get("isError"), result
        return result["structuredContent"]

    try:
        client.send(msg({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT}))
        client.answer(0)
        d = call("dbg_debug", "start", {"args": ["1"], "timeout_ms": 60000})["debug_id"]
        call("dbg_breakpoint", "create", {"debug_id": d, "selector": {"name": f"sub_{work:x}"}})
        call("dbg_debug", "continue", {"debug_id": d, "wait_ms": 30000})
        frame = call("dbg_debug_variable", "list", {"debug_id": d})  # (no debug file: no variables)
        assert frame["debug_info"] is False and frame["static_address"] == hex(work)
        assert call("dbg_debug_variable", "evaluate", {"debug_id": d, "expression": "$rdi"})["value"] == "1"
        call("dbg_debug", "kill", {"debug_id": d})
        pushed = [f["params"] for f in client.seen if f.get("method") == "dbg.debug.event"]
        assert [e["kind"] for e in pushed][-2:] == ["breakpoint", "exited"]
        assert pushed[-2]["static_address"] == hex(work)
    finally:
        assert client.close() == 0
