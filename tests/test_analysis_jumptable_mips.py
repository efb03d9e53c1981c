"""MIPS switch tables: real gcc and clang output, checked against the case labels of the build.

`tests/fixtures/src/switch_mips.c` is compiled to assembly (gcc `mips-linux-gnu-gcc` /
`mipsel-linux-gnu-gcc` and clang `--target=mips-linux-gnu` / `mipsel-linux-gnu`; PIC with abicalls,
the Linux default, and `-fno-pic -mno-abicalls`), assembled with GNU as `-L` (so the compiler's
local labels `$L15`, `$BB0_3`, `$JTI0_0` ... stay in the symbol table) and linked with GNU ld. The
truth is read from the assembly (each table's `.word`/`.4byte`/`.gpword` entries name their case
labels) and the unstripped build's symbols (the labels' addresses); the engine runs on the stripped
build, with and without `.eh_frame`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from binlens.analysis import ProgramAnalysis, analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "switch_mips.c"
_ENTRY = re.compile(r"^\s*\.(?:gpword|gpdword|word|4byte|8byte|dword)\s+\(?\s*(\$\w+|\.L\w+)\s*\)?\s*$")
_LABEL = re.compile(r"^([$.]?[A-Za-z_][\w.$]*):")
FUNCS = ("small_switch", "wide_switch", "interpret", "pointer_switch", "masked_switch")


@dataclass
class Build:
    asm: str
    stripped: Path
    no_eh: Path
    labels: dict[str, int]  # every symbol of the unstripped build (local labels included)
    tables: dict[str, tuple[str, list[str]]]  # function -> (table label, case labels in table order)


def _toolchain(compiler: str, triple: str) -> list[str]:
    tools = [f"{triple}-{t}" for t in ("as", "ld", "strip")]
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (Debian package binutils-{triple})")
    if compiler == "clang":
        if shutil.which("clang") is None:
            pytest.skip("clang is not installed")
        return ["clang", f"--target={triple}", "-fno-addrsig"]
    if shutil.which(f"{triple}-gcc") is None:
        pytest.skip(f"{triple}-gcc is not installed (Debian package gcc-{triple})")
    return [f"{triple}-gcc"]


def _tables(asm: str) -> dict[str, tuple[str, list[str]]]:
    """Jump tables in compiler output: function -> (the table's label, its entries' case labels)."""
    out: dict[str, tuple[str, list[str]]] = {}
    func = label = ""
    for line in asm.splitlines():
        m = _LABEL.match(line)
        if m:
            label = m.group(1)
            if not label.startswith(("$", ".")):
                func = label
            continue
        m = _ENTRY.match(line)
        if m and func:
            out.setdefault(func, (label, []))[1].append(m.group(1))
    return out


def _build(
    out_dir: Path, compiler: str, triple: str, opt: str, pic: bool, asm_edit: tuple[str, str] | None = None
) -> Build:
    cc = _toolchain(compiler, triple)
    flags = ["-fasynchronous-unwind-tables"] + ([] if pic else ["-fno-pic", "-mno-abicalls"])
    tag = f"{compiler}-{triple}{opt}-{'pic' if pic else 'nopic'}" + (f"-edit{abs(hash(asm_edit))}" if asm_edit else "")
    asm_path = out_dir / f"{tag}.s"
    subprocess.run([*cc, opt, *flags, "-S", "-o", str(asm_path), str(SRC)], check=True, capture_output=True)
    asm = asm_path.read_text()
    if asm_edit is not None:
        assert asm_edit[0] in asm, f"{asm_edit[0]!r} is not in the {tag} output"
        asm = asm.replace(asm_edit[0], asm_edit[1], 1)  # the first one: in small_switch
        asm_path.write_text(asm)
    obj, exe = out_dir / f"{tag}.o", out_dir / tag
    arch = ["-march=mips64r2"] if triple == N64 else []  # clang's n64 output uses `dext`
    subprocess.run([f"{triple}-as", "-L", *arch, "-o", str(obj), str(asm_path)], check=True, capture_output=True)
    subprocess.run([f"{triple}-ld", "-e", "main", "-o", str(exe), str(obj)], check=True, capture_output=True)
    stripped, no_eh = out_dir / f"{tag}.stripped", out_dir / f"{tag}.noeh"
    subprocess.run([f"{triple}-strip", "-s", "-o", str(stripped), str(exe)], check=True, capture_output=True)
    subprocess.run(
        [f"{triple}-strip", "-s", "-R", ".eh_frame", "-o", str(no_eh), str(exe)], check=True, capture_output=True
    )
    image = parse_path(str(exe))
    assert any(s.name == ".eh_frame" for s in image.sections), f"{tag} has no .eh_frame"
    labels = {s.name: s.address for s in image.symbols}
    return Build(asm, stripped, no_eh, labels, _tables(asm))


@pytest.fixture(scope="session")
def mips_build(tmp_path_factory: pytest.TempPathFactory):
    """mips_build(compiler, triple, opt, pic, asm_edit=None) -> Build (cached per session)."""
    out_dir = tmp_path_factory.mktemp("mips")
    cache: dict[tuple, Build] = {}

    def get(compiler: str, triple: str, opt: str, pic: bool, asm_edit: tuple[str, str] | None = None) -> Build:
        key = (compiler, triple, opt, pic, asm_edit)
        if key not in cache:
            cache[key] = _build(out_dir, compiler, triple, opt, pic, asm_edit)
        return cache[key]

    return get


def _function(analysis: ProgramAnalysis, va: int):
    found = [f for f in analysis.functions if f.address == va]
    assert found, f"no function at {hex(va)}"
    return found[0]


def _dispatch(build: Build, func: str) -> str:
    """The function's code up to its first `jr` through a register other than $ra."""
    body = build.asm.split(f"\n{func}:", 1)[1]
    return re.split(r"\n\s*jr\s+\$(?!ra\b|31\b)", body, maxsplit=1)[0]


def _guarded(build: Build, func: str) -> bool:
    """Does the compiler's dispatch compare the index before the table?"""
    dispatch = _dispatch(build, func)
    return re.search(r"\bsltu?i?u?\b", dispatch) is not None and re.search(r"\bb(eq|ne)z?\b", dispatch) is not None


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
    starts = {f.address for f in analysis.functions}
    for func in FUNCS:
        assert func in b.tables, f"{compiler} {opt} emitted no table for {func}"
        if func == "masked_switch":  # bounded by `andi $i, $x, 7` (and a compare at -O0)
            assert re.search(r"\bandi\b.*,\s*(7|0x7)\s*$", _dispatch(b, func), re.M)
        else:
            assert _guarded(b, func)
        table_label, cases = b.tables[func]
        assert len(cases) == (8 if func == "masked_switch" else 12)
        expected = {b.labels[c] for c in cases}
        f = _function(analysis, b.labels[func])
        got = {e.dst for e in f.edges if e.kind == "jump_table"}
        assert got == expected, (func, sorted(map(hex, got ^ expected)))
        assert expected <= {blk.start for blk in f.blocks}
        assert not expected & starts, f"case labels taken for functions: {sorted(map(hex, expected & starts))}"
        assert len({e.src for e in f.edges if e.kind == "jump_table"}) == 1
    # no other function of the fixture is cut short by a case label taken for a function
    assert len([f for f in analysis.functions if f.address in {b.labels[n] for n in (*FUNCS, "main")}]) == 6


def test_the_builds_cover_gp_relative_and_absolute_tables(mips_build):
    """The builds above exercise both entry kinds and both ways to reach the table (fails if a compiler
    changes shape)."""
    seen = set()
    for compiler, triple, opt, pic in BUILDS:
        try:
            b = mips_build(compiler, triple, opt, pic)
        except pytest.skip.Exception:
            continue
        seen.update(re.findall(r"\.(gpword|gpdword|4byte|word)\s", b.asm))
        dispatch = _dispatch(b, "small_switch")
        if "%got(" in dispatch:
            seen.add("got")
        if "%hi(" in dispatch:
            seen.add("hi")
    assert {"gpword", "got", "hi"} <= seen
    if shutil.which(f"{N64}-ld"):
        assert "gpdword" in seen
    assert seen & {"4byte", "word"}


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
@pytest.mark.parametrize("pic", [True, False], ids=["pic", "nopic"])
def test_a_table_without_a_bound_check_stays_unresolved(mips_build, opt, pic):
    b = mips_build("clang", BE, opt, pic)
    assert "unchecked_switch" in b.tables and not _guarded(b, "unchecked_switch")
    analysis = analyze(parse_path(str(b.stripped)))
    f = _function(analysis, b.labels["unchecked_switch"])
    assert not [e for e in f.edges if e.kind == "jump_table"]
    # the guarded switches of the same binary are resolved
    assert [e for e in _function(analysis, b.labels["small_switch"]).edges if e.kind == "jump_table"]


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
    analysis = analyze(parse_path(str(b.stripped)))
    small = _function(analysis, b.labels["small_switch"])
    assert not [e for e in small.edges if e.kind == "jump_table"]
    wide = _function(analysis, b.labels["wide_switch"])
    assert {e.dst for e in wide.edges if e.kind == "jump_table"} == {b.labels[c] for c in b.tables["wide_switch"][1]}
