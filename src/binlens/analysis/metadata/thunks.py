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

import bisect
import re
import struct
from typing import Literal

from binlens.analysis.arch.profiles import profile
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
    x86 = profile(arch).x86
    out: dict[int, str] = {}
    fmt = image.identity.format
    for r in codemap.regions:
        stubby = _is_stub_section(r.name)
        if x86 and (stubby or fmt == "PE"):
            _x86_thunks(image, r.va, r.data, by_slot, out)
        elif stubby and arch in _ELF_PLT:
            _ELF_PLT[arch](image, r.va, r.data, by_slot, out)
    # sections that the code map merged or named differently (ELF .plt.sec inside .plt, ...)
    if fmt != "PE":
        for s in image.sections:
            if _is_stub_section(s.name) and s.kind == "code" and not any(r.va == s.va for r in codemap.regions):
                data = bytes(image.data[s.offset : s.offset + s.fsize])
                if x86:
                    _x86_thunks(image, s.va, data, by_slot, out)
                elif arch in _ELF_PLT:
                    _ELF_PLT[arch](image, s.va, data, by_slot, out)
    if fmt == "MachO":  # the loader found each stub from the indirect symbol table
        for imp in image.imports:
            if imp.stub is not None:
                out.setdefault(imp.stub, imp.name)
    if arch == "mips":
        for va, name in mips_stubs(image, codemap).items():
            out.setdefault(va, name)
    elif arch == "ppc" and image.identity.bits == 32 and fmt == "ELF":
        for r in codemap.regions:
            _ppc32_call_stubs(image, r.va, r.data, by_slot, out)
    elif arch == "ppc" and fmt == "ELF":
        got = next((s.va for s in image.sections if s.name == ".got"), None)
        if got is not None:
            for r in codemap.regions:
                _ppc64_call_stubs(image, r.va, r.data, got + 0x8000, by_slot, out)
    return out


# PowerPC64 linker call stubs (`*.plt_call.NAME`): `std r2, 24(r1)` (ELFv2; 40(r1) in ELFv1), then
# `ld r12, d(r2)` or `addis r12, r2, hi; ld r12|r11, lo(r12)`, then `mtctr`: the slot is TOC + offset
_PPC64_SAVE_TOC = {
    "big": re.compile(rb"(?=\xf8\x41\x00[\x18\x28])", re.S),
    "little": re.compile(rb"(?=[\x18\x28]\x00\x41\xf8)", re.S),
}


def _ppc64_call_stubs(
    image: Image, va: int, data: bytes, toc: int, by_slot: dict[int, str], out: dict[int, str]
) -> None:
    """PowerPC64 call stubs named after the import whose PLT slot they load (the TOC pointer is
    `.got` + 0x8000, as the linker sets `.TOC.`)."""
    order = ">" if image.identity.endian == "big" else "<"
    for m in _PPC64_SAVE_TOC[image.identity.endian].finditer(data):
        i = m.start()
        if i % 4 or i + 12 > len(data):
            continue
        w1, w2 = struct.unpack_from(order + "II", data, i + 4)
        if w1 >> 16 == 0xE982:  # ld r12, d(r2)
            off = _s16(w1)
        elif w1 >> 16 == 0x3D82 and w2 >> 16 in (0xE98C, 0xE96C):  # addis r12, r2, hi; ld r12|r11, lo(r12)
            off = (_s16(w1) << 16) + _s16(w2)
        else:
            continue
        name = by_slot.get((toc + off) & 0xFFFFFFFFFFFFFFFF)
        if name is not None:
            out.setdefault(va + i, name)


def _s16(w: int) -> int:
    """The signed 16-bit immediate in the low half of an instruction word."""
    return (w & 0xFFFF) - 0x10000 if w & 0x8000 else w & 0xFFFF


# PowerPC 32-bit secure-PLT call stubs (in .text, one per caller object file and import):
# `lwz r11, d(r30); mtctr r11; bctr` in position-independent code, `lis r11, hi; lwz r11, lo(r11);
# mtctr r11; bctr` in code at a fixed address
# (lookaheads: a match at an odd offset must not hide an aligned one that overlaps it)
_PPC_PIC_STUB = re.compile(rb"(?=\x81\x7e..\x7d\x69\x03\xa6\x4e\x80\x04\x20)", re.S)
_PPC_ABS_STUB = re.compile(rb"(?=\x3d\x60..\x81\x6b..\x7d\x69\x03\xa6\x4e\x80\x04\x20)", re.S)
# `bcl 20,31,1f; 1:` (the PC) then `mflr r30`, `addis r30, r30, hi` and `addi r30, r30, lo` soon after
_PPC_PC = re.compile(rb"(?=\x42\x9f\x00\x05)", re.S)
# `bl target` (opcode 18, AA = 0, LK = 1: the last byte's low two bits are 01)
_PPC_BL = re.compile(rb"(?=[\x48-\x4b]..[" + b"".join(re.escape(bytes([b])) for b in range(1, 256, 4)) + rb"])", re.S)


def _ppc32_call_stubs(image: Image, va: int, data: bytes, by_slot: dict[int, str], out: dict[int, str]) -> None:
    """PowerPC (32-bit, big-endian) call stubs named after the import whose PLT slot they load.

    A PIC stub loads through r30, which its callers set to their object file's `.got2` + 0x8000
    (`-fPIC`) or to the GOT pointer (`-fpic`): the slot is r30 + d, with r30 read off each caller's
    `bcl 20,31,1f; 1: mflr r30; addis r30, r30, hi; addi r30, r30, lo` before its `bl` to the stub,
    the slot most callers agree on names the stub (the GOT pointer's, when no caller tells)."""
    if image.identity.endian != "big":
        return
    for m in _PPC_ABS_STUB.finditer(data):
        i = m.start()
        if i % 4 == 0:
            hi, lo = struct.unpack_from(">II", data, i)
            name = by_slot.get(((hi & 0xFFFF) << 16) + _s16(lo) & 0xFFFFFFFF)
            if name is not None:
                out.setdefault(va + i, name)
    aligned = [m.start() for m in _PPC_PIC_STUB.finditer(data) if m.start() % 4 == 0]
    stubs = {va + i: _s16(struct.unpack_from(">I", data, i)[0]) for i in aligned}  # address -> d
    if not stubs:
        return
    bases = []  # (address of the setup, r30 it sets)
    for m in _PPC_PC.finditer(data):
        i = m.start()
        if i % 4:
            continue
        words = struct.unpack_from(f">{min(16, (len(data) - i) // 4)}I", data, i)
        hi = lo = None
        for w in words[1:]:
            if w >> 16 == 0x3FDE:  # addis r30, r30, hi
                hi = w & 0xFFFF
            elif w >> 16 == 0x3BDE and hi is not None:  # addi r30, r30, lo
                lo = w & 0xFFFF
                break
        if 0x7FC802A6 in words and hi is not None and lo is not None:
            bases.append((va + i, (va + i + 4 + (hi << 16) + _s16(lo)) & 0xFFFFFFFF))
    got = next((s.va for s in image.sections if s.name == ".got"), None)
    votes: dict[int, dict[int, int]] = {a: {} for a in stubs}
    starts = [b for b, _v in bases]
    for m in _PPC_BL.finditer(data):
        i = m.start()
        if i % 4:
            continue
        (w,) = struct.unpack_from(">I", data, i)
        off = w & 0x03FFFFFC
        target = (va + i + (off - 0x04000000 if off & 0x02000000 else off)) & 0xFFFFFFFF
        d = stubs.get(target)
        if d is None:
            continue
        k = bisect.bisect_right(starts, va + i) - 1
        if k < 0 or va + i - starts[k] > 0x10000:
            continue
        slot = (bases[k][1] + d) & 0xFFFFFFFF
        if slot in by_slot:
            votes[target][slot] = votes[target].get(slot, 0) + 1
    for a, tally in votes.items():
        if tally:
            out.setdefault(a, by_slot[max(tally, key=tally.__getitem__)])
        elif got is not None and (got + 4 + stubs[a]) & 0xFFFFFFFF in by_slot:
            out.setdefault(a, by_slot[(got + 4 + stubs[a]) & 0xFFFFFFFF])  # `-fpic` callers: r30 is the GOT pointer


def mips_stubs(image: Image, codemap: CodeMap) -> dict[int, str]:
    """MIPS: stub address -> import name. The lazy-binding stub (`.MIPS.stubs`) or PLT entry of an
    import is the value of its undefined dynamic symbol (`mips_got`); the stub starts `lw`/`ld $t9,
    -0x7ff0($gp)` (the lazy resolver's GOT entry) and a PLT entry `lui $t7, hi`, or it is no thunk."""
    out: dict[int, str] = {}
    for imp in image.imports:
        if imp.stub is None or not codemap.contains(imp.stub):
            continue
        word = image.read(imp.stub, 4)
        if word is None or len(word) < 4:
            continue
        order: Literal["little", "big"] = "big" if image.identity.endian == "big" else "little"
        w = int.from_bytes(word, order)
        if w in (0x8F998010, 0xDF998010) or w >> 16 == 0x3C0F:
            out.setdefault(imp.stub, imp.name)
    return out


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
