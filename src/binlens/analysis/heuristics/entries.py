"""Tests of code that starts like a function, one instruction set each (the first bytes only).

The gap stage's fuller prologue tests of MIPS, PowerPC and RISC-V (PIC entries, frame
allocations a few instructions in) are `prologues.GapPrologues`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from binlens.analysis.codemap import CodeMap
from binlens.loader.image import Image

X86_PROLOGUES = (
    b"\xf3\x0f\x1e\xfa",  # endbr64
    b"\xf3\x0f\x1e\xfb",  # endbr32
    b"\x55\x48\x89\xe5",  # push rbp; mov rbp, rsp
    b"\x55\x89\xe5",  # push ebp; mov ebp, esp
    b"\x55\x8b\xec",  # push ebp; mov ebp, esp (MSVC)
    b"\x8b\xff\x55",  # mov edi, edi; push ebp (hot-patch)
    b"\x41\x57",  # push r15
    b"\x41\x56",  # push r14
    b"\x41\x55",  # push r13
    b"\x41\x54",  # push r12
    b"\x48\x83\xec",  # sub rsp, imm8
    b"\x48\x81\xec",  # sub rsp, imm32
    b"\x53\x48\x83\xec",  # push rbx; sub rsp
    b"\x55\x53",  # push rbp; push rbx
    b"\x48\x89\x5c\x24",  # mov [rsp+x], rbx (MSVC x64)
    b"\x40\x53",  # push rbx (REX, MSVC x64)
    b"\x40\x55",  # push rbp (REX, MSVC x64)
)
_A64_PAD = (0xD503201F, 0)  # nop, zero padding


def starts_like_function(codemap: CodeMap, va: int) -> bool:
    """Does x86 code at `va` begin with one of `X86_PROLOGUES`?"""
    r = codemap.region(va)
    return r is not None and r.data.startswith(X86_PROLOGUES, va - r.va)


def a64_prologue(w: int) -> bool:
    """Is the AArch64 word `w` a function's first instruction: `stp x29, x30, [sp, #-N]!`,
    `paciasp`, `bti c` or `sub sp, sp, #N`?"""
    return w & 0xFFC07FFF == 0xA9807BFD or w in (0xD503233F, 0xD503245F) or w & 0xFF0003FF == 0xD10003FF


def prologue_test(image: Image, codemap: CodeMap, mips: Callable[[int], bool] | None) -> Callable[[int], bool] | None:
    """A test for AArch64, RISC-V, PowerPC or MIPS code that starts like a function (None for other
    architectures): AArch64 `a64_prologue`; RISC-V `addi sp, sp, -N` (or `c.addi16sp`); PowerPC
    `stwu`/`stdu r1, -N(r1)`, `mflr r0`, a PPC64 global entry (`addis r2, r12` / `lis r2`); MIPS
    `mips`, the test `mips_prologue` made."""
    arch = image.identity.arch
    if arch == "mips":
        return mips
    if arch not in ("aarch64", "riscv", "ppc"):
        return None
    little = image.identity.endian == "little" or arch == "aarch64"
    word = struct.Struct("<I" if little else ">I")
    half = struct.Struct("<H")

    def test(va: int) -> bool:
        r = codemap.region(va)
        off = va - r.va if r is not None else -1
        if r is None or off + 2 > len(r.data) or va & (1 if arch == "riscv" else 3):
            return False
        if arch == "riscv":
            (h,) = half.unpack_from(r.data, off)
            if h & 3 != 3:  # compressed: `c.addi16sp sp, -N`
                return h & 0xEF83 == 0x6101 and bool(h & 0x1000)
        if off + 4 > len(r.data):
            return False
        (w,) = word.unpack_from(r.data, off)
        if arch == "riscv":
            return w & 0xFFFFF == 0x10113 and bool(w >> 31)  # addi sp, sp, -N
        if arch == "aarch64":
            return a64_prologue(w)
        return (
            w >> 16 == 0x9421
            and bool(w & 0x8000)  # stwu r1, -N(r1)
            or w & 0xFFFF8003 == 0xF8218001  # stdu r1, -N(r1)
            or w == 0x7C0802A6  # mflr r0
            or w >> 16 in (0x3C4C, 0x3C40)  # addis r2, r12, hi / lis r2, hi: a PPC64 global entry
        )

    return test


def mips_prologue(image: Image, codemap: CodeMap) -> Callable[[int], bool]:
    """A test for MIPS code that starts like a function: `addiu`/`daddiu $sp, $sp, -N` or `lui $gp, ...`
    (`.cpload`). Used to take function pointers in data before the rest (case labels in switch tables)."""
    word = struct.Struct("<I" if image.identity.endian == "little" else ">I")

    def test(va: int) -> bool:
        r = codemap.region(va)
        off = va - r.va if r is not None else -1
        if r is None or va & 3 or off + 4 > len(r.data):
            return False
        (w,) = word.unpack_from(r.data, off)
        return (w >> 16) in (0x27BD, 0x67BD) and w & 0x8000 != 0 or w >> 16 == 0x3C1C

    return test


def after_a64_end(codemap: CodeMap, va: int) -> bool:
    """Is the last non-padding AArch64 word before `va` an unconditional end of flow (`ret`, `b`,
    `br`, `brk`, `udf`), or is there none? Code right after a call that was taken as returning
    (or a conditional branch) is the rest of a function, not the entry of another one."""
    r = codemap.region(va)
    if r is None or va % 4:
        return False
    off = va - r.va - 4
    while off >= 0:
        (w,) = struct.unpack_from("<I", r.data, off)
        if w not in _A64_PAD:
            break
        off -= 4
    else:
        return True
    return (
        w & 0xFFFFFC1F == 0xD65F0000  # ret
        or w & 0xFC000000 == 0x14000000  # b
        or w & 0xFFFFFC1F == 0xD61F0000  # br
        or w & 0xFFE0001F == 0xD4200000  # brk
        or w >> 16 == 0  # udf
        or w in (0xD65F0BFF, 0xD65F0FFF)  # retaa, retab
    )
