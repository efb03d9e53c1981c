"""PLT thunks named after their import on RISC-V, ARM and MIPS (x86 and AArch64: `test_analysis_engine.py`).

`tests/fixtures/src/plt_exit.c` calls `puts` and `exit` through the PLT. Cross-compiled with the
Debian gcc and its libc (PIE, stripped): each PLT entry must be a function named after its import
(the truth is the unstripped build's `name@plt` view in `objdump -d`), and the thunk of `exit`
must be known not to return, so the call to it ends its block (the code after it is not the
fall-through of the call).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "plt_exit.c"
TRIPLES = {
    "riscv64-linux-gnu": (),
    "arm-linux-gnueabihf": ("-marm",),
    "arm-linux-gnueabihf-thumb": ("-mthumb",),
    "arm-linux-gnueabihf-nopie": ("-mthumb", "-fno-pie", "-no-pie"),
    "mips-linux-gnu": (),
    "mipsel-linux-gnu": (),
    "mips64-linux-gnuabi64": (),
    "powerpc-linux-gnu": (),
    "powerpc64le-linux-gnu": (),
}


@pytest.fixture(scope="session")
def plt_build(tmp_path_factory: pytest.TempPathFactory):
    """plt_build(key) -> (unstripped, stripped) of the fixture for TRIPLES[key] (cached)."""
    out_dir = tmp_path_factory.mktemp("pltcross")
    cache: dict[str, tuple[Path, Path]] = {}

    def build(key: str) -> tuple[Path, Path]:
        if key not in cache:
            triple = key.removesuffix("-thumb").removesuffix("-nopie")
            gcc = shutil.which(f"{triple}-gcc")
            if gcc is None or not Path(f"/usr/{triple}/lib").is_dir():
                pytest.skip(f"{triple}-gcc or its libc is missing (Debian packages gcc-{triple}, libc6-dev-*-cross)")
            exe, stripped = out_dir / key, out_dir / f"{key}.stripped"
            flags = ["-O2", "-fPIE", "-pie", *TRIPLES[key]]
            subprocess.run([gcc, *flags, "-o", exe, SRC], check=True, capture_output=True)
            subprocess.run([f"{triple}-strip", "-s", "-o", stripped, exe], check=True, capture_output=True)
            cache[key] = (exe, stripped)
        return cache[key]

    return build


def _plt_entries(exe: Path, triple: str) -> dict[int, str]:
    """`name@plt` -> address, from the unstripped build's disassembly."""
    text = subprocess.run([f"{triple}-objdump", "-d", "-j", ".plt", str(exe)], capture_output=True, text=True).stdout
    return {int(a, 16): n for a, n in re.findall(r"^([0-9a-f]+) <(\w+)@plt>:", text, re.M)}


@pytest.mark.parametrize("key", [k for k in TRIPLES if not k.startswith(("mips", "powerpc")) and "nopie" not in k])
def test_plt_thunks_carry_their_import_names(plt_build, key):
    exe, stripped = plt_build(key)
    entries = _plt_entries(exe, key.removesuffix("-thumb"))
    assert {"puts", "exit"} <= set(entries.values()), entries
    functions = {f.address: f for f in analyze(parse_path(str(stripped))).functions}
    named = {va: functions[va].thunk_name for va in entries if va in functions}
    assert named == entries, {hex(va): (n, named.get(va)) for va, n in entries.items() if named.get(va) != n}
    (exit_thunk,) = (va for va, n in entries.items() if n == "exit")
    assert functions[exit_thunk].noreturn
    image = parse_path(str(exe))
    checked = next(s.address & ~1 for s in image.symbols if s.name == "checked")
    f = functions[checked]
    calls = [site for site, callee in f.call_pairs() if callee == exit_thunk]
    assert calls, "checked does not call exit's thunk"
    (block,) = (b for b in f.blocks if b.start <= calls[0] < b.end)
    assert not [e for e in f.edges if e.src == block.start], "the call to exit falls through"


MIPS = ("mips-linux-gnu", "mipsel-linux-gnu", "mips64-linux-gnuabi64")


def _mips_stubs(exe: Path, triple: str) -> dict[int, str]:
    """The lazy-binding stub of each imported function: the value of its undefined dynamic symbol."""
    text = subprocess.run([f"{triple}-readelf", "-W", "--dyn-syms", str(exe)], capture_output=True, text=True).stdout
    found = re.findall(r"^\s*\d+: ([0-9a-f]+)\s+\d+ FUNC\s+\w+\s+\w+\s+UND (\w+)", text, re.M)
    return {int(v, 16): n for v, n in found if int(v, 16)}


@pytest.mark.parametrize("triple", MIPS)
def test_mips_imports_stubs_and_calls_through_the_got(plt_build, triple):
    """MIPS binds imports through the GOT's global entries, with no relocation: the loader gives
    each its slot, `.MIPS.stubs` entries are thunks named after theirs, and PIC code's
    `lw $t9, %call16(exit)($gp); jalr $t9` is a call through exit's slot that does not return."""
    exe, stripped = plt_build(triple)
    stubs = _mips_stubs(exe, triple)
    assert {"puts", "exit"} <= set(stubs.values()), stubs
    image = parse_path(str(stripped))
    slots = {imp.name: imp.slot for imp in image.imports}
    assert {"puts", "exit", "__libc_start_main"} <= set(slots), slots
    got = subprocess.run([f"{triple}-readelf", "-A", str(exe)], capture_output=True, text=True).stdout
    truth_slots = {n: int(a, 16) for a, n in re.findall(r"^\s+([0-9a-f]+) -\d+\(gp\).* UND (\w+)$", got, re.M)}
    assert {n: slots[n] for n in truth_slots} == truth_slots
    result = analyze(image)
    functions = {f.address: f for f in result.functions}
    named = {va: functions[va].thunk_name for va in stubs if va in functions}
    assert named == stubs
    (exit_stub,) = (va for va, n in stubs.items() if n == "exit")
    (puts_stub,) = (va for va, n in stubs.items() if n == "puts")
    assert functions[exit_stub].noreturn
    assert not functions[puts_stub].noreturn  # (a stub calls the lazy resolver: it returns as its import does)
    checked = next(s.address for s in parse_path(str(exe)).symbols if s.name == "checked")
    f = functions[checked]
    # the call through exit's GOT entry is a call to exit's thunk (its stub): callers of exit are found
    calls = [site for site, callee in f.call_pairs() if callee == exit_stub]
    assert calls, f"checked's call through exit's GOT entry is not found: {f.call_pairs()}"
    reads = [x.src for x in result.xrefs if x.dst == slots["exit"] and x.kind == "read"]
    assert [a for a in reads if calls[0] - 16 <= a < calls[0]], "the load of exit's GOT entry is no reference to it"
    (block,) = (b for b in f.blocks if b.start <= calls[0] < b.end)
    assert not [e for e in f.edges if e.src == block.start], "the call to exit falls through"
    # crt1's `__start` reads its PC with `bal 1f; nop; 1:`: not a call, so no function starts there
    entry = image.identity.entry
    assert entry in functions and entry + 8 not in functions


@pytest.mark.parametrize(
    "key",
    ["mips-linux-gnu", "riscv64-linux-gnu", *(f"arm-linux-gnueabihf{k}" for k in ("", "-thumb", "-nopie"))],
)
def test_listing_shows_what_instruction_pairs_and_got_calls_reference(workspace, plt_build, key):
    """What the analysis found an instruction references but the instruction alone does not say
    (a string's address formed by `auipc`+`addi` or `lw`+`addiu`, an ARM literal pool's offset
    completed by `add rX, pc`, or the address a literal holds in code at a fixed address, a call
    through a GOT slot) shows in the listing's comments, as it does on x86."""
    from binlens.api import invoke

    exe, stripped = plt_build(key)
    symbols = {s.name: s.address & ~1 for s in parse_path(str(exe)).symbols}
    workspace.open(str(stripped), check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})
    after = invoke(workspace, "listing.get", {"selector": {"address": hex(symbols["after_exit"])}, "format": "both"})
    assert [ln for ln in after["lines"] if ln.get("comment") == '"after"'], after["text"]
    if key.startswith("mips"):
        checked = invoke(workspace, "listing.get", {"selector": {"address": hex(symbols["checked"])}, "format": "both"})
        (call,) = [ln for ln in checked["lines"] if ln["kind"] == "instruction" and ln["text"].startswith("jalr")]
        assert call["comment"] == "exit", checked["text"]


@pytest.mark.parametrize("triple", ["powerpc-linux-gnu", "powerpc64le-linux-gnu"])
def test_powerpc_call_stubs_are_named_after_the_import_they_load(plt_build, triple):
    """PowerPC call stubs in .text are thunks named after the import whose PLT slot they load: 32-bit
    secure-PLT `lwz r11, d(r30); mtctr r11; bctr` (r30 the caller's `.got2` + 0x8000 or GOT pointer),
    64-bit `std r2, 24(r1); ld r12, d(r2); mtctr r12; bctr` (r2 the TOC pointer). The truth: the
    unstripped build's `*.plt_pic32.NAME` / `*.plt_call.NAME` symbols. The call to exit's stub ends
    its block."""
    exe, stripped = plt_build(triple)
    text = subprocess.run([f"{triple}-objdump", "-d", str(exe)], capture_output=True, text=True).stdout
    found = re.findall(r"^([0-9a-f]+) <[0-9a-f]+\.(?:got2\.)?plt_(?:pic32|call)\.(\w+)(?:@[\w.@]+)?>:", text, re.M)
    stubs = {int(a, 16): n for a, n in found}
    assert {"puts", "exit", "__libc_start_main"} <= set(stubs.values()), stubs
    functions = {f.address: f for f in analyze(parse_path(str(stripped))).functions}
    assert {va: functions[va].thunk_name for va in stubs if va in functions} == stubs
    (exit_stub,) = (va for va, n in stubs.items() if n == "exit")
    assert functions[exit_stub].noreturn
    assert functions[exit_stub].size in (12, 16)  # the stub, not the linker's unwind range over all of them
    checked = next(s.address for s in parse_path(str(exe)).symbols if s.name == "checked")
    f = functions[checked]
    (site,) = [site for site, callee in f.call_pairs() if callee == exit_stub]
    (block,) = (b for b in f.blocks if b.start <= site < b.end)
    assert not [e for e in f.edges if e.src == block.start], "the call to exit falls through"
