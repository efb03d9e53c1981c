"""Import thunks: PLT entries, PE IAT jumps and Mach-O stubs, named after the import they reach.

A thunk is found from the bytes, not from being called: x86 `jmp [slot]` (`ff 25`, RIP-relative
on x86-64, absolute on x86; `ff a3` through the GOT register on i386 PIC), and AArch64
`adrp x16, page; ldr xN, [x16, #off]` pairs, where the slot is the loader's GOT/IAT/lazy-pointer
entry of an import.
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
        elif arch == "aarch64" and stubby:
            _arm64_thunks(image, r.va, r.data, by_slot, out)
    # sections that the code map merged or named differently (ELF .plt.sec inside .plt, ...)
    if fmt != "PE":
        for s in image.sections:
            if _is_stub_section(s.name) and s.kind == "code" and not any(r.va == s.va for r in codemap.regions):
                data = bytes(image.data[s.offset : s.offset + s.fsize])
                if arch in ("x86-64", "x86"):
                    _x86_thunks(image, s.va, data, by_slot, out)
                elif arch == "aarch64":
                    _arm64_thunks(image, s.va, data, by_slot, out)
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
