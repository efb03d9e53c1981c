"""PowerPC and RISC-V switch tables: real gcc and clang output, checked against the case labels of the build.

`tests/fixtures/src/switch.c` is compiled to assembly for powerpc-linux-gnu (32-bit,
big-endian), powerpc64le-linux-gnu (ELFv2: TOC-relative table addresses) and riscv64-linux-gnu by
gcc (the Debian cross compilers) and clang, at -O0 and -O2,
position-independent (`-fPIC`, linked `-pie`: tables reached through the PIC base and the GOT on
PowerPC, `auipc` on RISC-V, entries relative to the table) and not (`lis`/`lui` table addresses;
clang's entries are then absolute). It is assembled with GNU as `-L` (so the compilers' local
labels `.L4`, `.LBB0_3`, ... stay in the symbol table) and linked with GNU ld `--discard-none`. The truth is read
from the assembly (each table's entries name their case labels) and the unstripped build's
symbols (the labels' addresses); the engine runs on the stripped build, with and without `.eh_frame`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import ProgramAnalysis, analyze
from binlens.loader.parse_lief import parse_path
from conftest import corpus_dir

TRIPLES = {"ppc": "powerpc-linux-gnu", "ppc64": "powerpc64le-linux-gnu", "riscv": "riscv64-linux-gnu"}
_ENTRY = re.compile(r"^\s*\.(?:long|word|4byte|quad|8byte)\s+(\.L\w+)(?:\s*-\s*(\.L\w+))?\s*(?:#.*)?$")
SWITCHES = ("small_switch", "wide_switch", "interpret", "far_switch")


def _entry(m: re.Match[str], label: str) -> bool:
    """Absolute, or relative to the table itself; `.LC0: .long .L4` is gcc's GOT slot for the table."""
    return (m.group(2) is None or m.group(2) == label) and not label.startswith(".LC")


def _build(
    out_dir: Path, arch: str, compiler: str, opt: str, pic: bool, asm_edit: tuple[str, str] | None = None
) -> xb.Build:
    triple = TRIPLES[arch]
    cc = xb.toolchain(compiler, triple)
    tag = f"{arch}-{compiler}{opt}-{'pic' if pic else 'nopic'}" + ("-edited" if asm_edit else "")
    flags = [opt, "-fPIC"] if pic else [opt, "-fno-pic", "-fno-pie"]
    # --discard-none: RISC-V ld drops `.L` labels by default
    link = ("--discard-none", *(["-pie"] if pic else []))
    b = xb.cross_build(out_dir, triple, cc, flags, tag, asm_edit=asm_edit, ld_flags=link)
    b.arch = arch
    b.tables = xb.tables_by_function(xb.asm_tables(b.asm, _ENTRY, accept=_entry))
    return b


ppcrv_build = xb.build_fixture("ppcrv", _build)  # ppcrv_build(arch, compiler, opt, pic, asm_edit=None) -> xb.Build


def _case_edges(analysis: ProgramAnalysis, build: xb.Build, func: str) -> set[int]:
    return xb.case_targets(xb.function_of(analysis, build, func))


_JUMP = r"\n\s*(?:bctr|c?\.?jr)\b"


def _guarded(build: xb.Build, func: str) -> bool:
    """Does the compiler's dispatch compare the index before the table (an unsigned compare and
    branch; clang drops it when the default is unreachable)?"""
    return xb.guarded(build.asm, func, _JUMP, r"\b(cmplwi?|bltu|bgtu|bgeu|bleu)\b")


BUILDS = [
    (arch, compiler, opt, pic)
    for arch in ("ppc", "ppc64", "riscv")
    for compiler in ("gcc", "clang")
    for opt in ("-O0", "-O2")
    for pic in (True, False)
]


@pytest.mark.parametrize(
    "arch,compiler,opt,pic", BUILDS, ids=[f"{a}-{c}{o}-{'pic' if p else 'nopic'}" for a, c, o, p in BUILDS]
)
def test_every_case_label_is_a_jump_table_target_of_its_switch(ppcrv_build, arch, compiler, opt, pic):
    b = ppcrv_build(arch, compiler, opt, pic)
    for eh in (True, False):
        analysis = analyze(parse_path(str(b.stripped if eh else b.no_eh)))
        starts = {f.address for f in analysis.functions}
        for func in SWITCHES:
            assert func in b.tables, f"{arch} {compiler} {opt} emitted no table for {func}"
            assert _guarded(b, func)
            table_label, cases = b.tables[func]
            assert len(cases) == 12, (func, len(cases))
            xb.assert_cases(analysis, xb.function_of(analysis, b, func), {b.labels[c] for c in cases}, (func, eh))
        for func in (*SWITCHES, "unchecked_switch", "main"):
            xb.function_of(analysis, b, func)
        if eh:  # nothing but the six functions of the source (without unwind information the
            # unresolved `unchecked_switch`'s case blocks are found by the gap and pointer heuristics;
            # on PPC64 the global entry's two-instruction TOC setup stays apart from the local entry)
            primary = {s for s in starts if not (arch == "ppc64" and s + 8 in starts)}
            assert len(primary) == 6, sorted(map(hex, starts))


def test_the_builds_cover_relative_absolute_and_pic_forms(ppcrv_build):
    """The builds above exercise each dispatch form the resolver handles (fails if a compiler changes shape)."""
    seen = set()
    for (arch, *_), b in xb.every_build(ppcrv_build, BUILDS):
        d = xb.dispatch(b.asm, "small_switch", _JUMP)
        seen.update(
            form
            for form, pattern in {
                "ppc lwzx": r"\blwzx\b",
                "ppc lis/addi": r"\blis\b",
                "ppc pic base": r"\b(bcl|mflr)\b",
                "ppc got load": r"lwz \d+, ?\.LC0-",
                "ppc64 toc": r"@toc@ha",
                "rv lui": r"\blui\b",
                "rv auipc": r"\b(auipc|lla)\b",
            }.items()
            if re.search(pattern, d)
        )
        entries = b.asm.split(b.tables["small_switch"][0] + ":", 1)[1].splitlines()[1]
        seen.add(f"{arch} {'relative' if '-' in entries else 'absolute'} entries")
    assert {"ppc lwzx", "ppc lis/addi", "ppc pic base", "ppc got load", "ppc64 toc", "rv lui", "rv auipc"} <= seen
    assert {"ppc relative entries", "ppc absolute entries", "riscv relative entries", "riscv absolute entries"} <= seen


@pytest.mark.parametrize("arch", ["ppc", "ppc64", "riscv"])
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_a_table_without_a_bound_check_stays_unresolved(ppcrv_build, arch, opt):
    b = ppcrv_build(arch, "clang", opt, True)
    xb.check_unchecked_switch(b, _guarded)


# Edited assembly: the same dispatch with its bound check broken must stay unresolved.
EDITS = {
    "ppc-other_register": ("ppc", "gcc", "\tcmplwi 0,3,11\n", "\tcmplwi 0,4,11\n"),
    "ppc-no_branch": ("ppc", "gcc", "\tbgt 0,.L16\n", "\tnop\n"),
    "ppc-wrong_condition": ("ppc", "gcc", "\tbgt 0,.L16\n", "\tblt 0,.L16\n"),
    "ppc-signed_compare": ("ppc", "gcc", "\tcmplwi 0,3,11\n", "\tcmpwi 0,3,11\n"),
    "riscv-other_register": ("riscv", "gcc", "\tbgtu\ta0,a5,.L16\n", "\tbgtu\ta1,a5,.L16\n"),
    "riscv-no_branch": ("riscv", "gcc", "\tbgtu\ta0,a5,.L16\n", "\tnop\n"),
    "riscv-wrong_condition": ("riscv", "gcc", "\tbgtu\ta0,a5,.L16\n", "\tbltu\ta0,a5,.L16\n"),
    "riscv-signed_compare": ("riscv", "gcc", "\tbgtu\ta0,a5,.L16\n", "\tbgt\ta0,a5,.L16\n"),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_incomplete_dispatch_patterns_stay_unresolved(ppcrv_build, name):
    arch, compiler, old, new = EDITS[name]
    b = ppcrv_build(arch, compiler, "-O2", True, (old, new))
    xb.check_broken_dispatch(b, b.tables["wide_switch"][1])


def test_corpus_ppc_and_riscv_tables_stay_inside_their_functions():
    """Third-party builds: dropbear (PowerPC gcc -O2 PIE, FUNC symbols), guess-number (RISC-V,
    FUNC symbols) and ip (RISC-V, exported symbols only): tables are resolved, each case target
    lies inside the symbol extent of the function holding the jump (when a symbol covers the jump),
    and no case target became a function."""
    base = corpus_dir("elf")
    # tables resolved, measured 2026-11-30 (most of dropbear's bctr are calls through pointers)
    for name, at_least, symbols in (
        ("dropbear_powerpc-linux-gnu_gcc_-O2", 3, True),
        ("analysis/guess-number-riscv64", 7, True),
        ("ip-riscv", 6, False),
    ):
        path = base / name
        if not path.is_file():
            pytest.skip(f"{path} is absent")
        img = parse_path(str(path))
        analysis = analyze(img)
        cases = xb.assert_corpus_cases(img, analysis, symbols, (name,))  # ip keeps only its exported symbols
        assert len({src for src, _ in cases}) >= at_least, (name, len({src for src, _ in cases}))


def test_the_resolver_keeps_its_caches_off_the_backend(ppcrv_build):
    """The PowerPC resolver's function extents and PIC registers (PowerPC 32 PIC: r30 from the
    function's start) are kept by the resolver module (per backend): an analysis adds no attribute
    to the backend."""
    from binlens.analysis.codemap import CodeMap
    from binlens.analysis.decode.backend import make_backend
    from binlens.analysis.engine import explore, gc_paused

    b = ppcrv_build("ppc", "gcc", "-O2", True)
    with gc_paused():
        explored = explore(parse_path(str(b.stripped)))
    assert explored.reader.explorer.jt, "the build's switches resolve"
    fresh = make_backend(explored.reader.image, CodeMap(explored.reader.image))
    assert set(vars(explored.reader.backend)) == set(vars(fresh))
