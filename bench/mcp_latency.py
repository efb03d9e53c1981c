"""MCP latency: p50/p99 and requests/s of a cached call over Streamable HTTP, binlens vs a minimal SDK server.

Both servers run as real processes on 127.0.0.1 and get the same 2026-07-28 requests (per-request
`_meta` envelope and routing headers, JSON responses) from one httpx client:
  - binlens: `binlens serve SAMPLE`, tools/call binlens_program {operation: get} (the image is decoded
    once at open, so the call is served from memory: a "cached" call);
  - baseline: the official SDK's MCPServer with one trivial tool (`echo`), stateless Streamable HTTP.
Sequential latency (one request at a time, the cases taking turns so they share the machine's load)
gives p50/p99; req/s is also measured with 8 concurrent clients per case.

Usage: python bench/mcp_latency.py [--requests 2000] [--binary FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]

BASELINE = """
import sys, uvicorn
from mcp.server.mcpserver import MCPServer
mcp = MCPServer("baseline")

@mcp.tool()
def echo(text: str) -> str:
    '''Return the text.'''
    return text

app = mcp.streamable_http_app(stateless_http=True, json_response=True)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
}


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the server accepts TCP connections on `port`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"port {port} did not come up")


def request(rid: int, tool: str, arguments: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """One 2026-07-28 tools/call body and its headers."""
    body = {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": META},
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }
    return json.dumps(body).encode(), headers


def check(resp: httpx.Response) -> None:
    """Fail loudly on anything but a successful tool result."""
    resp.raise_for_status()
    doc = resp.json()
    if "result" not in doc or doc["result"].get("isError"):
        raise RuntimeError(f"bad response: {str(doc)[:300]}")


def interleaved(cases: dict[str, tuple[str, str, dict[str, Any]]], n: int) -> dict[str, dict[str, float]]:
    """p50/p99 (ms) and req/s of `n` sequential requests per case, the cases taking turns.

    Taking turns request by request means every case sees the same machine load (the machine is
    shared), so the ratio between them is meaningful even when absolute figures drift.
    """
    lat: dict[str, list[float]] = {name: [] for name in cases}
    clients = {name: httpx.Client(timeout=30) for name in cases}
    try:
        for i in range(100):  # warm-up
            for name, (url, tool, arguments) in cases.items():
                body, headers = request(i, tool, arguments)
                check(clients[name].post(url, content=body, headers=headers))
        for i in range(n):
            for name, (url, tool, arguments) in cases.items():
                body, headers = request(i, tool, arguments)
                t0 = time.perf_counter()
                resp = clients[name].post(url, content=body, headers=headers)
                lat[name].append(time.perf_counter() - t0)
                check(resp)
    finally:
        for c in clients.values():
            c.close()
    out = {}
    for name, values in lat.items():
        values.sort()
        out[name] = {
            "p50_ms": statistics.median(values) * 1000,
            "p99_ms": values[int(len(values) * 0.99) - 1] * 1000,
            "req_s": len(values) / sum(values),
        }
    return out


async def concurrent(url: str, tool: str, arguments: dict[str, Any], clients: int, seconds: float) -> float:
    """Requests/s with `clients` concurrent connections for `seconds`."""
    done = 0
    stop = time.monotonic() + seconds

    async def worker(k: int) -> None:
        nonlocal done
        async with httpx.AsyncClient(timeout=30) as client:
            i = 0
            while time.monotonic() < stop:
                body, headers = request(k * 1_000_000 + i, tool, arguments)
                check(await client.post(url, content=body, headers=headers))
                done += 1
                i += 1

    start = time.monotonic()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    return done / (time.monotonic() - start)


def main() -> int:
    """Run both servers, measure, print a Markdown table and the JSON figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--binary", type=Path, default=ROOT / "build" / "sample")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of the concurrent run")
    args = ap.parse_args()
    if not args.binary.exists():
        subprocess.run(["make", "-s", "build/sample"], cwd=ROOT, check=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    with tempfile.TemporaryDirectory() as home:
        env["BINLENS_HOME"] = home
        p1, p2 = free_port(), free_port()
        binlens = subprocess.Popen(
            [sys.executable, "-m", "binlens", "serve", str(args.binary), "--port", str(p1), "--max-concurrent", "8"],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        baseline = subprocess.Popen(
            [sys.executable, "-c", BASELINE, str(p2)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_ready(p1, binlens)
            wait_ready(p2, baseline)
            cases = {
                "binlens program.get": (f"http://127.0.0.1:{p1}/mcp", "binlens_program", {"operation": "get"}),
                "binlens program.list": (f"http://127.0.0.1:{p1}/mcp", "binlens_program", {"operation": "list"}),
                "SDK baseline echo": (f"http://127.0.0.1:{p2}/mcp", "echo", {"text": "hello"}),
            }
            results = interleaved(cases, args.requests)
            for name, (url, tool, arguments) in cases.items():
                results[name]["req_s_8_clients"] = asyncio.run(concurrent(url, tool, arguments, 8, args.seconds))
        finally:
            for proc in (binlens, baseline):
                proc.terminate()
                proc.wait(10)
    print("| server | p50 ms | p99 ms | req/s (sequential) | req/s (8 clients) |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['req_s']:.0f} | {r['req_s_8_clients']:.0f} |")
    base = results["SDK baseline echo"]["p50_ms"]
    ratios = {name: r["p50_ms"] / base for name, r in results.items() if name.startswith("binlens")}
    print()
    for name, ratio in ratios.items():
        print(f"{name} p50 / baseline p50 = {ratio:.2f} (target <= 1.5)")
    print(json.dumps({"results": results, "p50_ratios": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
