"""x86-64 dispatch shapes: computed gotos, mask-bounded switches, -O0 spills, tables seen as data first.

`tests/fixtures/src/dispatch_x86.c` is compiled to assembly by gcc and clang (-O0, -O2, no PIE,
no unwind tables), assembled with `as -L` (the compilers' local labels `.L29`, `.Ltmp3` stay in
the symbol table) and linked. The truth is read from the assembly (each `.quad .Lx` entry of a
table names its label) and the unstripped build's symbols (the labels' addresses); the engine
runs on the build stripped of its symbols and of `.eh_frame`, where both dispatching functions
are reached only through a pointer in data, so the data-pointer heuristic meets their case
labels before their code.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "dispatch_x86.c"
_QUAD = re.compile(r"^\s*\.quad\s+(\.L\w+)\s*$")


@dataclass
class Build:
    asm: str
    stripped: Path
    labels: dict[str, int]
    sizes: dict[str, int]
    tables: dict[str, list[str]]  # table label -> its entries' labels


def _tables(asm: str) -> dict[str, list[str]]:
    return {t.label: t.cases for t in xb.asm_tables(asm, _QUAD)}


def _build(out_dir: Path, compiler: str, opt: str) -> Build:
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    tag = f"{compiler}{opt}"
    asm_path, obj, exe = out_dir / f"{tag}.s", out_dir / f"{tag}.o", out_dir / tag
    flags = [opt, "-fno-pie", "-fno-asynchronous-unwind-tables", "-S", "-o", str(asm_path), str(SRC)]
    if compiler == "clang":
        flags.insert(0, "-fno-addrsig")  # GNU as does not know clang's address-significance table
    subprocess.run([compiler, *flags], check=True, capture_output=True)
    subprocess.run(["as", "-L", "-o", str(obj), str(asm_path)], check=True, capture_output=True)
    subprocess.run(["gcc", "-no-pie", "-o", str(exe), str(obj)], check=True, capture_output=True)
    stripped = out_dir / f"{tag}.stripped"
    subprocess.run(
        ["objcopy", "--strip-all", "-R", ".eh_frame", "-R", ".eh_frame_hdr", str(exe), str(stripped)],
        check=True,
        capture_output=True,
    )
    symbols = parse_path(str(exe)).symbols
    asm = asm_path.read_text()
    return Build(asm, stripped, {s.name: s.address for s in symbols}, {s.name: s.size for s in symbols}, _tables(asm))


@pytest.fixture(scope="module")
def x86_build(tmp_path_factory: pytest.TempPathFactory):
    """x86_build(compiler, opt) -> Build (cached per module)."""
    out_dir = tmp_path_factory.mktemp("x86jt")
    cache: dict[tuple[str, str], Build] = {}

    def get(compiler: str, opt: str) -> Build:
        if (compiler, opt) not in cache:
            cache[(compiler, opt)] = _build(out_dir, compiler, opt)
        return cache[(compiler, opt)]

    return get


def _owner(b: Build, va: int) -> str:
    for name in ("interpret", "masked", "forward"):
        if b.labels[name] <= va < b.labels[name] + b.sizes[name]:
            return name
    raise AssertionError(f"label at {va:#x} is in neither function")


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_case_labels_are_jump_table_edges_not_functions(x86_build, compiler, opt):
    b = x86_build(compiler, opt)
    analysis = analyze(parse_path(str(b.stripped)))
    by_start = {f.address: f for f in analysis.functions}
    expected: dict[str, set[int]] = {"interpret": set(), "masked": set()}
    for entries in b.tables.values():
        for label in entries:
            va = b.labels[label]
            expected[_owner(b, va)].add(va)
    assert len(expected["interpret"]) == 16 and len(expected["masked"]) == 8
    for name, labels in expected.items():
        f = by_start.get(b.labels[name])
        assert f is not None, f"{name} was not found"
        got = {e.dst for e in f.edges if e.kind == "jump_table"}
        assert labels <= got, (name, sorted(map(hex, labels - got)))
        assert labels <= {blk.start for blk in f.blocks}
        taken = labels & set(by_start)
        assert not taken, f"case labels of {name} taken for functions: {sorted(map(hex, taken))}"


def test_the_builds_exercise_each_dispatch_shape(x86_build):
    """What the test above covers (fails if a compiler changes shape): gcc -O0's one shared
    `jmp reg`, clang -O0's target reloaded from a local, a mask as the only bound at -O2."""
    shapes = set()
    for compiler in ("gcc", "clang"):
        o0 = x86_build(compiler, "-O0").asm.split("\nmasked:", 1)[0]
        o2 = x86_build(compiler, "-O2").asm
        if compiler == "gcc" and len(re.findall(r"\tjmp\t\*%r\w+", o0)) == 1:
            shapes.add("shared jmp reg")
        if compiler == "clang" and re.search(r"movq\t-\d+\(%rbp\), %rax\s*# 8-byte Reload\n\tjmpq\t\*%rax", o0):
            shapes.add("reloaded target")
        masked = o2.split("\nmasked:", 1)[1].split("\n\t.section", 1)[0]
        if re.search(r"andl\t\$7, %e\w+\n(?:.*\n)*?\tjmpq?\t\*\.L", masked) and "cmp" not in masked.split("jmp")[0]:
            shapes.add(f"mask bound {compiler}")
    assert shapes == {"shared jmp reg", "reloaded target", "mask bound gcc", "mask bound clang"}


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_a_pointer_names_a_function_whose_gap_trial_failed(x86_build, compiler):
    """`forward` ends in `jmp rax` (no `ret`): the gap heuristic tries it first and cannot prove it
    an entry; the pointer to it in `entry_points` still makes it a function."""
    b = x86_build(compiler, "-O2")
    body = b.asm.split("\nforward:", 1)[1].split("\t.size", 1)[0]
    assert re.search(r"\tjmpq?\t\*%r\w+", body) and "ret" not in body
    analysis = analyze(parse_path(str(b.stripped)))
    assert b.labels["forward"] in {f.address for f in analysis.functions}


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_an_address_taken_in_code_found_later_names_a_function(x86_build, compiler):
    """`on_event`'s address is taken only in `main`, which is itself found through the address
    `_start` takes: the code-offset heuristic looks again at the code each round discovered."""
    b = x86_build(compiler, "-O2")
    analysis = analyze(parse_path(str(b.stripped)))
    starts = {f.address: f for f in analysis.functions}
    assert b.labels["main"] in starts and "pointer" in starts[b.labels["main"]].sources
    assert b.labels["on_event"] in starts


def test_a_function_pointer_array_is_not_a_switch(x86_build):
    """`entry_points[argc & 1](...)` in main is masked too, but its table is writable data: both
    entries stay functions of their own and main gets no jump-table edges."""
    for compiler in ("gcc", "clang"):
        b = x86_build(compiler, "-O2")
        analysis = analyze(parse_path(str(b.stripped)))
        starts = {f.address: f for f in analysis.functions}
        assert b.labels["interpret"] in starts and b.labels["masked"] in starts
        main = starts[b.labels["main"]]
        assert not [e for e in main.edges if e.kind == "jump_table"]


def test_a_byte_index_bounds_an_unchecked_table_at_256_entries(compile_c):
    """`byte_switch.S`: a switch on a byte with no compare (sqlite's opcode dispatch, clang -O2).
    Read past its 256 entries, the words after the table named the byte before `victim`, whose
    decoding from there hid `victim` (called from a case) from the analysis."""
    names = {s.name: s.address for s in parse_path(str(compile_c("byte_switch.S", "-O2", True))).symbols}
    result = analyze(parse_path(str(compile_c("byte_switch.S", "-O2", True, strip=True))))
    by_start = {f.address: f for f in result.functions}
    assert names["victim"] in by_start and by_start[names["victim"]].sources == ("call",)
    owner = next(f for f in result.functions if f.address <= names["dispatch"] < f.address + f.size)
    cases = {e.dst for e in owner.edges if e.kind == "jump_table"}
    assert len(cases) == 3 and all(owner.address <= c < names["victim"] for c in cases)
