"""AArch64 switch tables: real clang and gcc output, checked against the case labels of the build.

`tests/fixtures/src/switch.c` is compiled to assembly for aarch64-linux-gnu (clang always, gcc
when `aarch64-linux-gnu-gcc` is installed), assembled with GNU as `-L` (so the compiler's local
labels `.LBB0_3`, `.L15`, ... stay in the symbol table) and linked with `aarch64-linux-gnu-ld`.
The truth is read from the assembly (each table's entries name their case labels) and the
unstripped build's symbols (the labels' addresses); the engine runs on the stripped build, with
and without `.eh_frame`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.api import invoke
from binlens.loader.parse_lief import parse_path
from conftest import corpus_dir

TRIPLE = "aarch64-linux-gnu"
_ENTRY = re.compile(r"^\s*\.(?:byte|2byte|hword|short|word|4byte)\s+\(?\s*(\.L\w+)\s*-\s*(\.L\w+)")


def _build(out_dir: Path, compiler: str, opt: str, asm_edit: tuple[str, str] | None = None) -> xb.Build:
    cc = xb.toolchain(compiler, TRIPLE)
    tag = f"{compiler}{opt}" + ("-edited" if asm_edit else "")
    b = xb.cross_build(out_dir, TRIPLE, cc, [opt], tag, asm_edit=asm_edit)
    b.tables = xb.tables_by_function(xb.asm_tables(b.asm, _ENTRY))  # function -> (table label, case labels)
    return b


a64_build = xb.build_fixture("a64", _build)  # a64_build(compiler, opt, asm_edit=None) -> xb.Build


def _guarded(build: xb.Build, func: str) -> bool:
    """Does the compiler's dispatch compare the index before the table (clang drops the check
    when the default is unreachable)?"""
    return xb.guarded(build.asm, func, "\tbr\t", r"\b(cmp|subs)\b", r"\bb\.?(hi|ls)\b")


BUILDS = [("clang", "-O0"), ("clang", "-O2"), ("gcc", "-O0"), ("gcc", "-O2")]


@pytest.mark.parametrize("compiler,opt", BUILDS)
@pytest.mark.parametrize("eh", [True, False], ids=["eh_frame", "no_eh_frame"])
def test_every_case_label_is_a_jump_table_target_of_its_switch(a64_build, compiler, opt, eh):
    b = a64_build(compiler, opt)
    analysis = analyze(parse_path(str(b.stripped if eh else b.no_eh)))
    checked = 0
    for func in ("small_switch", "wide_switch", "interpret"):
        assert func in b.tables, f"{compiler} {opt} emitted no table for {func}"
        assert _guarded(b, func)
        table_label, cases = b.tables[func]
        assert len(cases) == 12
        f = xb.function_at(analysis, b.labels[func])
        xb.assert_cases(analysis, f, {b.labels[c] for c in cases}, (func,))
        tables = {
            x.dst for x in analysis.xrefs if x.kind == "read" and any(blk.start <= x.src < blk.end for blk in f.blocks)
        }
        assert b.labels[table_label] in tables, f"no read reference to the table {table_label}"
        checked += 1
    assert checked == 3


def test_table_entry_forms_cover_bytes_halfwords_and_words(a64_build):
    """The builds above exercise every entry load the resolver handles (fails if a compiler changes shape)."""
    loads = set()
    for _, b in xb.every_build(a64_build, BUILDS):
        for func in ("small_switch", "wide_switch"):
            text = xb.dispatch(b.asm, func, "\tbr\t")
            loads.update(re.findall(r"\b(ldrb|ldrh|ldrsw|ldr)\s+[wx]\d+, \[x\d+, ?[wx]\d+", text))
    assert {"ldrb", "ldrh", "ldr", "ldrsw"} <= loads


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_a_table_without_a_bound_check_stays_unresolved(a64_build, opt):
    b = a64_build("clang", opt)
    xb.check_unchecked_switch(b, _guarded)


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
    xb.check_broken_dispatch(b, b.tables["wide_switch"][1])


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
    analysis = analyze(img)
    jumps = {src for src, _ in xb.assert_corpus_cases(img, analysis)}
    assert len(jumps) >= 16, f"{len(jumps)} tables resolved (16 measured on 2026-11-30)"
