"""The response budget as REA sets it (issue 26 item 4): `--max-response-bytes` /
`$BINLENS_MAX_RESPONSE_BYTES`, measured on the whole frame (an MCP tool result carries its JSON
twice, as text and as structured content, plus the envelope), the same `response_too_large` with
the limit over stdio, HTTP and WebSocket, `details.evidence_reference` when evidence.record
retained the result, and a default that lets a 9 MiB result through stdio to the official client."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_support import ROOT
from serve_support import ServerProcess, ws_call
from serve_support import env_for as serve_env
from test_mcp_http import handshake, post
from test_response_budget import INIT, StdioServer

pytestmark = pytest.mark.timeout(240)

BUDGET = 65536
# memory.read of N bytes answers N*2 hex digits: 20,000 bytes is a ~40 KB result, so a ~40 KB
# WebSocket frame but an ~80 KB MCP tool result (text + structured content)
BETWEEN = {"address": "big_data", "length": 20000}
OVER = {"address": "big_data", "length": 40000}


@pytest.fixture(scope="module")
def big(compile_c) -> Path:  # noqa: ANN001
    return compile_c("mcp_big.c")


def _sse_or_json(r: httpx.Response) -> dict[str, Any]:
    if r.headers.get("content-type", "").startswith("application/json"):
        return r.json()
    data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
    return json.loads(data[-1])


def _too_large(err: dict[str, Any]) -> None:
    assert (err["code"], err["status"]) == ("response_too_large", 413), err
    assert err["details"]["limit"] == BUDGET and err["details"]["size_at_least"] > BUDGET


def test_the_budget_counts_the_whole_frame_over_stdio_http_and_websocket(tmp_path: Path, big: Path) -> None:
    """One budget, three transports: a result whose MCP frame passes it is refused over stdio and
    HTTP while its smaller WebSocket frame goes through; a bigger one is refused over WebSocket."""
    stdio = StdioServer(tmp_path / "home", str(big), env={"BINLENS_MAX_RESPONSE_BYTES": "64K"})
    try:
        stdio.request("initialize", INIT)
        refused = stdio.tool("binlens_memory", "read", BETWEEN)
        assert refused["isError"] is True
        _too_large(refused["structuredContent"]["error"])
        small = stdio.tool("binlens_memory", "read", {"address": "big_data", "length": 8000})
        assert small["isError"] is False and len(small["structuredContent"]["data"]) == 16000
        limits = stdio.tool("binlens_session", "get", {})["structuredContent"]["limits"]
        assert limits["max_response_bytes"] == BUDGET
    finally:
        assert stdio.close() == 0

    with ServerProcess(tmp_path / "home2", str(big), "--max-response-bytes", "65536") as srv:
        call = {"name": "binlens_memory", "arguments": {"operation": "read", "params": BETWEEN}}
        body, headers = handshake("tools/call", call)
        reply = _sse_or_json(post(srv.base, body, headers))
        assert reply["result"]["isError"] is True
        _too_large(reply["result"]["structuredContent"]["error"])
        through = ws_call(srv.ws_url, "memory.read", BETWEEN)
        assert len(through["result"]["data"]) == 40000
        over = ws_call(srv.ws_url, "memory.read", OVER)
        assert over["error"]["data"]["code"] == "response_too_large"
        _too_large(over["error"]["data"])


def test_a_retained_result_over_the_budget_names_its_evidence(tmp_path: Path, big: Path) -> None:
    """evidence.record of a result over the budget keeps it and answers `response_too_large` with
    `details.evidence_reference`; evidence.export writes it to a file the agent can read."""
    home = tmp_path / "home"
    with ServerProcess(home, str(big), "--max-response-bytes", "64K", env=serve_env(home)) as srv:
        reply = ws_call(srv.ws_url, "evidence.record", {"method": "memory.read", "params": OVER})
        err = reply["error"]["data"]
        _too_large(err)
        ref = err["details"]["evidence_reference"]
        assert ref["ledger"] == "default" and ref["evidence_id"].startswith("ev_")
        listed = ws_call(srv.ws_url, "evidence.list", {})["result"]
        assert [i["evidence_id"] for i in listed["items"]] == [ref["evidence_id"]]
        out = ws_call(srv.ws_url, "evidence.export", {"path": "big.json"})["result"]
    bundle = json.loads(Path(out["path"]).read_bytes())
    assert bundle["items"][0]["evidence_id"] == ref["evidence_id"]
    assert len(bundle["items"][0]["record"]["result"]["data"]) == 80000


def test_the_default_lets_a_9_mib_result_through_stdio_to_the_official_client(tmp_path: Path, big: Path) -> None:
    """72 reads of 64 KiB in one batch: a ~9.4 MiB result, a ~19 MiB MCP frame, under the default."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "binlens", "mcp", str(big)], env=serve_env(tmp_path / "home"),
        cwd=str(ROOT),
    )  # fmt: skip
    items = [
        {"method": "memory.read", "params": {"address": f"big_data+{hex(i << 16)}", "length": 65536}} for i in range(72)
    ]

    async def main() -> None:
        async with Client(params, mode="legacy") as client:
            res = await client.call_tool("binlens_batch", {"operation": "execute", "params": {"items": items}})
            assert not res.is_error, res.content[0].text[:500]
            text = res.content[0].text
            assert len(text) > 9 << 20
            got = json.loads(text)
            assert len(got["items"]) == 72 and len(got["items"][71]["result"]["data"]) == 131072

    anyio.run(main)
