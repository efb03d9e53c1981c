"""The response budget is counted before a huge result is serialised (SPEC §2, budgets).

A crafted ELF whose 1,500 symbols share one 1 MiB name makes `symbol.list` with `limit: 1000` a
~2 GB document built from a few MB of references; the server answers `response_too_large` at once
and its peak RSS stays small. Measured on a real `binlens mcp` process over stdio.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from crafted_elf import shared_name_elf
from mcp_support import ROOT, env_for

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "budget", "version": "1"}}
PEAK_LIMIT_KB = 400 * 1024  # the server starts at ~60 MB; serialising the page costs GBs


def _limit_memory() -> None:
    # A safety net for the machine: a server that builds the whole document fails here instead.
    resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


class StdioServer:
    """`binlens mcp FILE` driven one request at a time."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "binlens", "mcp", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**env_for(home), **(env or {})},
            cwd=ROOT,
            preexec_fn=_limit_memory,  # noqa: PLW1509 - no threads in this test process fork path
        )
        self.next_id = 1

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        rid = self.next_id
        self.next_id += 1
        frame = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(frame).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            assert line, "the server exited"
            reply = json.loads(line)
            if reply.get("id") == rid:
                return reply

    def tool(self, name: str, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        args = {"operation": operation, "params": params}
        return self.request("tools/call", {"name": name, "arguments": args})["result"]

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(60)


def test_huge_page_is_refused_before_it_is_built(tmp_path: Path) -> None:
    crafted = shared_name_elf(tmp_path / "shared-name")
    server = StdioServer(tmp_path / "home", str(crafted), env={"BINLENS_MAX_RESPONSE_BYTES": "4M"})
    try:
        server.request("initialize", INIT)
        huge = server.tool("binlens_symbol", "list", {"page": {"limit": 1000}})
        assert huge["isError"] is True
        err = huge["structuredContent"]["error"]
        assert (err["code"], err["status"]) == ("response_too_large", 413), err
        assert err["details"]["limit"] == 4 * 1024 * 1024
        peak = _peak_rss_kb(server.proc.pid)
        small = server.tool("binlens_symbol", "list", {"page": {"limit": 1}})  # one item fits
        assert small["isError"] is False and small["structuredContent"]["next_cursor"]
    finally:
        code = server.close()
    assert code == 0
    assert peak < PEAK_LIMIT_KB, f"server peak RSS {peak // 1024} MB"


def test_listing_stops_building_at_the_budget(tmp_path: Path) -> None:
    """listing.get renders new text per line (names included): it stops once the budget is passed."""
    from crafted_elf import BASE

    crafted = shared_name_elf(tmp_path / "many-names", symbols=10_000, name_bytes=4000)
    server = StdioServer(tmp_path / "home", str(crafted), env={"BINLENS_MAX_RESPONSE_BYTES": "4M"})
    try:
        server.request("initialize", INIT)
        assert server.tool("binlens_function", "list", {"page": {"limit": 1}})["isError"] is False
        before = _peak_rss_kb(server.proc.pid)
        text_start = BASE + 64 + 56  # crafted_elf: the functions follow the ELF and program headers
        span = {"start": hex(text_start), "end": hex(text_start + 2 * 10_000)}
        asked = {"range": span, "max_instructions": 20_000, "max_bytes": 1 << 24}  # over the 4 MiB budget
        listing = server.tool("binlens_listing", "get", asked)
        assert listing["isError"] is True
        assert listing["structuredContent"]["error"]["code"] == "response_too_large"
        # By default a page of 32 KiB: the first 8 lines of 4 KB labels, and where the next page starts
        page = server.tool("binlens_listing", "get", {"range": span})["structuredContent"]
        assert len(page["text"].encode()) <= 32768 and page["next_offset"] == len(page["text"].encode())
        grown = _peak_rss_kb(server.proc.pid) - before
    finally:
        server.close()
    # Building all 10,000 lines (40 MB of labels, twice: lines and text) grew the server ~155 MB.
    assert grown < 60 * 1024, f"listing.get grew the server's peak by {grown // 1024} MB"


def test_size_lower_bound_never_refuses_what_fits(home: Path, compile_c) -> None:  # noqa: ANN001
    from binlens.api.registry import REGISTRY, CallContext, _run, invoke, json_size_at_least
    from binlens.workspace import Config, Workspace

    ws = Workspace(Config(home=home))
    ws.open(compile_c("sample.c"), check_roots=False)
    calls = {"symbol.list": {"page": {"limit": 1000}}, "program.get": {}, "session.get": {}, "function.list": {}}
    for method, params in calls.items():
        exact = len(json.dumps(invoke(ws, method, params), separators=(",", ":")))
        spec = REGISTRY[method]
        built = _run(spec, ws, spec.params_model.model_validate(params), CallContext())
        assert 0 < json_size_at_least(built, 1 << 40) <= exact, method
