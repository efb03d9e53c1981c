"""AArch64 computed gotos and mask-bounded switches: `tests/fixtures/src/dispatch_x86.c` cross-built.

The threaded interpreter's `goto *disptab[op & 15]` is a table of absolute code pointers (`.xword
.Lx`) read by `ldr xT, [xB, xI, lsl #3]; br xT` with an `and` as the only bound (gcc -O0 merges
every dispatch into one shared `br`); clang also compiles `switch (x & 7)` to a relative byte
table bounded by the mask alone. Truth: the table entries in the compiler's assembly, the
labels' addresses from the unstripped build (`as -L`); the engine runs on the build stripped of
symbols and `.eh_frame`, where both functions are reached only through a pointer in data.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "dispatch_x86.c"
TRIPLE = "aarch64-linux-gnu"
_ENTRY = re.compile(r"^\s*\.(?:xword|word|hword|byte)\s+\(?(\.L\w+)")


def _build(out_dir: Path, compiler: str, opt: str) -> xb.Build:
    cc = xb.toolchain(compiler, TRIPLE)
    b = xb.cross_build(out_dir, TRIPLE, cc, [opt, "-fno-asynchronous-unwind-tables"], f"{compiler}{opt}", src=SRC)
    b.tables = [t.cases for t in xb.asm_tables(b.asm, _ENTRY)]  # each table's entries (their labels), in order
    return b


dispatch_build = xb.build_fixture("dispatch_a64", _build)  # dispatch_build(compiler, opt) -> xb.Build


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_computed_goto_and_mask_tables_resolve(dispatch_build, compiler, opt):
    b = dispatch_build(compiler, opt)
    labels, sizes = b.labels, b.sizes
    analysis = analyze(parse_path(str(b.no_eh)))
    by_start = {f.address: f for f in analysis.functions}
    expected: dict[str, set[int]] = {"interpret": set(), "masked": set()}
    for entries in b.tables:
        for label in entries:
            va = labels[label]
            owner = [n for n in expected if labels[n] <= va < labels[n] + sizes[n]]
            assert owner, f"{label} is in neither function"
            expected[owner[0]].add(va)
    assert len(expected["interpret"]) == 16
    if compiler == "clang":
        assert len(expected["masked"]) == 8  # gcc compiles `masked` to a compare tree instead
    for name, want in expected.items():
        f = by_start.get(labels[name])
        assert f is not None, f"{name} was not found"
        got = {e.dst for e in f.edges if e.kind == "jump_table"}
        assert want <= got, (name, sorted(map(hex, want - got)))
        assert not want & set(by_start), f"case labels of {name} taken for functions"
        inside = [a for a in by_start if labels[name] < a < labels[name] + sizes[name]]
        assert not inside, f"false starts inside {name}: {sorted(map(hex, inside))}"


def test_the_builds_exercise_the_shared_br_and_the_mask(dispatch_build):
    """gcc -O0 has one `br` for all 16 dispatches; the -O2 builds bound the index with an `and` only."""
    gcc_o0 = dispatch_build("gcc", "-O0").asm.split("\nmasked:", 1)[0]
    assert len(re.findall(r"\tbr\t", gcc_o0)) == 1
    for compiler in ("gcc", "clang"):
        interp = dispatch_build(compiler, "-O2").asm.split("\ninterpret:", 1)[1].split("\nmasked:", 1)[0]
        assert re.search(r"\tand\t[wx]\d+, [wx]\d+, #?(15|0xf)\n", interp)
        assert not re.search(r"\tcmp\t[wx]\d+, #?(15|0xf)\n", interp)
