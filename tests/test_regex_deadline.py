"""Client regexes against a real `binlens serve`: a catastrophic pattern stops at the scan's
wall-clock deadline or on cancellation, and never stalls the server's other clients or its stop."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import regex
from websockets.asyncio.client import ClientConnection, connect

from binlens.api import invoke
from binlens.api._regex_pool import CHILD, SharedBytes, user_regex
from binlens.workspace import Workspace
from conftest import corpus_dir
from serve_support import ServerProcess

BOMB = "(a|a)+$"  # exponential on the fixture's run of 120 'a's ended by '!'


@pytest.fixture(scope="module")
def bomb(compile_c) -> Path:  # noqa: ANN001
    return compile_c("regex_bomb.c")


@pytest.fixture()
def server(tmp_path: Path, bomb: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path, str(bomb), "--max-concurrent", "4", "--ws-clients", "8")
    yield srv
    srv.kill()


async def recv_json(c: ClientConnection, timeout: float = 120) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(c.recv(), timeout))


async def opened(srv: ServerProcess, path: Path) -> tuple[ClientConnection, str]:
    """A /ws connection and the handle of `path`."""
    c = await connect(srv.ws_url, open_timeout=10)
    ready = await recv_json(c)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return c, next(p["program"] for p in ready["params"]["programs"] if p["sha256"] == sha)


async def send(c: ClientConnection, msg_id: str, method: str, params: dict[str, Any]) -> None:
    await c.send(json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}))


async def reply_to(c: ClientConnection, msg_id: str, timeout: float = 120) -> dict[str, Any]:
    """The response to `msg_id` (skipping notifications)."""
    while True:
        msg = await recv_json(c, timeout)
        if msg.get("id") == msg_id:
            return msg


async def others_are_served(srv: ServerProcess) -> None:
    """While a match runs: /healthz and a simple call on another connection answer promptly."""
    health = await asyncio.to_thread(httpx.get, srv.base + "/healthz", timeout=10)
    assert health.status_code == 200
    c2 = await connect(srv.ws_url, open_timeout=10)
    async with c2:
        await recv_json(c2, 10)
        await send(c2, "s", "session.get", {})
        assert (await reply_to(c2, "s", 10))["result"]["server"] == "binlens"


def analysed(srv: ServerProcess, bomb: Path) -> None:
    """Run the analysis first, so a string.list times only its regex."""

    async def go() -> None:
        c, prog = await opened(srv, bomb)
        async with c:
            await send(c, "f", "function.list", {"program": prog})
            assert "result" in await reply_to(c, "f")

    asyncio.run(go())


@pytest.mark.parametrize("method", ["memory.search", "string.list"])
def test_catastrophic_regex_stops_at_the_deadline_and_others_are_served(
    server: ServerProcess, bomb: Path, method: str
) -> None:
    if method == "string.list":
        analysed(server, bomb)
    timeout_ms = 3000

    async def go() -> None:
        c, prog = await opened(server, bomb)
        async with c:
            t0 = time.monotonic()
            await send(c, "bomb", method, {"program": prog, "regex": BOMB, "scan": {"timeout_ms": timeout_ms}})
            await asyncio.sleep(0.5)
            await asyncio.wait_for(others_are_served(server), 10)
            msg = await reply_to(c, "bomb", 60)
            took = time.monotonic() - t0
            assert "result" in msg, msg
            result = msg["result"]
            assert result["scan"]["complete"] is False and result["scan"]["stop_reason"] == "timeout"
            assert result["next_cursor"], "a partial scan gives a cursor to resume from"
            assert took < timeout_ms / 1000 * 2 + 2, f"{method} ran {took:.1f} s past a {timeout_ms} ms deadline"

    asyncio.run(go())


@pytest.mark.parametrize("method", ["memory.search", "string.list"])
def test_cancellation_stops_a_catastrophic_regex(server: ServerProcess, bomb: Path, method: str) -> None:
    if method == "string.list":
        analysed(server, bomb)

    async def go() -> None:
        c, prog = await opened(server, bomb)
        async with c:
            params = {"program": prog, "regex": BOMB, "scan": {"timeout_ms": 60000}}
            await send(c, "bomb", method, params)
            await asyncio.sleep(1.5)
            t0 = time.monotonic()
            await c.send(json.dumps({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": "bomb"}}))
            msg = await reply_to(c, "bomb", 90)
            took = time.monotonic() - t0
            assert msg.get("error", {}).get("data", {}).get("code") == "cancelled", msg
            assert took < 5, f"the cancelled {method} answered {took:.1f} s later"
            await others_are_served(server)

    asyncio.run(go())


@pytest.mark.parametrize("method", ["memory.search", "string.list"])
def test_sigterm_stops_the_server_during_a_catastrophic_regex(server: ServerProcess, bomb: Path, method: str) -> None:
    if method == "string.list":
        analysed(server, bomb)

    async def go() -> None:
        c, prog = await opened(server, bomb)
        async with c:
            params = {"program": prog, "regex": BOMB, "scan": {"timeout_ms": 60000}}
            await send(c, "bomb", method, params)
            await asyncio.sleep(1.5)
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(server.proc.wait, 30)
            assert time.monotonic() - t0 < 15

    asyncio.run(go())
    deadline = time.monotonic() + 10
    while regex_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not regex_children(), "a regex process outlived the server"


def regex_children() -> list[int]:
    """Live processes running this checkout's regex child (but this test process's own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if str(CHILD).encode() in cmdline and state != "Z" and int(ppid) != os.getpid():
            pids.append(int(entry.name))
    return pids


# --- the child's answers are the engine's -----------------------------------------------------------
def all_pages(ws: Workspace, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every hit of a memory.search, page after page."""
    hits, cursor = [], None
    while True:
        page = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        out = invoke(ws, "memory.search", {**params, "page": page, "scan": {"timeout_ms": 60000}})
        hits += out["items"]
        cursor = out["next_cursor"]
        if cursor is None:
            return hits


def test_regex_in_the_child_finds_what_the_pattern_finds(home: Path) -> None:
    binary = corpus_dir("elf") / "static-glibc-2.27"  # 756 KiB: a dozen chunks and more
    ws = Workspace()
    ws.open(str(binary), check_roots=False)
    by_pattern = all_pages(ws, {"pattern": "48 89 ?? 24"})
    by_regex = all_pages(ws, {"regex": r"\x48\x89.\x24"})
    assert len(by_pattern) > 1000  # several pages
    assert by_regex == by_pattern


def test_windows_are_sent_when_the_child_cannot_map_the_image() -> None:
    data = b"..ELF.." * 100
    shared = SharedBytes(data)
    shared.token = ("/nonexistent/fd", 1)  # as when /proc is not readable
    with user_regex(b"ELF", 0, None) as user:
        found = user.find(shared, 7, 70, 70, 100, time.monotonic() + 60)
    assert shared.token is None
    assert found == [(m.start(), m.end(), m.group()) for m in regex.finditer(b"ELF", data[7:77])]
