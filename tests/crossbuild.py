"""Cross-built fixtures for the jump-table tests, and the checks they share.

A test compiles a C fixture to assembly with a cross compiler (gcc `<triple>-gcc` or clang
`--target=<triple>`), may edit the assembly, assembles it with GNU as `-L` (so the compilers'
local labels `.LBB0_3`, `.L15`, `$L16` ... stay in the symbol table), links it with GNU ld and
strips it twice: of its symbols, and of its symbols and unwind tables. The truth comes from the
assembly (each table's entries name their case labels) and the unstripped build's symbols (the
labels' addresses); the engine runs on a stripped build. A missing tool skips the test with the
Debian package that provides it. `gcc_linked` builds the fixtures that link with the target's C
library instead (the veneer and i386 tests).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from binlens.analysis import ProgramAnalysis, analyze
from binlens.loader.parse_lief import parse_path

SWITCH_SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "switch.c"
LABEL = re.compile(r"^(\.?[A-Za-z_][\w.$]*):")


@dataclass
class Build:
    """One cross build: its assembly, the three binaries and the unstripped build's symbols."""

    asm: str
    exe: Path  # unstripped
    stripped: Path  # no symbols
    no_eh: Path  # no symbols, no unwind tables
    labels: dict[str, int]  # every symbol of the unstripped build (local labels included)
    sizes: dict[str, int]
    sections: set[str]  # section names of the unstripped build
    tables: dict = field(default_factory=dict)  # what the test reads from the assembly
    arch: str = ""


def toolchain(
    compiler: str, triple: str, clang_target: str = "", tools: tuple[str, ...] = ("as", "ld", "strip")
) -> list[str]:
    """The compiler command for `triple` ("gcc" or "clang"); skips the test when it or one of the
    binutils `tools` is missing, naming the Debian package."""
    missing = [f"{triple}-{t}" for t in tools if shutil.which(f"{triple}-{t}") is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (Debian package binutils-{triple})")
    if compiler == "clang":
        if shutil.which("clang") is None:
            pytest.skip("clang is not installed")
        return ["clang", f"--target={clang_target or triple}", "-fno-addrsig"]
    if shutil.which(f"{triple}-gcc") is None:
        pytest.skip(f"{triple}-gcc is not installed (Debian package gcc-{triple})")
    return [f"{triple}-gcc"]


def _run(args: list) -> None:
    subprocess.run([str(a) for a in args], check=True, capture_output=True)


def cross_build(
    out_dir: Path,
    triple: str,
    cc: list[str],
    flags: tuple[str, ...] | list[str],
    tag: str,
    *,
    src: Path = SWITCH_SRC,
    asm_edit: tuple[str, str] | None = None,
    as_flags: tuple[str, ...] = (),
    ld_flags: tuple[str, ...] = (),
    unwind: tuple[str, ...] = (".eh_frame",),
    thumb_bit: bool = False,
) -> Build:
    """Compile `src` to assembly (`cc flags -S`), replace the first `asm_edit[0]` by `asm_edit[1]`
    (it must be there), assemble with `-L`, link with `main` as entry, strip the symbols (and the
    `unwind` sections). `thumb_bit`: clear bit 0 of the symbols' addresses (ARM Thumb code)."""
    asm_path = out_dir / f"{tag}.s"
    _run([*cc, *flags, "-S", "-o", asm_path, src])
    asm = asm_path.read_text()
    if asm_edit is not None:
        assert asm_edit[0] in asm, f"{asm_edit[0]!r} is not in the {tag} output"
        asm = asm.replace(asm_edit[0], asm_edit[1], 1)
        asm_path.write_text(asm)
    obj, exe = out_dir / f"{tag}.o", out_dir / tag
    _run([f"{triple}-as", "-L", *as_flags, "-o", obj, asm_path])
    _run([f"{triple}-ld", *ld_flags, "-e", "main", "-o", exe, obj])
    stripped, no_eh = out_dir / f"{tag}.stripped", out_dir / f"{tag}.noeh"
    _run([f"{triple}-strip", "-s", "-o", stripped, exe])
    _run([f"{triple}-strip", "-s", *(a for s in unwind for a in ("-R", s)), "-o", no_eh, exe])
    image = parse_path(str(exe))
    mask = ~1 if thumb_bit else -1
    labels = {s.name: s.address & mask for s in image.symbols}
    sizes = {s.name: s.size for s in image.symbols}
    return Build(asm, exe, stripped, no_eh, labels, sizes, {s.name for s in image.sections})


def build_fixture(folder: str, build: Callable[..., Build], scope: str = "session"):
    """A pytest fixture giving `get(*args) -> build(out_dir, *args)`, cached for the `scope`."""

    @pytest.fixture(scope=scope)
    def fixture(tmp_path_factory: pytest.TempPathFactory):
        out_dir = tmp_path_factory.mktemp(folder)
        cache: dict[tuple, Build] = {}

        def get(*args: object) -> Build:
            if args not in cache:
                cache[args] = build(out_dir, *args)
            return cache[args]

        return get

    return fixture


def every_build(get: Callable[..., Build], builds: list[tuple]) -> list[tuple[tuple, Build]]:
    """(arguments, build) for every one of `builds` (argument tuples for `get`). The tests that
    check which shapes the builds cover read all of them, so a build this machine cannot make
    skips such a test with its reason: a coverage check over part of the builds proves nothing."""
    made, missing = [], []
    for args in builds:
        try:
            made.append((args, get(*args)))
        except pytest.skip.Exception as skipped:
            missing.append(f"{args}: {skipped.msg}")
    if missing:
        pytest.skip("the coverage check needs every build; missing " + "; ".join(missing))
    return made


# --------------------------------------------------------------------------- the assembly's truth
@dataclass
class AsmTable:
    """A run of table entries in compiler output: the function it is in, the label before it, the
    case labels its entries name (in table order)."""

    function: str
    label: str
    cases: list[str]


def asm_tables(
    asm: str,
    entry: re.Pattern[str],
    *,
    label: re.Pattern[str] = LABEL,
    local: tuple[str, ...] = (".",),
    accept: Callable[[re.Match[str], str], bool] | None = None,
) -> list[AsmTable]:
    """The tables in compiler output: lines matching `entry` (group 1: the case label) after a label,
    grouped by that label. A label starting with one of `local` is a local label, any other one
    begins a function. `accept(match, label)` may refuse an entry."""
    out: list[AsmTable] = []
    func = name = ""
    current: AsmTable | None = None
    for line in asm.splitlines():
        m = label.match(line)
        if m:
            name = m.group(1)
            if not name.startswith(local):
                func = name
            current = None
            continue
        m = entry.match(line)
        if m and (accept is None or accept(m, name)):
            if current is None:
                current = AsmTable(func, name, [])
                out.append(current)
            current.cases.append(m.group(1))
    return out


def tables_by_function(tables: list[AsmTable]) -> dict[str, tuple[str, list[str]]]:
    """function -> (its first table's label, the case labels of its tables)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for t in tables:
        if t.function:
            out.setdefault(t.function, (t.label, []))[1].extend(t.cases)
    return out


def dispatch(asm: str, func: str, jump: str) -> str:
    """`func`'s assembly from its label up to the first match of the regex `jump` (its dispatch)."""
    body = asm.split(f"\n{func}:", 1)[1]
    return re.split(jump, body, maxsplit=1)[0]


def guarded(asm: str, func: str, jump: str, *patterns: str) -> bool:
    """Does `func`'s dispatch (up to `jump`) compare and branch before the table: does every regex
    of `patterns` occur in it? (clang drops the check when the default is unreachable)"""
    text = dispatch(asm, func, jump)
    return all(re.search(p, text) is not None for p in patterns)


# --------------------------------------------------------------------------- the engine's answer
def function_at(analysis: ProgramAnalysis, va: int):
    """The function starting at `va` (fails the test when there is none)."""
    found = [f for f in analysis.functions if f.address == va]
    assert found, f"no function at {hex(va)}"
    return found[0]


def function_of(analysis: ProgramAnalysis, build: Build, name: str):
    """The function holding the code of the symbol `name`: on PPC64 ELFv2 calls land on the local
    entry 8 bytes past the symbol (after the TOC setup), and that is where the engine starts it."""
    va = build.labels[name]
    if build.arch == "ppc64" and any(f.address == va + 8 for f in analysis.functions):
        va += 8
    return function_at(analysis, va)


def case_targets(function: object) -> set[int]:
    """The targets of the function's jump-table edges."""
    return {e.dst for e in function.edges if e.kind == "jump_table"}  # type: ignore[attr-defined]


def assert_cases(analysis: ProgramAnalysis, function: object, expected: set[int], context: tuple = ()) -> None:
    """The function's one table jump goes to exactly `expected`, each a block of the function and
    none taken for a function of its own."""
    got = case_targets(function)
    assert got == expected, (*context, sorted(map(hex, got ^ expected)))
    assert expected <= {blk.start for blk in function.blocks}  # type: ignore[attr-defined]
    starts = {f.address for f in analysis.functions}
    assert not expected & starts, f"case labels taken for functions: {sorted(map(hex, expected & starts))}"
    assert len({e.src for e in function.edges if e.kind == "jump_table"}) == 1  # type: ignore[attr-defined]


def check_unchecked_switch(build: Build, is_guarded: Callable[[Build, str], bool]) -> ProgramAnalysis:
    """`unchecked_switch` (no default, so the compiler dropped the bound check: `is_guarded(build,
    name)`, the test's reading of the assembly, says no) stays unresolved in the stripped build while
    its guarded `small_switch` is resolved. Returns the analysis."""
    assert "unchecked_switch" in build.tables and not is_guarded(build, "unchecked_switch")
    analysis = analyze(parse_path(str(build.stripped)))
    assert not case_targets(function_of(analysis, build, "unchecked_switch"))
    assert case_targets(function_of(analysis, build, "small_switch"))  # the guarded switches are resolved
    return analysis


def check_broken_dispatch(build: Build, wide_cases: list[str] | None) -> ProgramAnalysis:
    """`small_switch`, its dispatch broken by an edit of the assembly, stays unresolved in the stripped
    build; `wide_switch` still resolves to exactly the labels `wide_cases` (unless None). Returns the
    analysis."""
    analysis = analyze(parse_path(str(build.stripped)))
    assert not case_targets(function_of(analysis, build, "small_switch"))
    if wide_cases is not None:
        assert case_targets(function_of(analysis, build, "wide_switch")) == {build.labels[c] for c in wide_cases}
    return analysis


def assert_corpus_cases(
    image: object, analysis: ProgramAnalysis, symbols: bool = True, context: tuple = (), thumb_bit: bool = False
) -> list[tuple[int, int]]:
    """Every resolved case target of a third-party build lies inside the symbol extent of the
    function holding its jump (`symbols`: a FUNC symbol covers every jump), and none became a
    function. Returns the (jump, target) pairs."""
    mask = ~1 if thumb_bit else -1
    extents = sorted(
        (s.address & mask, (s.address & mask) + s.size)
        for s in image.symbols  # type: ignore[attr-defined]
        if s.kind == "function" and s.size
    )
    cases = [(x.src, x.dst) for x in analysis.xrefs if x.kind == "jump_table"]
    for src, dst in cases:
        holder = [(lo, hi) for lo, hi in extents if lo <= src < hi]
        assert holder or not symbols, (*context, hex(src))
        assert not holder or holder[0][0] <= dst < holder[0][1], (*context, hex(src), hex(dst))
    assert not {dst for _, dst in cases} & {f.address for f in analysis.functions}
    return cases


def gcc_linked(
    out_dir: Path, triple: str, src: Path, name: str, flags: list[str], strip: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """(unstripped, stripped) builds of `src` with `<triple>-gcc` and its C library (stripped of
    its symbols and the sections in `strip`); skips the test when the toolchain or the library is
    missing, naming the Debian packages."""
    gcc = shutil.which(f"{triple}-gcc")
    if gcc is None or not Path(f"/usr/{triple}/lib").is_dir():
        pytest.skip(f"{triple}-gcc or its C library is missing (Debian packages gcc-{triple}, libc6-dev-*-cross)")
    exe, stripped = out_dir / name, out_dir / f"{name}.stripped"
    subprocess.run([gcc, *flags, "-o", exe, src], check=True, capture_output=True)
    removed = [arg for section in strip for arg in ("-R", section)]
    subprocess.run([f"{triple}-strip", "-s", *removed, "-o", stripped, exe], check=True, capture_output=True)
    return exe, stripped
