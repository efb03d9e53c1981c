"""PowerPC 32 and RISC-V 64 dispatch shapes the corpus showed unresolved, rebuilt small.

`tests/fixtures/src/switch_ppcrv.c` is compiled by gcc (the Debian cross compilers) for
powerpc-linux-gnu and riscv64-linux-gnu at -O0 and -O2, position-independent (`-fPIC`, linked
`-pie`): on PowerPC 32 the tables are reached through the PIC register r30 and the GOT, which
without `.eh_frame` (and without symbols) no function extent locates; on RISC-V the shapes are a
dispatch reached only by a conditional branch (`bgeu N, i, 1f; j default; 1:`, the assembler's
answer to a default beyond 4 KiB), the index kept in s0 across a call, a 16-bit index zero-extended
by two shifts, and a loop entered by a conditional branch with its table address set before the
loop. The truth is read from the assembly (each table's entries name their case labels) and the
unstripped build's local labels; the engine runs on the stripped build, with and without `.eh_frame`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "switch_ppcrv.c"
TRIPLES = {"ppc": "powerpc-linux-gnu", "riscv": "riscv64-linux-gnu"}
_ENTRY = re.compile(r"^\s*\.(?:long|word|4byte)\s+(\.L\w+)(?:\s*-\s*(\.L\w+))?\s*(?:#.*)?$")
SWITCHES = {"far_default": 12, "after_call": 12, "short_switch": 12, "scan_mode": 22}  # entries ('+'..'@')
_JUMP = r"\n\s*(?:bctr|jr)\b"


def _entry(m: re.Match[str], label: str) -> bool:
    """Relative to the table itself, or absolute; not gcc's `.LC0: .long .L4` GOT slot of a table."""
    return (m.group(2) is None or m.group(2) == label) and not label.startswith(".LC")


def _build(out_dir: Path, arch: str, opt: str) -> xb.Build:
    triple = TRIPLES[arch]
    cc = xb.toolchain("gcc", triple)
    # --discard-none: RISC-V ld drops `.L` labels by default
    b = xb.cross_build(
        out_dir, triple, cc, [opt, "-fPIC"], f"{arch}-gcc{opt}-pic", src=SRC, ld_flags=("--discard-none", "-pie")
    )
    b.arch = arch
    b.tables = xb.tables_by_function(xb.asm_tables(b.asm, _ENTRY, accept=_entry))
    return b


shapes_build = xb.build_fixture("ppcrv_shapes", _build)  # shapes_build(arch, opt) -> xb.Build

BUILDS = [(arch, opt) for arch in ("ppc", "riscv") for opt in ("-O0", "-O2")]


@pytest.mark.parametrize("arch,opt", BUILDS, ids=[f"{a}-gcc{o}-pic" for a, o in BUILDS])
def test_every_case_label_of_each_shape_is_a_jump_table_target(shapes_build, arch, opt):
    b = shapes_build(arch, opt)
    for eh in (True, False):
        analysis = analyze(parse_path(str(b.stripped if eh else b.no_eh)))
        for func in SWITCHES:
            assert func in b.tables, f"{arch} gcc {opt} emitted no table for {func}"
            assert xb.guarded(b.asm, func, _JUMP, r"\b(cmplwi?|bltu|bgtu|bgeu|bleu)\b")
            _label, cases = b.tables[func]
            assert len(cases) == SWITCHES[func], (func, len(cases))
            function = xb.function_of(analysis, b, func)
            xb.assert_cases(analysis, function, {b.labels[c] for c in cases}, (arch, opt, func, eh))
        if eh:  # nothing but the six functions of the source: no case block became a function
            starts = {f.address for f in analysis.functions}
            assert len(starts) == 6, sorted(map(hex, starts))


def _disasm(b: xb.Build, func: str) -> list[str]:
    """objdump of `func` in the unstripped build (the assembler may rewrite branches)."""
    import subprocess

    start = b.labels[func]
    out = subprocess.run(
        [
            f"{TRIPLES[b.arch]}-objdump",
            "-d",
            "--no-show-raw-insn",
            f"--start-address={start}",
            f"--stop-address={start + b.sizes[func]}",
            str(b.exe),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split("\t", 1)[1] for line in out.splitlines() if re.match(r"^\s+[0-9a-f]+:\t", line)]


def test_the_builds_have_the_shapes_of_the_corpus(shapes_build):
    """The shapes above are really emitted (this fails if a compiler or assembler changes them)."""
    seen = set()
    for (arch, opt), b in xb.every_build(shapes_build, BUILDS):
        if arch == "ppc":
            if re.search(r"\bbcl 20,31,", b.asm) and re.search(r"lwz \d+,\.LC\d+-\.LCTOC1\(30\)", b.asm):
                seen.add("ppc got table")
            continue
        code = "\n".join(_disasm(b, "far_default"))
        if opt == "-O0" and re.search(r"\bbgeu\s.*\n\s*j\s", code):
            seen.add("rv far guard")
        if opt == "-O2":
            if re.search(r"\bslli?\s+s0,s0,0x2\b", "\n".join(_disasm(b, "after_call"))):
                seen.add("rv index in s0")
            if re.search(r"\bslli?\s+\w+,\w+,0x30\b", "\n".join(_disasm(b, "short_switch"))):
                seen.add("rv 16-bit extension")
            if re.search(r"\bbnez\s.*\n\s*j\s", "\n".join(_disasm(b, "scan_mode"))):
                seen.add("rv loop entered by bnez")
    expected = {"ppc got table", "rv far guard", "rv index in s0", "rv 16-bit extension", "rv loop entered by bnez"}
    assert expected <= seen, expected - seen
