"""ARM32 and Thumb-2 switch tables: real gcc and clang output, checked against the build's own truth.

`tests/fixtures/src/switch.c` is compiled to assembly by `arm-linux-gnueabihf-gcc` and by
`clang --target=armv7a-linux-gnueabihf`, in ARM and in Thumb state, at -O0/-O2/-Os (PIC, the
default, and a few non-PIC builds, which dispatch differently), assembled with GNU as `-L` (so the
compilers' local labels `.LBB0_3`, `.L15`, ... stay in the symbol table) and linked with
`arm-linux-gnueabihf-ld`. The truth comes from the assembly (each table's entries name their case
labels), the unstripped build's symbols (the labels' addresses) and `objdump -d` of the unstripped
build (which decodes by the ARM mapping symbols `$a`/`$t`/`$d`: ARM code, Thumb code, data). The
engine runs on the stripped build, with and without unwind tables (`.ARM.exidx`, `.eh_frame`).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import ProgramAnalysis, analyze
from binlens.api import invoke
from binlens.loader.parse_lief import parse_path
from conftest import corpus_dir

TRIPLE = "arm-linux-gnueabihf"
GCC = f"{TRIPLE}-gcc"
OBJDUMP = f"{TRIPLE}-objdump"
_LABEL = re.compile(r"^(\.?[A-Za-z_$][\w.$]*):")
# the instruction that reads a table (the next label is the table; a `b default` may come between)
_DISPATCH = re.compile(r"^\t(tbb|tbh|ldr\w*\tpc,|ldr\.w\tpc,|add\w*\tpc,|mov\tpc, r\d|bx\tr\d)")
_ENTRY = re.compile(r"^\t\.(byte|2byte|short|hword|word|4byte|long)\t\(?(\.L\w+)")
_SLOT = re.compile(r"^\tb\t(\.L\w+)")
_SIZES = {"byte": 1, "2byte": 2, "short": 2, "hword": 2, "word": 4, "4byte": 4, "long": 4}
_OBJDUMP_LINE = re.compile(r"^\s+([0-9a-f]+):\t((?:[0-9a-f]{2,8} ?)+)\s*\t(\S+)")


@dataclass
class Table:
    label: str
    cases: list[str]  # the case label of each entry, in table order
    size: int  # bytes per entry; 0 for a table of `b case` instructions (ARM `addls pc, pc, rI, lsl #2`)
    dispatch: str  # the instruction that reads it


@dataclass
class ArmBuild(xb.Build):
    """A build whose labels have the Thumb bit cleared; `tables`: function -> its Table."""

    insns: dict[int, int] = field(default_factory=dict)  # objdump of the unstripped build: address -> next


def _tables(asm: str) -> dict[str, Table]:
    """The jump table of each function in compiler output (the label right after the dispatch)."""
    out: dict[str, Table] = {}
    func = dispatch = ""
    table: Table | None = None
    for line in asm.splitlines():
        if not line.strip() or line.lstrip().startswith("@"):
            continue  # comments (clang's `@ %bb.2:`)
        m = _LABEL.match(line)
        if m:
            if not m.group(1).startswith("."):
                func = m.group(1)
            if dispatch and table is None and func not in out:
                table = out[func] = Table(m.group(1), [], 0, dispatch)
            continue
        if table is not None:
            entry, slot = _ENTRY.match(line), _SLOT.match(line)
            if entry and table.size in (0, _SIZES[entry.group(1)]) and not (table.cases and table.size == 0):
                table.size = _SIZES[entry.group(1)]
                table.cases.append(entry.group(2))
                continue
            if slot and table.size == 0:
                table.cases.append(slot.group(1))
                continue
            if line.startswith("\t.") and not table.cases:
                continue  # .p2align, .syntax ... before the first entry
            table = None
            dispatch = ""
            continue
        d = _DISPATCH.match(line)
        if d:
            dispatch = d.group(1)
        elif dispatch and not (_SLOT.match(line) and "ls\t" in dispatch) and not line.startswith("\t."):
            dispatch = ""  # only `b default` (after ldrls/addls) and directives may separate it from its table
    return out


def _objdump(path: Path) -> dict[int, int]:
    """Instruction address -> next address, as objdump decodes by the mapping symbols ($d is data)."""
    text = subprocess.run([OBJDUMP, "-d", str(path)], check=True, capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        m = _OBJDUMP_LINE.match(line)
        if m and not m.group(3).startswith("."):  # `.word` and the like: data
            a = int(m.group(1), 16)
            out[a] = a + len(m.group(2).replace(" ", "")) // 2
    return out


def _build(out_dir: Path, compiler: str, flags: tuple[str, ...], asm_edit: tuple[str, str] | None = None) -> ArmBuild:
    cc = xb.toolchain(compiler, TRIPLE, "armv7a-linux-gnueabihf", ("as", "ld", "strip", "objdump"))
    tag = compiler + "".join(flags) + ("-edited" if asm_edit else "")
    unwind = (".ARM.exidx", ".ARM.extab", ".eh_frame")
    b = xb.cross_build(out_dir, TRIPLE, cc, flags, tag, asm_edit=asm_edit, unwind=unwind, thumb_bit=True)
    return ArmBuild(**{**vars(b), "tables": _tables(b.asm)}, insns=_objdump(b.exe))


arm_build = xb.build_fixture("arm32", _build)  # arm_build(compiler, flags, asm_edit=None) -> ArmBuild


def _guarded(build: ArmBuild, func: str) -> bool:
    """Does the dispatch compare the index first (clang drops the check when the default is unreachable)?"""
    return xb.guarded(build.asm, func, re.escape(f"\n{build.tables[func].label}:"), r"\tcmp\t")


# (compiler, flags): every mode and level, PIC (the default) plus the non-PIC dispatches
# (gcc ARM `ldrls pc, [pc, rI, lsl #2]`, gcc Thumb -O0 `ldr.w pc, [rT, rI, lsl #2]`,
# clang ARM -O0 `ldr rE, [rT, rI, lsl #2]; mov pc, rE`, clang ARM -O2 `ldr pc, [rT, rI, lsl #2]`)
BUILDS = [
    (compiler, (mode, opt))
    for compiler in ("gcc", "clang")
    for mode in ("-marm", "-mthumb")
    for opt in ("-O0", "-O2", "-Os")
] + [
    ("gcc", ("-marm", "-O2", "-fno-pic")),
    ("gcc", ("-mthumb", "-O0", "-fno-pic")),
    ("clang", ("-marm", "-O0", "-fno-pic")),
    ("clang", ("-marm", "-O2", "-fno-pic")),
]
SWITCHES = ("small_switch", "wide_switch", "interpret", "unchecked_switch")


def _check_table(b: ArmBuild, analysis: ProgramAnalysis, func: str) -> None:
    table = b.tables[func]
    assert len(table.cases) == 12, (func, table)
    f = xb.function_at(analysis, b.labels[func])
    got = xb.case_targets(f)
    cases = [b.labels[c] for c in table.cases]
    starts = {blk.start for blk in f.blocks}
    if table.size == 0:  # `addls pc, pc, rI, lsl #2`: each slot is a `b case` instruction
        slots = [b.labels[table.label] + 4 * k for k in range(12)]
        assert got == set(slots), (func, sorted(map(hex, got ^ set(slots))))
        jumps = {(e.src, e.dst) for e in f.edges if e.kind == "jump"}
        assert set(zip(slots, cases, strict=True)) <= jumps
    else:
        assert got == set(cases), (func, sorted(map(hex, got ^ set(cases))))
        lo = b.labels[table.label]
        hi = lo + table.size * len(table.cases)
        decoded = [blk for g in analysis.functions for blk in g.blocks if blk.start < hi and lo < blk.end]
        assert not decoded, f"table bytes of {func} decoded as code: {decoded}"
    assert set(cases) <= starts
    assert not set(cases) & {g.address for g in analysis.functions}, "case labels taken for functions"
    assert len({e.src for e in f.edges if e.kind == "jump_table"}) == 1


def _check_decoding(b: ArmBuild, analysis: ProgramAnalysis, func: str) -> None:
    """Every block of the function decodes as objdump does by the mapping symbols: right state
    (ARM/Thumb) for every case target, no data decoded as code."""
    f = xb.function_at(analysis, b.labels[func])
    for blk in f.blocks:
        a, n = blk.start, 0
        while a < blk.end:
            assert a in b.insns, f"{func}: block {hex(blk.start)}-{hex(blk.end)} decodes {hex(a)}, not an instruction"
            a, n = b.insns[a], n + 1
        assert a == blk.end and n == blk.instruction_count, (func, hex(blk.start), n, blk.instruction_count)


@pytest.mark.parametrize("compiler,flags", BUILDS, ids=[c + "".join(f) for c, f in BUILDS])
@pytest.mark.parametrize("unwind", [True, False], ids=["unwind", "no_unwind"])
def test_every_case_label_is_a_jump_table_target_of_its_switch(arm_build, compiler, flags, unwind):
    b = arm_build(compiler, flags)
    analysis = analyze(parse_path(str(b.stripped if unwind else b.no_eh)))
    checked = 0
    for func in SWITCHES:
        assert func in b.tables, f"{compiler} {flags} emitted no table for {func}"
        if not _guarded(b, func):
            assert func == "unchecked_switch" and compiler == "clang"
            continue
        _check_table(b, analysis, func)
        _check_decoding(b, analysis, func)
        f = xb.function_at(analysis, b.labels[func])
        assert (f.mode == "thumb") == ("-mthumb" in flags)
        checked += 1
    assert checked >= 3


def test_the_builds_cover_every_dispatch_form(arm_build):
    """The builds above exercise every dispatch the resolver handles (fails if a compiler changes shape)."""
    forms = set()
    for _, b in xb.every_build(arm_build, BUILDS):
        forms.update(t.dispatch.split("\t")[0] + ("" if t.size else " slots") for t in b.tables.values())
    assert {"tbb", "tbh", "add", "mov", "ldr", "addls slots", "ldrls", "bx"} <= forms


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
@pytest.mark.parametrize("mode", ["-marm", "-mthumb"])
def test_a_table_without_a_bound_check_stays_unresolved(arm_build, mode, opt):
    b = arm_build("clang", (mode, opt))
    analysis = xb.check_unchecked_switch(b, _guarded)
    f = xb.function_at(analysis, b.labels["unchecked_switch"])
    # the dispatch still ends its block: the table after it is not decoded as code
    table = b.labels[b.tables["unchecked_switch"].label]
    assert [blk for blk in f.blocks if blk.end == table and blk.terminator == "indirect_jump"]
    assert not [blk for g in analysis.functions for blk in g.blocks if blk.start <= table < blk.end]
    assert not f.noreturn  # an unresolved indirect jump: the function is assumed to return


@pytest.mark.parametrize(
    "compiler,flags,edit",
    [
        # tbb: the bound is on another register
        ("gcc", ("-mthumb", "-O2"), ("\tcmp\tr0, #11\n\tbhi", "\tcmp\tr1, #11\n\tbhi")),
        # addls pc, pc, rI: the condition comes from a compare of another register
        ("gcc", ("-marm", "-O2"), ("\tcmp\tr0, #11\n\taddls", "\tcmp\tr1, #11\n\taddls")),
        # clang's conditional return leaves when the index is low: nothing bounds it from above
        ("clang", ("-marm", "-O2"), ("\tmovhi\tr0, #0\n\tbxhi\tlr", "\tmovlo\tr0, #0\n\tbxlo\tlr")),
        # a compare, but no branch on it
        ("gcc", ("-mthumb", "-O2"), ("\tcmp\tr0, #11\n\tbhi\t.L16\n", "\tcmp\tr0, #11\n")),
        # `mov lr, pc` first: a call through a table of function pointers, not a switch
        (
            "gcc",
            ("-marm", "-O2", "-fno-pic"),
            ("\tcmp\tr0, #11\n\tldrls\tpc,", "\tcmp\tr0, #11\n\tmovls\tlr, pc\n\tldrls\tpc,"),
        ),
    ],
    ids=["tbb_other_register", "addls_other_register", "wrong_condition", "no_branch", "call_through_table"],
)
def test_incomplete_dispatch_patterns_stay_unresolved(arm_build, compiler, flags, edit):
    b = arm_build(compiler, flags, edit)
    analysis = xb.check_broken_dispatch(b, None)
    _check_table(b, analysis, "wide_switch")  # the other switches of the build still resolve


def test_function_cfg_method_shows_the_case_edges(arm_build, workspace):
    b = arm_build("gcc", ("-mthumb", "-O2"))
    workspace.open(str(b.no_eh), check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})
    cfg = invoke(workspace, "function.cfg", {"selector": {"address": hex(b.labels["wide_switch"])}})
    targets = {int(e["dst"], 16) for e in cfg["edges"] if e["kind"] == "jump_table"}
    assert targets == {b.labels[c] for c in b.tables["wide_switch"].cases}
    tbh = b.labels[b.tables["wide_switch"].label] - 4
    listing = invoke(
        workspace,
        "instruction.list",
        {"scan": {"range": {"start": hex(tbh), "end": hex(tbh + 4)}}, "page": {"limit": 1}},
    )
    assert [(i["mnemonic"], i["flow"]) for i in listing["items"]] == [("tbh", "indirect_jump")]


def _mapping(img: object) -> tuple[list[int], list[str]]:
    maps = sorted((s.address & ~1, s.name[:2]) for s in img.symbols if s.name[:2] in ("$a", "$t", "$d"))  # type: ignore[attr-defined]
    return [a for a, _ in maps], [m for _, m in maps]


def test_corpus_tables_lie_in_their_functions_and_keep_their_mode():
    """A third-party gcc Thumb-2 build with FUNC and mapping symbols: every case target lies inside
    the function holding the jump, in code of the jump's state ($t), never in data ($d); every
    table read lies in data; no case target became a function."""
    import bisect

    path = corpus_dir("elf") / "thumb-movpcadd"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    img = parse_path(str(path))
    addrs, kinds = _mapping(img)

    def kind(va: int) -> str:
        return kinds[bisect.bisect_right(addrs, va) - 1]

    analysis = analyze(img)
    cases = xb.assert_corpus_cases(img, analysis, thumb_bit=True)
    jumps = {src for src, _ in cases}
    assert len(jumps) >= 41, f"{len(jumps)} tables resolved (41 measured on 2026-11-30)"
    for src, dst in cases:
        assert kind(dst) == kind(src) and kind(dst) in ("$a", "$t"), (hex(src), hex(dst), kind(dst))
    reads = [x for x in analysis.xrefs if x.kind == "read" and x.src in jumps]
    assert reads and all(kind(x.dst) == "$d" for x in reads)
