"""MCP load: N concurrent official-SDK clients x T seconds of mixed calls against `binlens serve`.

Each client (2026-07-28 over Streamable HTTP by default; `--mode legacy` for the handshake era)
loops over a mix: tools/list, help navigation, program.get, symbol.list (paged), memory.read,
memory.search (long-running: takes a work slot), a method error (expected `isError`), the catalog
resource. Pass criteria: zero protocol errors (JSON-RPC errors or transport failures), every tool
result well formed, and `busy` only when more calls run than `--max-concurrent` allows.

Usage: python bench/mcp_load.py [--clients 8] [--seconds 30] [--max-concurrent 8] [--binary FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mcp import Client

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MIX: list[tuple[str, str, dict[str, Any] | None]] = [
    ("tools/list", "", None),
    ("call", "binlens_help", {}),
    ("call", "binlens_help", {"domain": "symbol"}),
    ("call", "binlens_program", {"operation": "get"}),
    ("call", "binlens_symbol", {"operation": "list", "params": {"page": {"limit": 50}}}),
    ("call", "binlens_memory", {"operation": "read", "params": {"address": "main", "length": 64}}),
    ("call", "binlens_memory", {"operation": "search", "params": {"pattern": "48 89 ?? ??"}}),
    ("error", "binlens_symbol", {"operation": "get", "params": {"selector": {"name": "no_such_symbol"}}}),
    ("resource", "binlens://contracts/methods", None),
]


async def client_loop(url: str, mode: str, stop: float, stats: collections.Counter[str], lat: list[float]) -> None:
    """One client: the mix, round after round, until `stop`."""
    async with Client(url, mode=mode, cache=None) as client:  # every call reaches the server
        i = 0
        while time.monotonic() < stop:
            kind, name, args = MIX[i % len(MIX)]
            i += 1
            t0 = time.perf_counter()
            try:
                if kind == "tools/list":
                    res = await client.list_tools()
                    assert any(t.name == "binlens_help" for t in res.tools)
                elif kind == "resource":
                    r = await client.read_resource(name)
                    assert json.loads(r.contents[0].text)["methods"]
                else:
                    res = await client.call_tool(name, args)
                    data = res.structured_content
                    assert json.loads(res.content[0].text) == data
                    if res.is_error:
                        code = data["error"]["code"]
                        if kind == "error" and code == "not_found":
                            stats["expected_method_errors"] += 1
                        else:
                            stats[f"tool_error_{code}"] += 1
            except Exception as err:  # noqa: BLE001 - counted and reported: any of these fails the run
                stats["protocol_errors"] += 1
                stats[f"protocol_error_{type(err).__name__}"] += 1
                continue
            lat.append(time.perf_counter() - t0)
            stats["ok_calls"] += 1


async def run(url: str, clients: int, seconds: float, mode: str) -> tuple[collections.Counter[str], list[float]]:
    """All clients at once."""
    stats: collections.Counter[str] = collections.Counter()
    lat: list[float] = []
    stop = time.monotonic() + seconds
    await asyncio.gather(*(client_loop(url, mode, stop, stats, lat) for _ in range(clients)))
    return stats, lat


def main() -> int:
    """Start the server, run the load, print a Markdown row and JSON; exit 1 on any protocol error."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--max-concurrent", type=int, default=8)
    ap.add_argument("--mode", default="2026-07-28", help="2026-07-28 (default) or legacy")
    ap.add_argument("--binary", type=Path, default=ROOT / "build" / "sample")
    args = ap.parse_args()
    if not args.binary.exists():
        subprocess.run(["make", "-s", "build/sample"], cwd=ROOT, check=True)
    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), BINLENS_HOME=home)
        cmd = [sys.executable, "-m", "binlens", "serve", str(args.binary), "--port", str(port)]
        cmd += ["--max-concurrent", str(args.max_concurrent)]
        server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError("server did not start") from None
                    time.sleep(0.2)
            t0 = time.monotonic()
            stats, lat = asyncio.run(run(f"http://127.0.0.1:{port}/mcp", args.clients, args.seconds, args.mode))
            elapsed = time.monotonic() - t0
        finally:
            server.terminate()
            server.wait(10)
    lat.sort()
    total = stats["ok_calls"]
    busy = stats["tool_error_busy"]
    report = {
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "mode": args.mode,
        "max_concurrent": args.max_concurrent,
        "calls": total,
        "calls_per_s": round(total / elapsed, 1),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
        "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 2) if lat else None,
        "protocol_errors": stats["protocol_errors"],
        "busy": busy,
        "counters": dict(stats),
    }
    print("| mode | --max-concurrent | calls | calls/s | p50 ms | p99 ms | protocol errors | busy |")
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.mode} | {args.max_concurrent} | {total} | {report['calls_per_s']} | {report['p50_ms']} "
        f"| {report['p99_ms']} | {report['protocol_errors']} | {busy} |"
    )
    print(json.dumps(report))
    bad = stats["protocol_errors"] or any(k.startswith("tool_error_") and k != "tool_error_busy" for k in stats)
    if args.clients <= args.max_concurrent and busy:
        print("FAIL: busy although no more calls ran than the limit", file=sys.stderr)
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
