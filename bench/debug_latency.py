"""Debugger latency: p50/p95 of a step, a register read and a 4 KiB memory read, and the delay from a
stop to the pushed event at the client, over WebSocket and stdio MCP, beside raw GDB/MI round trips
in the same run.

The target is tests/fixtures/src/debuggee.c (looping: argument 0), compiled here as a stripped PIE
and stopped in its `work` function. Cases, taking turns so that they share the machine's load:
  - raw: gdb --interpreter=mi3 driven directly (a line out, read until its result; a step waits
    for its *stopped record);
  - ws: `binlens serve FILE --allow-debug`, JSON-RPC over /ws (debug.next {wait_ms}, register.get,
    debug_memory.read);
  - stdio: `binlens mcp FILE --allow-debug`, tools/call over stdin/stdout;
  - in-process: the same methods called in this process (`binlens.api.invoke`): binlens's own cost
    without a transport.
A no-op row (raw: `-gdb-set confirm off`; binlens: `program.list`, 0.03 ms in-process) measures
each transport's round trip alone.
Stop → event: the pushed `{prefix}.debug.event` notification of each step, received at the client,
minus the event's `time` (taken by the server's reader thread when gdb's *stopped record arrived;
one machine, one clock).

Usage: python bench/debug_latency.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests" / "fixtures" / "src" / "debuggee.c"
READY_RE = re.compile(r"ready.*?ws://([0-9.]+):(\d+)/ws")


def build(work: Path) -> tuple[Path, int]:
    """The stripped PIE and its `work` function's static address."""
    full, stripped = work / "debuggee", work / "debuggee-stripped"
    subprocess.run(["cc", "-O1", "-fPIE", "-pie", "-o", str(full), str(SRC)], check=True)
    subprocess.run(["strip", "-s", "-o", str(stripped), str(full)], check=True)
    nm = subprocess.run(["nm", str(full)], check=True, capture_output=True, text=True).stdout
    return stripped, next(int(line.split()[0], 16) for line in nm.splitlines() if line.endswith(" work"))


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, in milliseconds."""
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- raw GDB/MI -----------------------------------------------------------------------------------


class RawGdb:
    """gdb over MI, one command at a time, read synchronously."""

    def __init__(self, path: Path, work: int) -> None:
        self.proc = subprocess.Popen(
            ["gdb", "-nx", "-q", "--interpreter=mi3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.token = 0
        for cmd in ("-gdb-set mi-async on", f"-file-exec-and-symbols {path}", "-exec-arguments 0 > /dev/null"):
            self.cmd(cmd)
        self.cmd('-interpreter-exec console "starti"', stop=True)
        base = self.base()
        self.cmd(f"-break-insert *{hex(base + work)}")
        self.cmd("-exec-continue", stop=True)
        self.cmd("-break-delete 1")

    def base(self) -> int:
        pid = next(line for line in self.cmd("-list-thread-groups", keep=True) if line.startswith(f"{self.token}^done"))
        pid_n = int(re.search(r'pid="(\d+)"', pid).group(1))  # type: ignore[union-attr]
        exe = os.stat(f"/proc/{pid_n}/exe")
        for line in Path(f"/proc/{pid_n}/maps").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and int(parts[4]) == exe.st_ino:
                return int(parts[0].split("-")[0], 16) - int(parts[2], 16)
        raise RuntimeError("the program is not mapped")

    def cmd(self, text: str, stop: bool = False, keep: bool = False) -> list[str]:
        """Send a command, read until its result (and the *stopped record when `stop`)."""
        assert self.proc.stdin and self.proc.stdout
        self.token += 1
        self.proc.stdin.write(f"{self.token}{text}\n")
        self.proc.stdin.flush()
        seen, done, stopped = [], False, not stop
        while not (done and stopped):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("gdb exited")
            if keep:
                seen.append(line)
            if line.startswith(f"{self.token}^"):
                done = True
            elif line.startswith("*stopped"):
                stopped = True
        return seen

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def raw_ops(g: RawGdb, registers: list[str]) -> dict[str, Any]:
    """The raw operations; `registers`: the names binlens's default register.get reads."""
    listed = next(line for line in g.cmd("-data-list-register-names", keep=True) if "^done" in line)
    names = re.findall(r'"([^"]*)"', listed.split("register-names=", 1)[1])
    numbers = " ".join(str(names.index(n)) for n in registers)
    return {
        "step": lambda: g.cmd("-exec-next-instruction", stop=True),
        "registers": lambda: g.cmd(f"-data-list-register-values x {numbers}"),
        "memory 4 KiB": lambda: g.cmd("-data-read-memory-bytes $sp-4096 4096"),
        "no-op": lambda: g.cmd("-gdb-set confirm off"),
    }


# --- binlens over /ws and stdio -------------------------------------------------------------------


class WsClient:
    """`binlens serve FILE --allow-debug` and one /ws connection (sync wrappers over one loop)."""

    def __init__(self, path: Path, home: Path) -> None:
        from websockets.asyncio.client import connect

        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BINLENS_HOME": str(home)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "binlens", "serve", str(path), "--allow-debug", "--port", "0"],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.proc.stderr
        for line in self.proc.stderr:
            m = READY_RE.search(line)
            if m:
                url = f"ws://{m.group(1)}:{m.group(2)}/ws"
                break
        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(connect(url, max_size=None))
        self.loop.run_until_complete(self.conn.recv())
        self.id = 0
        self.lags: list[float] = []

    def call(self, method: str, params: dict[str, Any]) -> Any:
        return self.loop.run_until_complete(self._call(method, params))

    async def _call(self, method: str, params: dict[str, Any]) -> Any:
        self.id += 1
        await self.conn.send(json.dumps({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params}))
        while True:
            frame = json.loads(await self.conn.recv())
            if frame.get("method", "").endswith(".debug.event"):
                self.lags.append(time.time() - frame["params"]["time"])
            elif frame.get("id") == self.id:
                if "error" in frame:
                    raise RuntimeError(frame["error"])
                return frame["result"]

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.proc.terminate()
        self.proc.wait(15)


class InProcess:
    """The methods called in this process, on a workspace of its own (no transport)."""

    def __init__(self, path: Path, home: Path) -> None:
        sys.path.insert(0, str(ROOT / "src"))
        from binlens.api import invoke
        from binlens.workspace import Config, Workspace

        self.ws = Workspace(Config(home=home, permissions=frozenset({"debug"})))
        self.ws.open(path)
        self.invoke = invoke
        self.lags: list[float] = []

    def call(self, method: str, params: dict[str, Any]) -> Any:
        return self.invoke(self.ws, method, params)

    def close(self) -> None:
        for handle in list(self.ws.programs):
            self.ws.close(handle)


class StdioClient:
    """`binlens mcp FILE --allow-debug` over pipes."""

    def __init__(self, path: Path, home: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BINLENS_HOME": str(home)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "binlens", "mcp", str(path), "--allow-debug"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.id = 0
        self.lags: list[float] = []
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
        self._send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
        self._answer(0)

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def _answer(self, rid: int) -> Any:
        assert self.proc.stdout
        while True:
            frame = json.loads(self.proc.stdout.readline())
            if frame.get("method", "").endswith(".debug.event"):
                self.lags.append(time.time() - frame["params"]["time"])
            elif frame.get("id") == rid:
                return frame["result"]

    def call(self, method: str, params: dict[str, Any]) -> Any:
        domain, _, operation = method.partition(".")
        self.id += 1
        args = {"operation": operation, "params": params}
        call = {"name": f"binlens_{domain}", "arguments": args}
        self._send({"jsonrpc": "2.0", "id": self.id, "method": "tools/call", "params": call})
        result = self._answer(self.id)
        if result.get("isError"):
            raise RuntimeError(result)
        return result["structuredContent"]

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait(15)


def binlens_ops(client: Any, work: int) -> dict[str, Any]:
    """Stop the target in `work` and return the timed operations."""
    d = client.call("debug.start", {"args": ["0"], "timeout_ms": 60000})["debug_id"]
    bp = client.call("breakpoint.create", {"debug_id": d, "selector": {"address": hex(work)}})
    client.call("debug.continue", {"debug_id": d, "wait_ms": 30000})
    client.call("breakpoint.delete", {"debug_id": d, "id": bp["id"]})
    rsp = next(r["value"] for r in client.call("register.get", {"debug_id": d, "names": ["rsp"]})["registers"])
    below = hex(int(rsp, 16) - 4096)  # (the stack's top page may end right above rsp)
    client.lags.clear()
    return {
        "step": lambda: client.call("debug.next", {"debug_id": d, "wait_ms": 10000}),
        "registers": lambda: client.call("register.get", {"debug_id": d}),
        "memory 4 KiB": lambda: client.call("debug_memory.read", {"debug_id": d, "address": below, "size": 4096}),
        "no-op": lambda: client.call("program.list", {}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="binlens-debug-bench-") as tmp:
        work_dir = Path(tmp)
        path, work = build(work_dir)
        raw = RawGdb(path, work)
        ws = WsClient(path, work_dir / "home-ws")
        stdio = StdioClient(path, work_dir / "home-stdio")
        local = InProcess(path, work_dir / "home-local")
        ws_ops, stdio_ops, local_ops = binlens_ops(ws, work), binlens_ops(stdio, work), binlens_ops(local, work)
        registers = [r["name"] for r in ws_ops["registers"]()["registers"]]
        cases = {
            "raw GDB/MI": raw_ops(raw, registers),
            "binlens /ws": ws_ops,
            "binlens stdio": stdio_ops,
            "in-process": local_ops,
        }
        times: dict[str, dict[str, list[float]]] = {c: {op: [] for op in ops} for c, ops in cases.items()}
        for _ in range(args.rounds):
            for case, ops in cases.items():
                for op, fn in ops.items():
                    t = time.perf_counter()
                    fn()
                    times[case][op].append(time.perf_counter() - t)
        lags = {"binlens /ws": list(ws.lags), "binlens stdio": list(stdio.lags)}
        raw.close()
        ws.close()
        stdio.close()
        local.close()
        ws.loop.close()
    print(f"# debugger latency, {args.rounds} rounds (ms)\n")
    print("| operation | " + " | ".join(f"{c} p50 | {c} p95" for c in cases) + " | p50 / raw p50 |")
    print("|---|" + "---|---|" * len(cases) + "---|")
    for op in cases["raw GDB/MI"]:
        cells = [f"{pct(times[c][op], 0.5):.2f} | {pct(times[c][op], 0.95):.2f}" for c in cases]
        base = statistics.median(times["raw GDB/MI"][op])
        ratios = " / ".join(f"{statistics.median(times[c][op]) / base:.2f}x" for c in cases if c != "raw GDB/MI")
        print(f"| {op} | " + " | ".join(cells) + f" | {ratios} |")
    print("\n| stop → pushed event at the client | events | p50 | p95 |\n|---|---|---|---|")
    for case, values in lags.items():
        if values:
            print(f"| {case} | {len(values)} | {pct(values, 0.5):.2f} | {pct(values, 0.95):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
