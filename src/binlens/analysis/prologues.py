"""Function prologues of MIPS, PowerPC and RISC-V for the gap heuristic (code nothing reached).

Two kinds of evidence, most precise first:

- **Exact PIC entries**, wherever they lie in a gap: the MIPS o32 `.cpload $t9` (`lui $gp, hi;
  addiu $gp, $gp, lo; addu $gp, $gp, $t9`) and n64 `.cpsetup` (`lui $gp, hi; daddu $gp, $gp,
  $t9; daddiu $gp, $gp, lo`) add the function's own address to a constant to make `_gp`; the
  PPC64 ELFv2 global entry (`addis r2, r12, hi; addi r2, r2, lo`) does the same to make the TOC
  pointer. The sequence names its own address: hi<<16 + lo + address must be the image's `_gp`
  (TOC base), so one that passes is an entry and nothing else.
- **First-instruction prologues**, only at the first non-padding address of a gap: MIPS
  `addiu`/`daddiu $sp, $sp, -N`; PowerPC `stwu r1, -N(r1)` / `stdu r1, -N(r1)` and `mflr r0`
  followed by one of them; RISC-V `addi sp, sp, -N` (also `c.addi16sp` and `c.addi sp`).
"""

from __future__ import annotations

import re
import struct

from binlens.analysis.codemap import CodeMap, CodeRegion
from binlens.loader.image import Image

ARCHES = ("mips", "ppc", "riscv")
_MIPS_GP_BIAS = 0x7FF0  # _gp lies this far past the start of the MIPS GOT
_PPC64_TOC_BIAS = 0x8000  # .TOC. lies this far past the start of the PPC64 .got
_MIPS_ADDU_GP_T9 = 0x0399E021  # addu $gp, $gp, $t9
_MIPS_DADDU_GP_T9 = 0x0399E02D  # daddu $gp, $gp, $t9
_PPC_MFLR_R0 = 0x7C0802A6
_PPC_NOP = 0x60000000


def _s16(x: int) -> int:
    return x - 0x10000 if x & 0x8000 else x


class GapPrologues:
    """The prologue tests of one image (its architecture, byte order and `_gp`/TOC base)."""

    def __init__(self, image: Image, codemap: CodeMap, backend: object) -> None:
        """Read what the tests need from `image`: architecture, word size, byte order, PIC base
        (MIPS `_gp` as the jump-table resolver finds it, cached on `backend`)."""
        ident = image.identity
        self.arch = ident.arch
        self.bits = ident.bits or 32
        self.little = ident.endian == "little"
        self.word = struct.Struct("<I" if self.little else ">I")
        self.codemap = codemap
        self.mask = (1 << self.bits) - 1
        self.base: int | None = None  # MIPS _gp, PPC64 .TOC.
        if self.arch == "mips":
            from binlens.analysis.jumptable_mips import _gp

            self.base = _gp(backend, image)
        elif self.arch == "ppc" and self.bits == 64:
            toc = next((s.address for s in image.symbols if s.name == ".TOC."), None)
            if toc is None:
                got = next((s for s in image.sections if s.name == ".got"), None)
                toc = got.va + _PPC64_TOC_BIAS if got is not None else None
            self.base = toc
        self._exact: list[int] | None = None

    # ------------------------------------------------------------------ exact entries
    def exact_entries(self) -> list[int]:
        """Every address of code whose PIC base sequence names it as a function entry (computed once)."""
        if self._exact is None:
            out: list[int] = []
            if self.base is not None:
                for r in self.codemap.regions:
                    out.extend(self._exact_in(r))
            self._exact = sorted(out)
        return self._exact

    def _exact_in(self, r: CodeRegion) -> list[int]:
        data = r.data
        word = self.word
        align = (-r.va) % 4  # offsets of word-aligned addresses
        out = []
        if self.arch == "mips":
            # `lui $gp, hi` is 0x3c1c hhhh; look for its high half and check the rest by value
            pat = re.compile(re.escape(b"\x1c\x3c") if self.little else re.escape(b"\x3c\x1c"))
            shift = 2 if self.little else 0  # the high half's offset within the word
            for m in pat.finditer(data):
                off = m.start() - shift
                if off < 0 or (off - align) % 4 or off + 12 > len(data):
                    continue
                va = self._mips_cpload(data, off, r.va + off)
                if va is not None:
                    out.append(va)
        elif self.arch == "ppc" and self.bits == 64:
            # `addis r2, r12, hi` is 0x3c4c hhhh
            pat = re.compile(re.escape(b"\x4c\x3c") if self.little else re.escape(b"\x3c\x4c"))
            shift = 2 if self.little else 0
            for m in pat.finditer(data):
                off = m.start() - shift
                if off < 0 or (off - align) % 4 or off + 8 > len(data):
                    continue
                (w1,) = word.unpack_from(data, off + 4)
                if w1 >> 16 != 0x3842:  # addi r2, r2, lo
                    continue
                (w0,) = word.unpack_from(data, off)
                va = r.va + off
                if (va + (_s16(w0 & 0xFFFF) << 16) + _s16(w1 & 0xFFFF)) & self.mask == self.base:
                    out.append(va)
        return out

    def _mips_cpload(self, data: bytes | bytearray, off: int, va: int) -> int | None:
        """`va` when the three words at `off` are a `.cpload`/`.cpsetup` of `_gp` from `va`."""
        w0, w1, w2 = struct.unpack_from(("<" if self.little else ">") + "III", data, off)
        if w0 >> 16 != 0x3C1C:
            return None
        hi = _s16(w0 & 0xFFFF) << 16
        if w1 >> 16 == 0x279C and w2 == _MIPS_ADDU_GP_T9:  # o32: lui; addiu; addu
            lo = _s16(w1 & 0xFFFF)
        elif w1 == _MIPS_DADDU_GP_T9 and w2 >> 16 == 0x679C:  # n64: lui; daddu; daddiu
            lo = _s16(w2 & 0xFFFF)
        else:
            return None
        return va if (va + hi + lo) & self.mask == self.base else None

    # ------------------------------------------------------------------ first address of a gap
    def candidate(self, r: CodeRegion, off: int, end: int) -> tuple[int, bool, int] | None:
        """The first non-padding address of the gap [off, end) of `r` (offsets), whether it starts
        like a function, and the gap's end; None when the gap is all padding."""
        data = r.data
        if self.arch == "riscv":
            off += (r.va + off) & 1  # instructions are halfword-aligned
            while off + 2 <= end:
                (h,) = struct.unpack_from("<H", data, off)
                if h in (0, 0x0001):  # zero padding, c.nop
                    off += 2
                elif h == 0x0013 and off + 4 <= end and data[off + 2 : off + 4] == b"\0\0":  # nop
                    off += 4
                else:
                    break
            if off + 2 > end:
                return None
            return (r.va + off, self._riscv_prologue(data, off, end), r.va + end)
        off += (-(r.va + off)) % 4
        pad = (0, _PPC_NOP) if self.arch == "ppc" else (0,)
        word = self.word
        while off + 4 <= end and word.unpack_from(data, off)[0] in pad:
            off += 4
        if off + 4 > end:
            return None
        (w,) = word.unpack_from(data, off)
        if self.arch == "mips":
            ok = (w >> 16) in (0x27BD, 0x67BD) and w & 0x8000 != 0
            ok = ok or (self.base is None and off + 12 <= end and self._mips_shape(data, off))
        else:
            ok = self._ppc_frame(w)
            if not ok and w == _PPC_MFLR_R0 and off + 8 <= end:
                ok = self._ppc_frame(word.unpack_from(data, off + 4)[0])
        return (r.va + off, ok, r.va + end)

    def _mips_shape(self, data: bytes | bytearray, off: int) -> bool:
        """A `.cpload`-shaped start when `_gp` is unknown (its value cannot be checked)."""
        w0, w1, w2 = struct.unpack_from(("<" if self.little else ">") + "III", data, off)
        return w0 >> 16 == 0x3C1C and (
            (w1 >> 16 == 0x279C and w2 == _MIPS_ADDU_GP_T9) or (w1 == _MIPS_DADDU_GP_T9 and w2 >> 16 == 0x679C)
        )

    def _ppc_frame(self, w: int) -> bool:
        """`stwu r1, -N(r1)` (PPC32) or `stdu r1, -N(r1)` (PPC64)."""
        if self.bits == 64:
            return w & 0xFFFF8003 == 0xF8218001
        return w & 0xFFFF8000 == 0x94218000

    @staticmethod
    def _riscv_prologue(data: bytes | bytearray, off: int, end: int) -> bool:
        """`addi sp, sp, -N`, `c.addi16sp sp, -N` or `c.addi sp, -N` at `off`."""
        (h,) = struct.unpack_from("<H", data, off)
        if h & 3 == 3:
            if off + 4 > end:
                return False
            (w,) = struct.unpack_from("<I", data, off)
            return w & 0x800FFFFF == 0x80010113  # addi sp, sp, imm with the sign bit set
        # c.addi16sp (funct3 011) and c.addi sp (funct3 000), rd = sp, the immediate's sign bit 12 set
        return h & 0xFF83 in (0x7101, 0x1101)
