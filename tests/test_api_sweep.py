"""Every read-only method, and the common edits, on corpus files of every format and odd address
ranges: each call answers or fails with a clear error, never `internal`.

A sweep of this kind over the whole corpus (711 files, ~104k calls) found the bugs these files
stand for: negative ARM branch targets (`armeb_hello_static`), MIPS delay-slot chunk splits
(`libc.so.0`), annotation queries past 2**63 (`core.1159`, `ibknoreloc64.exe`). The analysis runs
in-process here (`BINLENS_SERIAL` is irrelevant), one workspace per file.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from binlens.api import REGISTRY, invoke  # noqa: F401 - registers the domains
from binlens.errors import BinlensError
from binlens.workspace import Config, Workspace
from conftest import corpus_dir

FILES = [
    "elf/armeb_hello_static",  # ARM BE8, a branch below address 0
    "elf/libc.so.0",  # MIPS uClibc: delay slots that start chunks
    "elf/analysis/core.1159",  # an x86-64 core file: the vsyscall page at 0xffffffffff600000
    "elf/ip-riscv",
    "pe/ibknoreloc64.exe",  # PE32+ with an image base above 2**63
    "pe/winmain.exe",
    "mach0/hello-macos-arm64-chained",
]


def _calls(fn: dict[str, Any], blocks: list[dict[str, Any]], n: int) -> list[tuple[str, dict[str, Any]]]:
    """The calls made for one function (`n`: its place among the sampled ones, for unique names)."""
    sel = {"address": fn["address"]}
    out: list[tuple[str, dict[str, Any]]] = [
        ("function.get", {"selector": sel}),
        ("function.blocks", {"selector": sel}),
        *[("function.cfg", {"selector": sel, "format": fmt}) for fmt in ("json", "dot", "mermaid")],
        ("listing.get", {"selector": sel}),
        ("function_call.list", {"selector": sel, "direction": "callers"}),
        ("function_call.list", {"selector": sel, "direction": "callees"}),
        ("callgraph.get", {"selector": sel, "depth": 2}),
        ("reference.list", {"address": fn["address"], "direction": "to"}),
        ("reference.list", {"address": fn["address"], "direction": "from"}),
        ("instruction.get", {"selector": sel}),
        ("memory.read", {"address": fn["address"], "length": 16}),
        ("comment.get", {"selector": sel, "kind": "eol"}),
        ("global_variable.get", {"selector": sel}),
        ("symbol.patch", {"selector": sel, "name": f"sweep_{n}"}),
        ("comment.create", {"selector": sel, "kind": "eol", "text": "swept"}),
        ("bookmark.create", {"selector": sel, "category": "sweep"}),
        ("memory.write", {"address": fn["address"], "data": "00"}),
        ("listing.get", {"selector": sel}),
        ("memory.read", {"address": fn["address"], "length": 16}),
    ]
    if len(blocks) > 1:
        out += [("function.create", {"selector": {"address": blocks[1]["start"]}}), ("journal.undo", {})]
    return out


@pytest.mark.parametrize("name", FILES)
def test_no_call_ends_in_an_internal_error(name: str, tmp_path: Path) -> None:
    path = corpus_dir() / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    ws = Workspace(Config(home=tmp_path))
    ws.open(path, check_roots=False)
    failures: list[str] = []

    def call(method: str, params: dict[str, Any]) -> Any:
        try:
            return invoke(ws, method, params)
        except BinlensError as err:
            if err.code == "internal":
                failures.append(f"{method} {params}: {err.message}")
            return None

    assert call("analysis.start", {"wait": True, "timeout_ms": 60000}) is not None, failures
    fns = (call("function.list", {"page": {"limit": 1000}}) or {"items": []})["items"]
    assert fns
    for n, fn in enumerate(random.Random(name).sample(fns, min(6, len(fns)))):
        blocks = (call("function.blocks", {"selector": {"address": fn["address"]}}) or {"items": []})["items"]
        for method, params in _calls(fn, blocks, n):
            call(method, params)
    for method in ("string.list", "instruction.list", "symbol.list", "comment.list", "bookmark.list"):
        call(method, {"page": {"limit": 200}})
    for method in ("memory_block.list", "address_space.list", "global_variable.list", "annotations.export"):
        call(method, {})
    call("memory.search", {"pattern": "c3"})
    for search in ({"mnemonic": "call"}, {"immediate": "0x10"}, {"immediate": "0x1234"}, {"operands_regex": "r[0-9]"}):
        call("instruction.search", {**search, "page": {"limit": 200}})
    call("instruction.search", {"references": fns[0]["address"]})
    starts = [int(f["address"], 16) for f in fns[:8]]
    call("address.symbolize", {"addresses": [a + 1 for a in starts] + [0, (1 << 64) - 1], "base": "0x10000"})
    call("address.symbolize", {"addresses": [a + 1 for a in starts], "return_addresses": True})
    assert not failures, failures
