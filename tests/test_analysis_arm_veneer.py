"""A branch the linker moved to a Cortex-A8 erratum veneer stays inside its function.

`tests/fixtures/src/a8_veneer.c` has a Thumb-2 function, `straddle`, whose 32-bit `beq.w` straddles
a 4 KiB page boundary; linked with `--fix-cortex-a8`, that branch becomes a `b.w` to a veneer after
the next functions (`beq.n 1f; b.w next; 1: b.w target`), which branches back. Stripped of its
symbols and unwind tables, the veneer's targets must not be taken for tail-called functions (each
split the function: SQLite's `resolveExprStep` fell into 25 parts), and the veneer is a block of
`straddle`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "a8_veneer.c"
TRIPLE = "arm-linux-gnueabihf"


@pytest.fixture(scope="module")
def veneer_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    flags = ["-O2", "-mthumb", "-Wl,--fix-cortex-a8"]
    return xb.gcc_linked(tmp_path_factory.mktemp("veneer"), TRIPLE, SRC, "veneer", flags, (".ARM.exidx", ".ARM.extab"))


def test_veneer_is_a_block_of_its_function(veneer_build: tuple[Path, Path]) -> None:
    exe, stripped = veneer_build
    symbols = {s.name: (s.address & ~1, s.size) for s in parse_path(str(exe)).symbols if s.kind == "function"}
    start, size = symbols["straddle"]
    text = subprocess.run([f"{TRIPLE}-objdump", "-d", str(exe)], capture_output=True, text=True).stdout
    # the build shows the case: the branch at the page's last halfword now goes to a veneer outside
    moved = re.search(r"^\s+([0-9a-f]*ffe):\s+[0-9a-f]{4} [0-9a-f]{4}\s+b\.w\s+([0-9a-f]+)", text, re.M)
    assert moved, "the linker left the straddling branch in place"
    veneer = int(moved.group(2), 16)
    assert not start <= veneer < start + size
    functions = {f.address: f for f in analyze(parse_path(str(stripped))).functions}
    assert {symbols[n][0] for n in ("straddle", "after_straddle", "use", "main")} <= set(functions)
    inside = [hex(a) for a in functions if start < a < start + size or a == veneer]
    assert not inside, f"starts inside straddle or at its veneer: {inside}"
    assert veneer in {b.start for b in functions[start].blocks}
    assert functions[start].size == size  # the run of its blocks, across the page-aligned padding
