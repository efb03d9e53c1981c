"""The official `mcp` Python client against real binlens server processes.

Transports: stdio (`binlens mcp`), Streamable HTTP /mcp in 2026-07-28 and in the handshake era,
and legacy HTTP+SSE. Each runs the acceptance script: discovery/initialize, tools/list, help
navigation, a `symbol.list` call, a method error, progress from a long call and cancellation.
"""

from __future__ import annotations

import json
import re
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPDeprecationWarning
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters

from mcp_support import ROOT, env_for, start_http_server, stop

# A byte regex that backtracks enough to take ~0.3 s per MiB of zeros: ~10 s over the 32 MiB of
# mcp_big.c (memory.search reports progress and checks for cancellation once per chunk).
SLOW_REGEX = r"\x00{0,20}[^\x00]\x00{3}z"


@pytest.fixture(scope="module")
def sample(compile_c) -> Path:  # noqa: ANN001
    return compile_c("sample.c")


@pytest.fixture(scope="module")
def mhome(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-home")


@pytest.fixture(scope="module")
def big(compile_c) -> Path:  # noqa: ANN001
    return compile_c("mcp_big.c")


@pytest.fixture(scope="module")
def http_server(sample: Path, big: Path, mhome: Path) -> Iterator[str]:
    proc, base = start_http_server(mhome, [sample, big], "--max-concurrent", "1")
    yield base
    stop(proc)


def stdio_params(home: Path, *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "binlens", "mcp", *args], env=env_for(home), cwd=str(ROOT)
    )


def _payload(result: Any) -> Any:
    """structuredContent, checked against the text content (the same JSON)."""
    assert result.content and result.content[0].type == "text"
    text = json.loads(result.content[0].text)
    assert text == result.structured_content
    return result.structured_content


async def _program_handles(client: Client) -> dict[str, str]:
    res = await client.call_tool("binlens_program", {"operation": "list"})
    return {p["file_name"]: p["program"] for p in _payload(res)["items"]}


async def acceptance(client: Client, sample: Path) -> None:
    """The acceptance script every transport runs."""
    tools = await client.list_tools()
    names = {t.name for t in tools.tools}
    # Claude Desktop, claude.ai and Claude Code drop a whole server when one name fails this
    prompts = await client.list_prompts()
    generated = names | {p.name for p in prompts.prompts}
    assert generated and all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", n) for n in generated), sorted(generated)
    assert {"binlens_help", "binlens_symbol", "binlens_program", "binlens_memory"} <= names
    addr_tool = next(t for t in tools.tools if t.name == "binlens_address")  # address.resolve only
    assert addr_tool.annotations is not None and addr_tool.annotations.read_only_hint is True
    sym_tool = next(t for t in tools.tools if t.name == "binlens_symbol")
    assert sym_tool.annotations.read_only_hint is False  # symbol.patch renames
    assert sym_tool.annotations.destructive_hint is False
    comment_tool = next(t for t in tools.tools if t.name == "binlens_comment")
    assert comment_tool.annotations.destructive_hint is True  # comment.delete
    assert sym_tool.input_schema["required"] == ["operation"]
    prog_tool = next(t for t in tools.tools if t.name == "binlens_program")
    assert prog_tool.annotations.read_only_hint is False  # program.open/close are lifecycle

    with warnings.catch_warnings():  # the SDK warns that 2026-07-28 removed ping; binlens still answers it
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        await client.send_ping()

    # help navigation: domains -> operations -> one operation's schemas
    top = _payload(await client.call_tool("binlens_help", {}))
    assert "symbol" in {d["domain"] for d in top["tools"]}
    dom = _payload(await client.call_tool("binlens_help", {"domain": "symbol"}))
    assert "list" in {o["operation"] for o in dom["operations"]}
    for full in ("binlens_symbol", "binlens.symbol"):  # the domain as its tool's name, either separator
        assert _payload(await client.call_tool("binlens_help", {"domain": full}))["operations"] == dom["operations"]
    one = _payload(await client.call_tool("binlens_help", {"domain": "symbol", "operation": "list"}))
    assert one["name"] == "symbol.list" and one["effect"] == "read-only"
    assert one["input_schema"]["type"] == "object" and "output_schema" in one

    handles = await _program_handles(client)
    prog = handles[sample.name]
    res = await client.call_tool(
        "binlens_symbol", {"operation": "list", "params": {"program": prog, "name": "add_numbers"}}
    )
    assert res.is_error is False
    items = _payload(res)["items"]
    assert any(s["name"] == "add_numbers" and s["address"].startswith("0x") for s in items)
    identity = (res.meta or {}).get("io.binlens/program")
    assert identity is not None and identity["program"] == prog and identity["file_name"] == sample.name

    # a method failure is a tool result with isError and the error object
    bad = await client.call_tool(
        "binlens_symbol", {"operation": "get", "params": {"program": prog, "selector": {"name": "no_such_symbol"}}}
    )
    assert bad.is_error is True
    err = _payload(bad)["error"]
    assert err["code"] == "not_found" and err["target"].startswith("/params/selector")

    # resources: the catalog
    resources = await client.list_resources()
    uris = {str(r.uri) for r in resources.resources}
    assert "binlens://contracts/methods" in uris
    cat = await client.read_resource("binlens://contracts/methods")
    assert "symbol.list" in {m["name"] for m in json.loads(cat.contents[0].text)["methods"]}


async def long_call_progress(client: Client, handle: str) -> None:
    """A long memory.search reports progress and completes."""
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    args = {
        "operation": "search",
        "params": {"program": handle, "pattern": "fe fd fc fb", "scan": {"timeout_ms": 60000}},
    }
    res = await client.call_tool("binlens_memory", args, progress_callback=on_progress)
    assert res.is_error is False, res.structured_content
    assert _payload(res)["scan"]["complete"] is True
    assert seen, "no progress notification arrived"
    assert seen[-1][1] and seen[-1][1] > 32 << 20  # total = bytes to search


async def long_call_cancel(client: Client, handle: str) -> None:
    """Cancelling a long call frees its slot early (the server runs with --max-concurrent 1).

    Uncancelled, the search takes ~9 s (more on a loaded machine); cancelled, it stops at its next
    per-MiB check, so a new call gets a slot within a few seconds of the cancel.
    """
    first = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        first.set()

    args = {"operation": "search", "params": {"program": handle, "regex": SLOW_REGEX, "scan": {"timeout_ms": 60000}}}
    quick = {"operation": "search", "params": {"program": handle, "pattern": "7f 45 4c 46"}}
    started = time.monotonic()
    with anyio.move_on_after(30) as scope:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await client.call_tool("binlens_memory", args, progress_callback=on_progress)
                pytest.fail("the cancelled call returned a result")

            tg.start_soon(call)
            await first.wait()
            # beyond --max-concurrent: `busy` at once, no queue
            busy = await client.call_tool("binlens_memory", quick)
            assert busy.is_error and _payload(busy)["error"]["code"] == "busy"
            assert _payload(busy)["error"]["details"]["max_concurrent"] == 1
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught, "no progress within 30 s"
    cancelled_at = time.monotonic()
    # The server stays responsive, and the cancelled search stops at its next progress check:
    # a new long call is accepted (not `busy`) well before the full search could have finished.
    deadline = time.monotonic() + 30
    while True:
        res = await client.call_tool("binlens_memory", quick)
        data = _payload(res)
        if not res.is_error:
            break
        assert data["error"]["code"] == "busy"
        assert time.monotonic() < deadline, "the cancelled call kept its slot"
        await anyio.sleep(0.1)
    assert time.monotonic() - cancelled_at < 4, "the slot was freed only when the search ended"
    assert cancelled_at - started < 15


# --- stdio --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_stdio_official_client(sample: Path, big: Path, mhome: Path, mode: str) -> None:
    async def main() -> None:
        params = stdio_params(mhome, str(sample), str(big), "--max-concurrent", "1")
        async with Client(params, mode=mode) as client:
            if mode == "legacy":
                assert client.protocol_version == "2025-11-25"
            await acceptance(client, sample)
            target = (await _program_handles(client))[big.name]
            await long_call_progress(client, target)
            await long_call_cancel(client, target)

    anyio.run(main)


def test_stdio_auto_mode_discovers_2026(sample: Path, mhome: Path) -> None:
    async def main() -> None:
        async with Client(stdio_params(mhome, str(sample)), mode="auto") as client:
            assert client.protocol_version == "2026-07-28"
            assert client.server_capabilities.tools is not None

    anyio.run(main)


# --- Streamable HTTP ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy", "auto"])
def test_http_official_client(http_server: str, sample: Path, big: Path, mode: str) -> None:
    async def main() -> None:
        async with Client(http_server + "/mcp", mode=mode) as client:
            expected = "2025-11-25" if mode == "legacy" else "2026-07-28"
            assert client.protocol_version == expected
            await acceptance(client, sample)
            if mode != "auto":
                target = (await _program_handles(client))[big.name]
                await long_call_progress(client, target)
                await long_call_cancel(client, target)

    anyio.run(main)


def test_legacy_sse_official_client(http_server: str, sample: Path, big: Path) -> None:
    async def main() -> None:
        async with Client(sse_client(http_server + "/sse"), mode="legacy") as client:
            await acceptance(client, sample)
            target = (await _program_handles(client))[big.name]
            await long_call_progress(client, target)
            await long_call_cancel(client, target)

    anyio.run(main)
