"""MIPS switch tables: real gcc and clang output, checked against the case labels of the build.

`tests/fixtures/src/switch.c` is compiled to assembly (gcc `mips-linux-gnu-gcc` /
`mipsel-linux-gnu-gcc` and clang `--target=mips-linux-gnu` / `mipsel-linux-gnu`; PIC with abicalls,
the Linux default, and `-fno-pic -mno-abicalls`), assembled with GNU as `-L` (so the compiler's
local labels `$L15`, `$BB0_3`, `$JTI0_0` ... stay in the symbol table) and linked with GNU ld. The
truth is read from the assembly (each table's `.word`/`.4byte`/`.gpword` entries name their case
labels) and the unstripped build's symbols (the labels' addresses); the engine runs on the stripped
build, with and without `.eh_frame`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

_ENTRY = re.compile(r"^\s*\.(?:gpword|gpdword|word|4byte|8byte|dword)\s+\(?\s*(\$\w+|\.L\w+)\s*\)?\s*$")
_LABEL = re.compile(r"^([$.]?[A-Za-z_][\w.$]*):")
FUNCS = ("small_switch", "wide_switch", "interpret", "pointer_switch", "masked_switch")


def _build(
    out_dir: Path, compiler: str, triple: str, opt: str, pic: bool, asm_edit: tuple[str, str] | None = None
) -> xb.Build:
    cc = xb.toolchain(compiler, triple)
    flags = [opt, "-fasynchronous-unwind-tables"] + ([] if pic else ["-fno-pic", "-mno-abicalls"])
    tag = f"{compiler}-{triple}{opt}-{'pic' if pic else 'nopic'}" + (f"-edit{abs(hash(asm_edit))}" if asm_edit else "")
    arch = ("-march=mips64r2",) if triple == N64 else ()  # clang's n64 output uses `dext`
    # (an edit replaces the first occurrence: in small_switch)
    b = xb.cross_build(out_dir, triple, cc, flags, tag, asm_edit=asm_edit, as_flags=arch)
    assert ".eh_frame" in b.sections, f"{tag} has no .eh_frame"
    b.tables = xb.tables_by_function(xb.asm_tables(b.asm, _ENTRY, label=_LABEL, local=("$", ".")))
    return b


mips_build = xb.build_fixture("mips", _build)  # mips_build(compiler, triple, opt, pic, asm_edit=None) -> xb.Build


def _dispatch(build: xb.Build, func: str) -> str:
    """The function's code up to its first `jr` through a register other than $ra."""
    return xb.dispatch(build.asm, func, r"\n\s*jr\s+\$(?!ra\b|31\b)")


def _guarded(build: xb.Build, func: str) -> bool:
    """Does the compiler's dispatch compare the index before the table?"""
    return xb.guarded(build.asm, func, r"\n\s*jr\s+\$(?!ra\b|31\b)", r"\bsltu?i?u?\b", r"\bb(eq|ne)z?\b")


BE, LE, N64 = "mips-linux-gnu", "mipsel-linux-gnu", "mips64-linux-gnuabi64"
BUILDS = [
    (compiler, BE, opt, pic) for compiler in ("gcc", "clang") for opt in ("-O0", "-O2") for pic in (True, False)
] + [("gcc", LE, "-O2", True), ("clang", LE, "-O0", True), ("clang", LE, "-O2", False)]
# MIPS64 (n64): `.gpdword` entries, `ld`, `dsll`, _gp from `lui` + `daddu $t9` + `daddiu`
BUILDS += [(compiler, N64, opt, True) for compiler in ("gcc", "clang") for opt in ("-O0", "-O2")]


def _id(b: tuple) -> str:
    compiler, triple, opt, pic = b
    return f"{compiler}-{ {BE: 'be', LE: 'le', N64: 'n64'}[triple] }{opt}-{'pic' if pic else 'nopic'}"


@pytest.mark.parametrize("compiler,triple,opt,pic", BUILDS, ids=[_id(b) for b in BUILDS])
@pytest.mark.parametrize("eh", [True, False], ids=["eh_frame", "no_eh_frame"])
def test_every_case_label_is_a_jump_table_target_of_its_switch(mips_build, compiler, triple, opt, pic, eh):
    b = mips_build(compiler, triple, opt, pic)
    analysis = analyze(parse_path(str(b.stripped if eh else b.no_eh)))
    for func in FUNCS:
        assert func in b.tables, f"{compiler} {opt} emitted no table for {func}"
        if func == "masked_switch":  # bounded by `andi $i, $x, 7` (and a compare at -O0)
            assert re.search(r"\bandi\b.*,\s*(7|0x7)\s*$", _dispatch(b, func), re.M)
        else:
            assert _guarded(b, func)
        table_label, cases = b.tables[func]
        assert len(cases) == (8 if func == "masked_switch" else 12)
        xb.assert_cases(analysis, xb.function_at(analysis, b.labels[func]), {b.labels[c] for c in cases}, (func,))
    # no other function of the fixture is cut short by a case label taken for a function
    assert len([f for f in analysis.functions if f.address in {b.labels[n] for n in (*FUNCS, "main")}]) == 6


def test_the_builds_cover_gp_relative_and_absolute_tables(mips_build):
    """The builds above exercise both entry kinds and both ways to reach the table (fails if a compiler
    changes shape)."""
    seen = set()
    for _, b in xb.every_build(mips_build, BUILDS):
        seen.update(re.findall(r"\.(gpword|gpdword|4byte|word)\s", b.asm))
        dispatch = _dispatch(b, "small_switch")
        if "%got(" in dispatch:
            seen.add("got")
        if "%hi(" in dispatch:
            seen.add("hi")
    assert {"gpword", "gpdword", "got", "hi"} <= seen
    assert seen & {"4byte", "word"}


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
@pytest.mark.parametrize("pic", [True, False], ids=["pic", "nopic"])
def test_a_table_without_a_bound_check_stays_unresolved(mips_build, opt, pic):
    b = mips_build("clang", BE, opt, pic)
    xb.check_unchecked_switch(b, _guarded)


@pytest.mark.parametrize(
    "edit",
    [
        ("\tsltu\t$2,$4,12\n", "\tsltu\t$2,$5,12\n"),  # the bound is on another register
        ("\tbeq\t$2,$0,$L16\n", "\tnop\n"),  # a compare, but no branch on it
        ("\tbeq\t$2,$0,$L16\n", "\tbne\t$2,$0,$L16\n"),  # a branch that does not bound the index
        ("\tsltu\t$2,$4,12\n", "\tsltu\t$2,$4,$5\n"),  # a compare with an unknown value
    ],
    ids=["other_register", "no_branch", "wrong_condition", "unknown_bound"],
)
def test_incomplete_dispatch_patterns_stay_unresolved(mips_build, edit):
    b = mips_build("gcc", BE, "-O2", False, edit)
    xb.check_broken_dispatch(b, b.tables["wide_switch"][1])


def test_the_resolver_keeps_gp_off_the_backend(mips_build):
    """The MIPS `_gp` that the resolver and the address pairs share is kept by the resolver module
    (per backend), not written onto the backend."""
    from binlens.analysis.engine import explore, gc_paused
    from binlens.analysis.switches.mips import gp_value

    b = mips_build("gcc", BE, "-O2", True)
    with gc_paused():
        explored = explore(parse_path(str(b.stripped)))
    assert explored.reader.explorer.jt, "the build's switches resolve"
    assert gp_value(explored.reader.backend, explored.reader.image) is not None
    assert not [name for name in vars(explored.reader.backend) if "gp" in name]
