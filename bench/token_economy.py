"""Token economy: what a typical investigation over MCP costs an agent, in bytes per response.

Replays, through the official `mcp` client against `binlens mcp BINARY` (stdio, a fresh
BINLENS_HOME): tools/list, help, find a usage string, its references, the function that uses it,
that function's listing, its CFG, its callers, the caller's listing, and a rename. For each step
it prints the bytes of the text block a model reads (`text`) and of the whole tool result on the
wire (`wire`: the text plus `structuredContent`), and for each listing the bytes `objdump -d`
prints for the same function (its instruction lines only). tools/list is counted as the server
writes it (compact JSON, UTF-8); `--tools` adds its bytes per tool.

Usage: python bench/token_economy.py [--binary /usr/bin/ssh] [--string "usage:"] [--json] [--tools]
Default binary: /usr/bin/ssh when present, else a small C program compiled here (needs cc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]

# The fallback program: a usage string used by usage(), called from main's option loop.
PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void __attribute__((noinline, noreturn)) usage(void) {
    fprintf(stderr, "usage: demo [-v] [-o file] [-n count] name ...\n");
    exit(2);
}
static int __attribute__((noinline)) work(const char *name, int n, int verbose) {
    int sum = 0;
    for (int i = 0; i < n; i++) sum += (int)strlen(name) * i;
    if (verbose) printf("%s: %d\n", name, sum);
    return sum;
}
int main(int argc, char **argv) {
    int c, n = 1, verbose = 0;
    const char *out = NULL;
    while ((c = getopt(argc, argv, "vo:n:")) != -1) {
        switch (c) {
        case 'v': verbose++; break;
        case 'o': out = optarg; break;
        case 'n': n = atoi(optarg); break;
        default: usage();
        }
    }
    if (optind >= argc) usage();
    int total = 0;
    for (int i = optind; i < argc; i++) total += work(argv[i], n, verbose);
    if (out) { FILE *f = fopen(out, "w"); if (f) { fprintf(f, "%d\n", total); fclose(f); } }
    return total & 1;
}
"""


def default_binary(work: Path) -> Path:
    """/usr/bin/ssh when present, else the fallback program compiled into `work`."""
    ssh = Path("/usr/bin/ssh")
    if ssh.exists():
        return ssh
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("no /usr/bin/ssh and no C compiler: pass --binary")
    src = work / "demo.c"
    src.write_text(PROGRAM)
    out = work / "demo"
    subprocess.run([cc, "-O2", "-o", str(out), str(src)], check=True)
    return out


def objdump_bytes(binary: Path, start: int, end: int) -> int | None:
    """Bytes of `objdump -d`'s instruction lines for [start, end) (None without objdump)."""
    tool = shutil.which("objdump")
    if tool is None:
        return None
    out = subprocess.run(
        [tool, "-d", f"--start-address={start:#x}", f"--stop-address={end:#x}", str(binary)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    body = [ln for ln in out.splitlines() if ln.startswith(" ") and ":\t" in ln]
    return sum(len(ln) + 1 for ln in body)


def _compact(data: Any) -> bytes:
    """JSON as the server writes it: no spaces, UTF-8."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def tool_cost(tool: dict[str, Any]) -> dict[str, Any]:
    """What one tool of tools/list costs: its operations and the bytes of each part."""
    schema = tool.get("inputSchema", {})
    return {
        "tool": tool["name"],
        "operations": len(schema.get("properties", {}).get("operation", {}).get("enum", [])),
        "description": len(tool.get("description", "").encode()),
        "inputSchema": len(_compact(schema)),
        "annotations": len(_compact(tool.get("annotations", {}))),
        "total": len(_compact(tool)),
    }


class Replay:
    """One investigation over one client: each step's costs in `rows`, tools/list's per tool in `tools`."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.rows: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []

    async def call(self, step: str, tool: str, operation: str, params: dict[str, Any]) -> Any:
        """One tool call, recorded; returns its structured result (raises on a method error)."""
        args = {"operation": operation, "params": params}
        res = await self.client.call_tool(tool, args)
        text = res.content[0].text if res.content else ""
        wire = len(json.dumps(res.model_dump(mode="json", by_alias=True, exclude_none=True), separators=(",", ":")))
        method = f"{tool.split('_', 1)[1]}.{operation}"
        self.rows.append({"step": step, "method": method, "text": len(text.encode()), "wire": wire})
        if res.is_error:
            raise RuntimeError(f"{method} failed: {text}")
        return res.structured_content


async def investigate(binary: Path, needle: str, home: str) -> Replay:
    """The replay itself; returns its rows and tools/list's cost per tool."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), BINLENS_HOME=home, BINLENS_TOOL_SEPARATOR="_")
    params = StdioServerParameters(command=sys.executable, args=["-m", "binlens", "mcp", str(binary)], env=env)
    async with Client(params, mode="2026-07-28") as client:
        r = Replay(client)
        tools = await client.list_tools()
        dumped = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools.tools]
        size = len(_compact(dumped))
        r.rows.append({"step": "list the tools", "method": "tools/list", "text": size, "wire": size})
        r.tools = [tool_cost(t) for t in dumped]
        help_res = await client.call_tool("binlens_help", {})
        size = len(help_res.content[0].text)
        r.rows.append({"step": "list the domains", "method": "help", "text": size, "wire": size})
        found = await r.call("find the usage string", "binlens_string", "list", {"text": needle, "page": {"limit": 5}})
        if not found["items"]:
            raise RuntimeError(f"no string contains {needle!r}")
        string = found["items"][0]["address"]
        refs = await r.call(
            "its references", "binlens_reference", "list", {"address": string, "direction": "to", "page": {"limit": 20}}
        )
        site = refs["items"][0]["from_address"]
        fn = await r.call("the function using it", "binlens_function", "get", {"selector": {"address": site}})
        sel = {"address": fn["address"]}
        listing = await r.call("its listing", "binlens_listing", "get", {"selector": sel})
        r.rows[-1]["objdump"] = objdump_bytes(binary, int(fn["address"], 16), int(fn["end"], 16))
        r.rows[-1]["instructions"] = fn["instructions"]
        r.rows[-1]["pages"] = "whole" if listing["next_offset"] is None else "first page"
        await r.call("its CFG", "binlens_function", "cfg", {"selector": sel})
        callers = await r.call(
            "its callers", "binlens_function_call", "list", {"selector": sel, "direction": "callers"}
        )
        if callers["items"]:
            caller = callers["items"][0]
            at = caller["caller"]
            cfn = await r.call("the caller", "binlens_function", "get", {"selector": {"address": at}})
            csel = {"address": at}
            page = await r.call("the caller's listing", "binlens_listing", "get", {"selector": csel})
            first = r.rows[-1]
            first["instructions"] = cfn["instructions"]
            first["pages"] = "first page" if page["next_offset"] is not None else "whole"
            text, pages, cost = page["text"], 1, dict(first)
            while page["next_offset"] is not None:
                params = {"selector": csel, "offset": page["next_offset"]}
                page = await r.call("(next page)", "binlens_listing", "get", params)
                row = r.rows.pop()
                text += page["text"]
                pages += 1
                cost["text"] += row["text"]
                cost["wire"] += row["wire"]
            if pages > 1:
                cost.update(step="the caller's listing", pages=f"all {pages} pages, not in the total", extra=True)
                r.rows.append(cost)
                whole = await client.call_tool(
                    "binlens_listing", {"operation": "get", "params": {"selector": csel, "max_bytes": 1 << 24}}
                )
                assert whole.structured_content["text"] == text, "the pages differ from one unbounded call"
            r.rows[-1]["objdump"] = objdump_bytes(binary, int(cfn["address"], 16), int(cfn["end"], 16))
        mid = await r.call(
            "a mid-sized function",
            "binlens_function",
            "list",
            {"min_size": 800, "max_size": 1200, "page": {"limit": 1}},
        )
        if mid["items"]:
            m = mid["items"][0]
            mfn = await r.call("its details", "binlens_function", "get", {"selector": {"address": m["address"]}})
            mlist = await r.call("its listing", "binlens_listing", "get", {"selector": {"address": m["address"]}})
            r.rows[-1]["objdump"] = objdump_bytes(binary, int(mfn["address"], 16), int(mfn["end"], 16))
            r.rows[-1]["instructions"] = mfn["instructions"]
            r.rows[-1]["pages"] = "whole" if mlist["next_offset"] is None else "first page"
        await r.call("rename it", "binlens_function", "patch", {"selector": sel, "name": "usage_demo"})
        return r


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    out = [
        "| step | method | text bytes | wire bytes | objdump -d bytes | text / objdump |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        od = row.get("objdump")
        ratio = f"{row['text'] / od:.2f}" if od else ""
        step = row["step"] + (f" ({row['instructions']} insns, {row['pages']})" if "instructions" in row else "")
        out.append(f"| {step} | `{row['method']}` | {row['text']} | {row['wire']} | {od or ''} | {ratio} |")
    total_text = sum(r["text"] for r in rows if not r.get("extra"))
    total_wire = sum(r["wire"] for r in rows if not r.get("extra"))
    out.append(f"| **total** | | **{total_text}** | **{total_wire}** | | |")
    return "\n".join(out)


def tools_table(tools: list[dict[str, Any]]) -> str:
    """tools/list's bytes per tool as a Markdown table, largest first."""
    out = [
        "| tool | operations | description | inputSchema | annotations | total |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for t in sorted(tools, key=lambda t: -t["total"]):
        out.append(
            f"| `{t['tool']}` | {t['operations']} | {t['description']} | {t['inputSchema']} | "
            f"{t['annotations']} | {t['total']} |"
        )
    sums = {k: sum(t[k] for t in tools) for k in ("operations", "description", "inputSchema", "annotations", "total")}
    out.append(
        f"| **{len(tools)} tools** | **{sums['operations']}** | **{sums['description']}** | "
        f"**{sums['inputSchema']}** | **{sums['annotations']}** | **{sums['total']}** |"
    )
    return "\n".join(out)


def main() -> int:
    """Run the replay and print its table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", type=Path, default=None)
    ap.add_argument("--string", default="usage:", help="text of the string to start from (default 'usage:')")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    ap.add_argument("--tools", action="store_true", help="also print tools/list's bytes per tool")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        binary = args.binary or default_binary(Path(work))
        replay = asyncio.run(investigate(binary, args.string, str(Path(work) / "home")))
    if args.json:
        print(json.dumps({"binary": str(binary), "rows": replay.rows, "tools": replay.tools}, indent=1))
    else:
        print(f"binary: {binary} ({binary.stat().st_size} bytes)\n")
        print(table(replay.rows))
        if args.tools:
            print()
            print(tools_table(replay.tools))
    return 0


if __name__ == "__main__":
    sys.exit(main())
