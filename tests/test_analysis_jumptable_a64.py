"""AArch64 switch tables: real clang and gcc output, checked against the case labels of the build.

`tests/fixtures/src/switch_a64.c` is compiled to assembly for aarch64-linux-gnu (clang always, gcc
when `aarch64-linux-gnu-gcc` is installed), assembled with GNU as `-L` (so the compiler's local
labels `.LBB0_3`, `.L15`, ... stay in the symbol table) and linked with `aarch64-linux-gnu-ld`.
The truth is read from the assembly (each table's entries name their case labels) and the
unstripped build's symbols (the labels' addresses); the engine runs on the stripped build, with
and without `.eh_frame`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from binlens.analysis import ProgramAnalysis, analyze
from binlens.api import invoke
from binlens.loader.parse_lief import parse_path
from conftest import corpus_dir

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "switch_a64.c"
BINUTILS = ("aarch64-linux-gnu-as", "aarch64-linux-gnu-ld", "aarch64-linux-gnu-strip")
_ENTRY = re.compile(r"^\s*\.(?:byte|2byte|hword|short|word|4byte)\s+\(?\s*(\.L\w+)\s*-\s*(\.L\w+)")
_LABEL = re.compile(r"^(\.?[A-Za-z_][\w.$]*):")


@dataclass
class Build:
    asm: str
    unstripped: Path
    stripped: Path
    no_eh: Path
    labels: dict[str, int]  # every symbol of the unstripped build (local labels included)
    tables: dict[str, tuple[str, list[str]]]  # function -> (table label, case labels in table order)


def _toolchain(compiler: str) -> list[str]:
    missing = [t for t in BINUTILS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (Debian package binutils-aarch64-linux-gnu)")
    if compiler == "clang":
        if shutil.which("clang") is None:
            pytest.skip("clang is not installed")
        return ["clang", "--target=aarch64-linux-gnu", "-fno-addrsig"]
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("aarch64-linux-gnu-gcc is not installed (Debian package gcc-aarch64-linux-gnu)")
    return ["aarch64-linux-gnu-gcc"]


def _tables(asm: str) -> dict[str, tuple[str, list[str]]]:
    """Jump tables in compiler output: function -> (the table's label, its entries' case labels)."""
    out: dict[str, tuple[str, list[str]]] = {}
    func = label = ""
    for line in asm.splitlines():
        m = _LABEL.match(line)
        if m:
            label = m.group(1)
            if not label.startswith("."):
                func = label
            continue
        m = _ENTRY.match(line)
        if m:
            out.setdefault(func, (label, []))[1].append(m.group(1))
    return out


def _build(out_dir: Path, compiler: str, opt: str, asm_edit: tuple[str, str] | None = None) -> Build:
    cc = _toolchain(compiler)
    tag = f"{compiler}{opt}" + ("-edited" if asm_edit else "")
    asm_path = out_dir / f"{tag}.s"
    subprocess.run([*cc, opt, "-S", "-o", str(asm_path), str(SRC)], check=True, capture_output=True)
    asm = asm_path.read_text()
    if asm_edit is not None:
        assert asm_edit[0] in asm, f"{asm_edit[0]!r} is not in the {tag} output"
        asm = asm.replace(asm_edit[0], asm_edit[1], 1)
        asm_path.write_text(asm)
    obj, exe = out_dir / f"{tag}.o", out_dir / tag
    subprocess.run(["aarch64-linux-gnu-as", "-L", "-o", str(obj), str(asm_path)], check=True, capture_output=True)
    subprocess.run(["aarch64-linux-gnu-ld", "-e", "main", "-o", str(exe), str(obj)], check=True, capture_output=True)
    stripped, no_eh = out_dir / f"{tag}.stripped", out_dir / f"{tag}.noeh"
    subprocess.run(["aarch64-linux-gnu-strip", "-s", "-o", str(stripped), str(exe)], check=True, capture_output=True)
    subprocess.run(
        ["aarch64-linux-gnu-strip", "-s", "-R", ".eh_frame", "-o", str(no_eh), str(exe)],
        check=True,
        capture_output=True,
    )
    labels = {s.name: s.address for s in parse_path(str(exe)).symbols}
    return Build(asm, exe, stripped, no_eh, labels, _tables(asm))


@pytest.fixture(scope="session")
def a64_build(tmp_path_factory: pytest.TempPathFactory):
    """a64_build(compiler, opt, asm_edit=None) -> Build (cached per session)."""
    out_dir = tmp_path_factory.mktemp("a64")
    cache: dict[tuple, Build] = {}

    def get(compiler: str, opt: str, asm_edit: tuple[str, str] | None = None) -> Build:
        key = (compiler, opt, asm_edit)
        if key not in cache:
            cache[key] = _build(out_dir, compiler, opt, asm_edit)
        return cache[key]

    return get


def _function(analysis: ProgramAnalysis, va: int):
    found = [f for f in analysis.functions if f.address == va]
    assert found, f"no function at {hex(va)}"
    return found[0]


def _guarded(build: Build, func: str) -> bool:
    """Does the compiler's dispatch compare the index before the table (clang drops the check
    when the default is unreachable)?"""
    body = build.asm.split(f"\n{func}:", 1)[1]
    dispatch = body.split("\tbr\t", 1)[0]
    return re.search(r"\b(cmp|subs)\b", dispatch) is not None and re.search(r"\bb\.?(hi|ls)\b", dispatch) is not None


BUILDS = [("clang", "-O0"), ("clang", "-O2"), ("gcc", "-O0"), ("gcc", "-O2")]


@pytest.mark.parametrize("compiler,opt", BUILDS)
@pytest.mark.parametrize("eh", [True, False], ids=["eh_frame", "no_eh_frame"])
def test_every_case_label_is_a_jump_table_target_of_its_switch(a64_build, compiler, opt, eh):
    b = a64_build(compiler, opt)
    analysis = analyze(parse_path(str(b.stripped if eh else b.no_eh)))
    starts = {f.address for f in analysis.functions}
    checked = 0
    for func in ("small_switch", "wide_switch", "interpret"):
        assert func in b.tables, f"{compiler} {opt} emitted no table for {func}"
        assert _guarded(b, func)
        table_label, cases = b.tables[func]
        assert len(cases) == 12
        expected = {b.labels[c] for c in cases}
        f = _function(analysis, b.labels[func])
        got = {e.dst for e in f.edges if e.kind == "jump_table"}
        assert got == expected, (func, sorted(map(hex, got ^ expected)))
        assert expected <= {blk.start for blk in f.blocks}
        assert not expected & starts, f"case labels taken for functions: {sorted(map(hex, expected & starts))}"
        jumps = {e.src for e in f.edges if e.kind == "jump_table"}
        tables = {
            x.dst for x in analysis.xrefs if x.kind == "read" and any(blk.start <= x.src < blk.end for blk in f.blocks)
        }
        assert b.labels[table_label] in tables, f"no read reference to the table {table_label}"
        assert len(jumps) == 1
        checked += 1
    assert checked == 3


def test_table_entry_forms_cover_bytes_halfwords_and_words(a64_build):
    """The builds above exercise every entry load the resolver handles (fails if a compiler changes shape)."""
    loads = set()
    for compiler, opt in BUILDS:
        try:
            b = a64_build(compiler, opt)
        except pytest.skip.Exception:
            continue
        for func in ("small_switch", "wide_switch"):
            dispatch = b.asm.split(f"\n{func}:", 1)[1].split("\tbr\t", 1)[0]
            loads.update(re.findall(r"\b(ldrb|ldrh|ldrsw|ldr)\s+[wx]\d+, \[x\d+, ?[wx]\d+", dispatch))
    assert {"ldrb", "ldrsw"} <= loads
    if shutil.which("aarch64-linux-gnu-gcc"):
        assert {"ldrb", "ldrh", "ldr", "ldrsw"} <= loads


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_a_table_without_a_bound_check_stays_unresolved(a64_build, opt):
    b = a64_build("clang", opt)
    assert "unchecked_switch" in b.tables and not _guarded(b, "unchecked_switch")
    analysis = analyze(parse_path(str(b.stripped)))
    f = _function(analysis, b.labels["unchecked_switch"])
    assert not [e for e in f.edges if e.kind == "jump_table"]
    # the guarded switches of the same binary are resolved
    assert [e for e in _function(analysis, b.labels["small_switch"]).edges if e.kind == "jump_table"]


@pytest.mark.parametrize(
    "edit",
    [
        ("\tcmp\tw0, #11\n\tb.hi", "\tcmp\tw1, #11\n\tb.hi"),  # the bound is on another register
        ("\tb.hi\t.LBB0_14\n", "\tnop\n"),  # a compare, but no branch on it
        ("\tcmp\tw0, #11\n\tb.hi", "\tcmp\tw0, #11\n\tb.lo"),  # a branch that does not bound the index
    ],
    ids=["other_register", "no_branch", "wrong_condition"],
)
def test_incomplete_dispatch_patterns_stay_unresolved(a64_build, edit):
    b = a64_build("clang", "-O2", edit)
    analysis = analyze(parse_path(str(b.stripped)))
    small = _function(analysis, b.labels["small_switch"])
    assert not [e for e in small.edges if e.kind == "jump_table"]
    wide = _function(analysis, b.labels["wide_switch"])
    assert {e.dst for e in wide.edges if e.kind == "jump_table"} == {b.labels[c] for c in b.tables["wide_switch"][1]}


def test_function_cfg_method_shows_the_case_edges(a64_build, workspace):
    b = a64_build("clang", "-O2")
    workspace.open(str(b.no_eh), check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})
    cfg = invoke(workspace, "function.cfg", {"selector": {"address": hex(b.labels["small_switch"])}})
    targets = {int(e["dst"], 16) for e in cfg["edges"] if e["kind"] == "jump_table"}
    assert targets == {b.labels[c] for c in b.tables["small_switch"][1]}
    assert len(cfg["nodes"]) >= 13  # the dispatch, 12 cases (some may share a return block)


def test_corpus_tables_stay_inside_their_functions():
    """A third-party AArch64 build with FUNC symbols: every resolved case target lies inside the
    symbol extent of the function holding the jump, and no case target became a function."""
    path = corpus_dir("elf") / "switch-hello-world.elf"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    img = parse_path(str(path))
    extents = sorted((s.address, s.address + s.size) for s in img.symbols if s.kind == "function" and s.size)
    analysis = analyze(img)
    cases = [(x.src, x.dst) for x in analysis.xrefs if x.kind == "jump_table"]
    jumps = {src for src, _ in cases}
    assert len(jumps) >= 16, f"{len(jumps)} tables resolved (16 measured on 2026-11-30)"
    for src, dst in cases:
        holder = [(lo, hi) for lo, hi in extents if lo <= src < hi]
        assert holder and holder[0][0] <= dst < holder[0][1], (hex(src), hex(dst))
    starts = {f.address for f in analysis.functions}
    assert not {dst for _, dst in cases} & starts
