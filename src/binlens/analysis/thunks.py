"""Import thunks: PLT entries, PE IAT jumps and Mach-O stubs, named after the import they reach.

A thunk is found from the bytes, not from being called: x86 `jmp [slot]` (`ff 25`, RIP-relative
on x86-64, absolute on x86; `ff a3` through the GOT register on i386 PIC), AArch64
`adrp x16, page; ldr xN, [x16, #off]` pairs, RISC-V `auipc t3, hi; l{d,w} t3, lo(t3)`, and ARM
`add ip, pc, #a; add ip, ip, #b; ldr pc, [ip, #c]!` (with the Thumb `bx pc; nop` before it where
there is one), where the slot is the loader's GOT/IAT/lazy-pointer entry of an import; on MIPS,
the `.MIPS.stubs` entry or PLT entry the import's dynamic symbol names. A thunk of
a function that does not return (`exit`, `abort`, `__assert_fail`, ...) tells discovery that calls
to it end their block.
"""

from __future__ import annotations

import re
import struct

from binlens.analysis.codemap import CodeMap
from binlens.loader.image import Image

_STUB_SECTIONS = (
    ".plt",
    ".plt.sec",
    ".plt.got",
    ".iplt",
    "__stubs",
    "__symbol_stub",
    "__symbol_stub1",
    "__picsymbolstub",
)
_JMP_MEM = re.compile(rb"\xff\x25", re.S)
_JMP_EBX = re.compile(rb"\xff\xa3", re.S)


def _is_stub_section(name: str) -> bool:
    tail = name.rsplit(",", 1)[-1]
    return tail in _STUB_SECTIONS or tail.startswith("__stub")


def find_thunks(image: Image, codemap: CodeMap) -> dict[int, str]:
    """Thunk start address -> import name."""
    by_slot = {imp.slot: imp.name for imp in image.imports}
    if not by_slot:
        return {}
    arch = image.identity.arch
    out: dict[int, str] = {}
    fmt = image.identity.format
    for r in codemap.regions:
        stubby = _is_stub_section(r.name)
        if arch in ("x86-64", "x86") and (stubby or fmt == "PE"):
            _x86_thunks(image, r.va, r.data, by_slot, out)
        elif stubby and arch in _ELF_PLT:
            _ELF_PLT[arch](image, r.va, r.data, by_slot, out)
    # sections that the code map merged or named differently (ELF .plt.sec inside .plt, ...)
    if fmt != "PE":
        for s in image.sections:
            if _is_stub_section(s.name) and s.kind == "code" and not any(r.va == s.va for r in codemap.regions):
                data = bytes(image.data[s.offset : s.offset + s.fsize])
                if arch in ("x86-64", "x86"):
                    _x86_thunks(image, s.va, data, by_slot, out)
                elif arch in _ELF_PLT:
                    _ELF_PLT[arch](image, s.va, data, by_slot, out)
    if arch == "mips":
        _mips_stubs(image, codemap, out)
    return out


def _mips_stubs(image: Image, codemap: CodeMap, out: dict[int, str]) -> None:
    """MIPS: the lazy-binding stub (`.MIPS.stubs`) or PLT entry of an import is the value of its
    undefined dynamic symbol (`mips_got`); the stub starts `lw`/`ld $t9, -0x7ff0($gp)` (the lazy
    resolver's GOT entry) and a PLT entry `lui $t7, hi`, or the address is no thunk."""
    big = image.identity.endian == "big"
    for imp in image.imports:
        if imp.stub is None or not codemap.contains(imp.stub):
            continue
        word = image.read(imp.stub, 4)
        if word is None or len(word) < 4:
            continue
        w = int.from_bytes(word, "big" if big else "little")
        if w in (0x8F998010, 0xDF998010) or w >> 16 == 0x3C0F:
            out.setdefault(imp.stub, imp.name)


def _x86_thunks(image: Image, va: int, data: bytes, by_slot: dict[int, str], out: dict[int, str]) -> None:
    bits64 = image.identity.bits == 64
    for m in _JMP_MEM.finditer(data):
        i = m.start()
        if i + 6 > len(data):
            break
        (disp,) = struct.unpack_from("<i" if bits64 else "<I", data, i + 2)
        slot = (va + i + 6 + disp) if bits64 else disp
        name = by_slot.get(slot)
        if name is None:
            continue
        start = i
        if start >= 1 and data[start - 1] == 0xF2:  # bnd jmp
            start -= 1
        if start >= 4 and data[start - 4 : start] in (b"\xf3\x0f\x1e\xfa", b"\xf3\x0f\x1e\xfb"):
            start -= 4
        out.setdefault(va + start, name)
    if not bits64 and image.identity.format == "ELF":
        got = next((s.va for s in image.sections if s.name == ".got.plt"), None)
        if got is None:
            return
        for m in _JMP_EBX.finditer(data):
            i = m.start()
            if i + 6 > len(data):
                break
            (disp,) = struct.unpack_from("<i", data, i + 2)
            name = by_slot.get(got + disp)
            if name is not None:
                start = i - 4 if i >= 4 and data[i - 4 : i] == b"\xf3\x0f\x1e\xfb" else i
                out.setdefault(va + start, name)


def _arm64_thunks(image: Image, va: int, data: bytes, by_slot: dict[int, str], out: dict[int, str]) -> None:
    words = struct.unpack_from(f"<{len(data) // 4}I", data)
    for k in range(len(words) - 1):
        w = words[k]
        if w & 0x9F000000 != 0x90000000:  # ADRP
            continue
        rd = w & 0x1F
        imm = ((w >> 29) & 3) | (((w >> 5) & 0x7FFFF) << 2)
        if imm & (1 << 20):
            imm -= 1 << 21
        pc = va + 4 * k
        page = (pc & ~0xFFF) + (imm << 12)
        w2 = words[k + 1]
        if w2 & 0xFFC00000 != 0xF9400000 or (w2 >> 5) & 0x1F != rd:  # LDR Xt, [Xn, #imm]
            continue
        slot = page + ((w2 >> 10) & 0xFFF) * 8
        name = by_slot.get(slot)
        if name is not None:
            out.setdefault(pc, name)


def _riscv_thunks(image: Image, va: int, data: bytes, by_slot: dict[int, str], out: dict[int, str]) -> None:
    """RISC-V PLT entries: `auipc t3, hi; ld t3, lo(t3)` (`lw` on RV32), slot = pc + hi + lo."""
    words = struct.unpack_from(f"<{len(data) // 4}I", data)
    load = 0x3003 if image.identity.bits == 64 else 0x2003  # ld / lw (opcode LOAD, funct3 3 / 2)
    for k in range(len(words) - 1):
        w = words[k]
        if w & 0xFFF != 0xE17:  # AUIPC t3 (x28)
            continue
        w2 = words[k + 1]
        if w2 & 0x707F != load or (w2 >> 7) & 0x1F != 28 or (w2 >> 15) & 0x1F != 28:
            continue
        hi = w & 0xFFFFF000
        hi -= (1 << 32) if hi & 0x80000000 else 0
        lo = w2 >> 20
        lo -= (1 << 12) if lo & 0x800 else 0
        pc = va + 4 * k
        name = by_slot.get((pc + hi + lo) & ((1 << 64) - 1))
        if name is not None:
            out.setdefault(pc, name)


def _arm_thunks(image: Image, va: int, data: bytes, by_slot: dict[int, str], out: dict[int, str]) -> None:
    """ARM PLT entries (ARM state, little-endian words): `add ip, pc, #a; add ip, ip, #b;
    ldr pc, [ip, #c]!`, slot = pc + 8 + a + b + c; a Thumb `bx pc; nop` right before one is the
    thunk Thumb callers reach (its address with bit 0 set)."""
    if image.code_endian != "little":
        return
    words = struct.unpack_from(f"<{len(data) // 4}I", data)
    for k in range(len(words) - 2):
        w, w2, w3 = words[k], words[k + 1], words[k + 2]
        if w & 0xFFFFF000 != 0xE28FC000 or w2 & 0xFFFFF000 != 0xE28CC000 or w3 & 0xFFFFF000 != 0xE5BCF000:
            continue
        pc = va + 4 * k
        name = by_slot.get((pc + 8 + _arm_imm(w) + _arm_imm(w2) + (w3 & 0xFFF)) & 0xFFFFFFFF)
        if name is None:
            continue
        out.setdefault(pc, name)
        if k and words[k - 1] == 0x46C04778:  # Thumb `bx pc; nop` (78 47 c0 46)
            out.setdefault((pc - 4) | 1, name)


def _arm_imm(w: int) -> int:
    """The value of an ARM data-processing immediate (8 bits rotated right by twice 4 bits)."""
    rot = ((w >> 8) & 0xF) * 2
    imm = w & 0xFF
    return ((imm >> rot) | (imm << (32 - rot))) & 0xFFFFFFFF if rot else imm


_ELF_PLT = {"aarch64": _arm64_thunks, "riscv": _riscv_thunks, "arm": _arm_thunks}
