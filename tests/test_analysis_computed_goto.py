"""Computed gotos (gcc's labels as values) without unwind information, on every architecture.

`tests/fixtures/src/gotos.c` is a small interpreter, `run`, that dispatches through a table of
label addresses in data (`goto *disptab[*code++ & 15]`, as lua's `luaV_execute`). Cross-compiled
at -O0 as position-independent code, linked with `main` as entry, stripped of symbols and unwind
tables: the labels must not be function starts, but blocks of `run` (the data-pointer heuristic
took each for a function: 83 false starts in lua -O0 on each architecture), and `run`, `helper`
and `main` are still found, and so are `twice` and `thrice`, named only by a table that follows
the dispatch table in data (a mask, not a compare, bounds the dispatch's index: the AArch64
resolver read them as cases). The truth is the table of the unstripped build (its relocations,
else its words).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "gotos.c"
TRIPLES = [
    "aarch64-linux-gnu",
    "mips-linux-gnu",
    "powerpc-linux-gnu",
    "riscv64-linux-gnu",
    "arm-linux-gnueabihf",
    # i386: -O0 keeps the GOT (from `__x86.get_pc_thunk`) in a stack slot and loads it again into
    # another register before the dispatch `jmp [reg + idx*4 + disptab@GOTOFF]` reads the table
    "i686-linux-gnu",
]


def _build(out_dir: Path, triple: str) -> xb.Build:
    cc = xb.toolchain("gcc", triple)
    flags = ["-O0", "-fPIC", *(["-mthumb"] if triple.startswith("arm") else [])]
    link = ("-pie",) if not triple.startswith("mips") else ()
    unwind = (".eh_frame", ".ARM.exidx", ".ARM.extab") if triple.startswith("arm") else (".eh_frame",)
    return xb.cross_build(
        out_dir, triple, cc, flags, f"gotos-{triple}", src=SRC, ld_flags=link, unwind=unwind, thumb_bit=True
    )


gotos_build = xb.build_fixture("gotos", _build)


def _table_labels(b: xb.Build) -> list[int]:
    """The label addresses in `disptab` of the unstripped build: each slot's relative relocation
    addend (RELA), else the word it holds (REL: MIPS, ARM, i386), ARM's Thumb bit cleared."""
    image = parse_path(str(b.exe))
    table = next(s for s in image.symbols if s.name.startswith("disptab"))
    ptr = 8 if image.identity.bits == 64 else 4
    assert table.size == 10 * ptr
    addend = {r.address: r.addend for r in image.relocations}
    order = "little" if image.identity.endian == "little" else "big"
    out = []
    for slot in range(table.address, table.address + table.size, ptr):
        value = addend.get(slot) or int.from_bytes(image.read(slot, ptr), order)
        out.append(value & ~1 if image.identity.arch == "arm" else value)
    return out


# (gcc stores Thumb labels without bit 0 and sets it before `bx`: the ARM resolver reads the table
# as a mask-bounded jump table, before the data-pointer stage could decode a label in the ARM state)
CASES = TRIPLES
IDS = [t.split("-")[0] for t in TRIPLES]


@pytest.mark.parametrize("triple", CASES, ids=IDS)
def test_computed_goto_labels_are_no_function_starts(gotos_build, triple):
    b = gotos_build(triple)
    labels = _table_labels(b)
    found = {f.address for f in analyze(parse_path(str(b.no_eh))).functions}
    assert {b.labels[f] for f in ("run", "helper", "main", "twice", "thrice")} <= found
    as_starts = sorted(hex(va) for va in labels if va in found)
    assert not as_starts, f"labels taken for functions: {as_starts}"


@pytest.mark.parametrize("triple", CASES, ids=IDS)
def test_computed_goto_labels_are_blocks_of_their_function(gotos_build, triple):
    b = gotos_build(triple)
    labels = _table_labels(b)
    found = {f.address: f for f in analyze(parse_path(str(b.no_eh))).functions}
    blocks = {blk.start for blk in found[b.labels["run"]].blocks}
    assert set(labels) <= blocks, sorted(hex(va) for va in set(labels) - blocks)
