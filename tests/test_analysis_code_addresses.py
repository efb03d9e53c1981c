"""Code addresses formed by instruction pairs: callbacks become functions, strings get references.

`tests/fixtures/src/callbacks.c` passes static functions as values (a sort comparator, a signal
handler, the members of a function-pointer struct filled at run time) and the address of a string
constant. It is cross-compiled by gcc for AArch64 (`adrp` + `add`), RISC-V 64 (`auipc`/`lui` +
`addi`), PowerPC 32 (`lis` + `addi`), PPC64 ELFv2 (`addis rN, r2` + `addi`: TOC-relative) and MIPS
(`lui` + `addiu`; PIC: `lw %got(page)($gp)` + `addiu %lo`), position-independent and not, at -O0 and
-O2, linked freestanding, stripped of its symbols and of `.eh_frame`. Nothing else names the
callbacks: each must be found as a function from the address its caller forms, and the string's
reference must be recorded at the instruction that completes its address.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode.capstone_backend import CapstoneBackend
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "callbacks.c"
CALLBACKS = ("compare_ints", "catch_signal", "arena_alloc", "arena_release")
# arch -> (triple, extra compiler flags, PIC flags, non-PIC flags)
TARGETS = {
    "aarch64": ("aarch64-linux-gnu", (), ("-fPIE",), ("-fno-pic", "-fno-pie")),
    "riscv": ("riscv64-linux-gnu", (), ("-fPIE",), ("-fno-pic", "-fno-pie")),
    "ppc": ("powerpc-linux-gnu", (), ("-fPIE",), ("-fno-pic", "-fno-pie")),
    "ppc64": ("powerpc64le-linux-gnu", (), ("-fPIE",), ("-fno-pic", "-fno-pie")),
    "mips": ("mips-linux-gnu", (), (), ("-fno-pic", "-mno-abicalls")),
}
# the instruction that completes an address (the second of its pair)
LOW_PARTS = {"aarch64": {"add"}, "riscv": {"addi"}, "ppc": {"addi"}, "ppc64": {"addi"}, "mips": {"addiu"}}


def _build(out_dir: Path, arch: str, opt: str, pic: bool) -> xb.Build:
    triple, extra, pic_flags, fixed_flags = TARGETS[arch]
    cc = xb.toolchain("gcc", triple)
    tag = f"callbacks-{arch}{opt}-{'pic' if pic else 'nopic'}"
    flags = [opt, "-fno-inline", *extra, *(pic_flags if pic else fixed_flags)]
    link = ("--discard-none", *(["-pie"] if pic and arch != "mips" else []))
    b = xb.cross_build(out_dir, triple, cc, flags, tag, src=SRC, ld_flags=link)
    b.arch = arch
    return b


callbacks_build = xb.build_fixture("callbacks", _build)

BUILDS = [(arch, opt, pic) for arch in TARGETS for opt in ("-O0", "-O2") for pic in (True, False)]


def _low_part(image: object, arch: str, va: int) -> str:
    """The mnemonic of the instruction at `va`."""
    backend = CapstoneBackend(image, CodeMap(image))  # type: ignore[arg-type]
    ins = next(backend.md(False).disasm(image.read(va, 4), va, 1))  # type: ignore[attr-defined]
    return ins.mnemonic.removeprefix("c.")


@pytest.mark.parametrize("arch,opt,pic", BUILDS, ids=[f"{a}{o}-{'pic' if p else 'nopic'}" for a, o, p in BUILDS])
def test_callbacks_are_functions_and_the_string_is_referenced(callbacks_build, arch, opt, pic):
    build = callbacks_build(arch, opt, pic)
    image = parse_path(str(build.no_eh))
    analysis = analyze(image)
    starts = {f.address for f in analysis.functions}
    main = xb.function_of(analysis, build, "main")
    missing = [name for name in CALLBACKS if build.labels[name] not in starts]
    assert not missing, (arch, opt, pic, missing)
    # every callback is reached from the address main forms, not guessed from a gap
    for name in CALLBACKS:
        f = xb.function_at(analysis, build.labels[name])
        assert "pointer" in f.sources, (name, f.sources)
    # nothing inside the callbacks or main became a function of its own
    for name in (*CALLBACKS, "main"):
        lo, hi = build.labels[name], build.labels[name] + build.sizes[name]
        inside = [hex(s) for s in starts if lo < s < hi and not (arch == "ppc64" and s == lo + 8)]
        assert not inside, (name, inside)
    greeting = build.labels["greeting"]
    assert any(s.address == greeting for s in analysis.strings)
    refs = [x for x in analysis.xrefs if x.dst == greeting]
    assert refs, "no reference to the string"
    assert {x.kind for x in refs} == {"string"}
    (ref,) = [x for x in refs if any(b.start <= x.src < b.end for b in main.blocks)]
    # PowerPC 32 PIC loads the address from its GOT slot (`lwz rN, off(r30)`, r30 the PIC base)
    expected = LOW_PARTS[arch] | ({"lwz"} if arch == "ppc" and pic else set())
    assert _low_part(image, arch, ref.src) in expected, hex(ref.src)


@pytest.mark.parametrize("arch", ["riscv", "mips"])
def test_string_list_counts_the_reference_formed_by_the_pair(callbacks_build, workspace, arch):
    """Through the API: `string.list` counts the pair's reference to the string, and `reference.list`
    names the instruction in `main` that completes the address."""
    from binlens.api import invoke

    build = callbacks_build(arch, "-O2", True)
    workspace.open(build.no_eh, check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})
    items = invoke(workspace, "string.list", {"regex": "^callbacks: hello"})["items"]
    assert [s["address"] for s in items] == [hex(build.labels["greeting"])]
    assert items[0]["references"] == 1
    (ref,) = invoke(workspace, "reference.list", {"address": hex(build.labels["greeting"])})["items"]
    assert ref["kind"] == "string"
    assert ref["function"] == hex(build.labels["main"]), ref
