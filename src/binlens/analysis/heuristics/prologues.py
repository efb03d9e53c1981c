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
from collections.abc import Iterator
from typing import TYPE_CHECKING

from binlens.analysis.codemap import CodeMap, CodeRegion
from binlens.analysis.decode.backend import is_capstone
from binlens.loader.image import Image

if TYPE_CHECKING:
    from binlens.analysis.decode.backend import Backend

ARCHES = ("mips", "ppc", "riscv")
# instruction alignment of fixed-width (or 16-bit-granular) architectures; ARM32 is handled apart
# (bit 0 names the Thumb state)
INSN_ALIGN = {"aarch64": 4, "mips": 4, "ppc": 4, "riscv": 2}
_MIPS_GP_BIAS = 0x7FF0  # _gp lies this far past the start of the MIPS GOT
_PPC64_TOC_BIAS = 0x8000  # .TOC. lies this far past the start of the PPC64 .got
_MIPS_ADDU_GP_T9 = 0x0399E021  # addu $gp, $gp, $t9
_MIPS_DADDU_GP_T9 = 0x0399E02D  # daddu $gp, $gp, $t9
_MIPS_WINDOW = 4  # words from a gap's start in which a MIPS frame allocation may lie
# opcodes of MIPS branches and jumps: REGIMM, j, jal, beq, bne, blez, bgtz, beql, bnel, blezl, bgtzl
_MIPS_BRANCH_OPS = frozenset((1, 2, 3, 4, 5, 6, 7, 20, 21, 22, 23))
_RISCV_WINDOW = 4  # instructions from a gap's start in which a RISC-V frame allocation may lie
# MIPS loads and stores (base register in bits 25:21), and the stores among them
_MIPS_MEM_OPS = frozenset((*range(32, 47), 49, 53, 55, 57, 61, 63))
_MIPS_STORE_OPS = frozenset((40, 41, 42, 43, 44, 45, 46, 57, 61, 63))
# PowerPC D/DS-form loads and stores (base register rA in bits 20:16), and the stores among them
_PPC_MEM_OPS = frozenset((*range(32, 56), 58, 62))
# PowerPC opcodes that write rD (bits 25:21: arithmetic immediates, integer loads, X-form
# opcode 31) and rA (bits 20:16: rotates, logical immediates, update forms, opcode 31)
_PPC_RD_OPS = frozenset((7, 8, 12, 13, 14, 15, 31, 32, 33, 34, 35, 40, 41, 42, 43, 46, 58))
_PPC_RA_OPS = frozenset((20, 21, 23, 24, 25, 26, 27, 28, 29, 30, 31, 33, 35, 37, 39, 41, 43, 45, 47, 62))
_PPC_MFLR_R0 = 0x7C0802A6
_PPC_NOP = 0x60000000
_PPC_ORI_R2 = 0x60420000  # ori r2, r2, 0: PPC64 padding between functions


def _s16(x: int) -> int:
    return x - 0x10000 if x & 0x8000 else x


class GapPrologues:
    """The prologue tests of one image (its architecture, byte order and `_gp`/TOC base)."""

    def __init__(self, image: Image, codemap: CodeMap, backend: Backend) -> None:
        """Read what the tests need from `image`: architecture, word size, byte order, PIC base
        (MIPS `_gp` as the jump-table resolver finds it, cached per backend)."""
        ident = image.identity
        self.arch = ident.arch
        self.bits = ident.bits or 32
        self.little = ident.endian == "little"
        self.word = struct.Struct("<I" if self.little else ">I")
        self.codemap = codemap
        self.mask = (1 << self.bits) - 1
        self.base: int | None = None  # MIPS _gp, PPC64 .TOC.
        if self.arch == "mips" and is_capstone(backend):
            from binlens.analysis.switches.mips import gp_value

            self.base = gp_value(backend, image)
        elif self.arch == "ppc" and self.bits == 64:
            toc = next((s.address for s in image.symbols if s.name == ".TOC."), None)
            if toc is None:
                got = next((s for s in image.sections if s.name == ".got"), None)
                toc = got.va + _PPC64_TOC_BIAS if got is not None else None
            self.base = toc
        self._exact: list[int] | None = None
        # gap trials (`trials.self_contained`) at the first address of gaps without a prologue
        self.trials = True
        self.align = INSN_ALIGN[self.arch]  # where entries (and a trial's tail calls) may lie

    # ------------------------------------------------------------------ exact entries
    def exact_entries(self) -> list[int]:
        """Every address of code whose PIC base sequence names it as a function entry (computed once)."""
        if self._exact is None:
            out: list[int] = []
            if self.base is not None:
                for r in self.codemap.regions:
                    out.extend(self._exact_in(r, self.base))
            self._exact = sorted(out)
        return self._exact

    def _exact_in(self, r: CodeRegion, base: int) -> list[int]:
        """The exact entries in region `r`, whose PIC base is `base`."""
        data = r.data
        word = self.word
        align = (-r.va) % 4  # offsets of word-aligned addresses
        out = []
        if self.arch == "mips" and self.bits == 64:
            out.extend(self._mips_n64(r, base))
        elif self.arch == "mips":
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

    def _mips_n64(self, r: CodeRegion, base: int) -> list[int]:
        """Entries named by n64 `.cpsetup`-like sequences: `lui $r, hi` ... `daddu $r, $r, $t9` ...
        `daddiu $r, $r, lo` with hi and lo of `_gp` - entry (gcc schedules them apart, and in a leaf
        uses any register for `$r`): the entry is `_gp` - hi - lo, at or a few words before the `lui`."""
        data = r.data
        lead = (-r.va) % 4
        n = (len(data) - lead) // 4
        words = list(struct.iter_unpack(("<" if self.little else ">") + "I", data[lead : lead + 4 * n]))
        out = []
        for i, (w,) in enumerate(words):
            if w & 0xFC1F07FF != 0x0019002D or (w >> 21) & 31 != (w >> 11) & 31:
                continue  # not `daddu $r, $r, $t9`
            reg = (w >> 21) & 31
            hi_op, lo_op = 0x3C00 | reg, 0x6400 | reg << 5 | reg
            j = next((j for j in range(i - 1, max(-1, i - 9), -1) if words[j][0] >> 16 == hi_op), None)
            k = next((k for k in range(i + 1, min(n, i + 9)) if words[k][0] >> 16 == lo_op), None)
            if j is None or k is None:
                continue
            hi = _s16(words[j][0] & 0xFFFF) << 16
            lo = _s16(words[k][0] & 0xFFFF)
            entry = (base - hi - lo) & self.mask
            lui = r.va + lead + 4 * j
            if lui - 4 * _MIPS_WINDOW <= entry <= lui and entry % 4 == 0:
                out.append(entry)
        return out

    def _mips_cpload(self, data: bytes | bytearray, off: int, va: int) -> int | None:
        """`va` when the three words at `off` are an o32 `.cpload` of `_gp` from `va`."""
        w0, w1, w2 = struct.unpack_from(("<" if self.little else ">") + "III", data, off)
        if w0 >> 16 != 0x3C1C:
            return None
        hi = _s16(w0 & 0xFFFF) << 16
        if w1 >> 16 != 0x279C or w2 != _MIPS_ADDU_GP_T9:  # o32: lui; addiu; addu
            return None
        lo = _s16(w1 & 0xFFFF)
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
        pad = (0, _PPC_NOP, _PPC_ORI_R2) if self.arch == "ppc" else (0,)
        word = self.word
        tb = self.arch == "ppc" and self.bits == 64
        while off + 4 <= end:
            (w,) = word.unpack_from(data, off)
            if w in pad:
                off += 4
            elif tb and off >= 4 and data[off - 4 : off] == b"\0\0\0\0" and data[off] == 0 and data[off + 1] < 16:
                off += 8  # a PPC64 traceback table after a function's zero word: version 0, language, flags
            else:
                break
        if off + 4 > end:
            return None
        (w,) = word.unpack_from(data, off)
        if self.arch == "mips":
            ok = self._mips_frame(data, off, end)
            ok = ok or (self.base is None and off + 12 <= end and self._mips_shape(data, off))
        else:
            ok = self._ppc_frame(w)
            if not ok and w == _PPC_MFLR_R0 and off + 8 <= end:
                ok = self._ppc_frame(word.unpack_from(data, off + 4)[0])
        return (r.va + off, ok, r.va + end)

    def after_call(self, va: int) -> bool:
        """Does `va` directly follow a call or an indirect jump other than a return (MIPS: its delay
        slot)? Code there that nothing reached is most likely the rest of a function after a call
        that does not return (an -O0 epilogue), or the cases of a switch whose table was not
        resolved, not a function of its own."""
        r = self.codemap.region(va)
        if r is None:
            return False
        off = va - r.va
        data = r.data
        if self.arch == "riscv":
            h = struct.unpack_from("<H", data, off - 2)[0] if off >= 2 else 0
            if h & 0xE07F == 0x8002 and (h >> 7) & 31 not in (0, 1):
                return True  # c.jalr / c.jr through a register other than ra (rs1 = 0: c.ebreak)
            if off >= 4:
                (w,) = struct.unpack_from("<I", data, off - 4)
                if w & 0x7F in (0x6F, 0x67) and (w >> 7) & 31 == 1:
                    return True  # jal/jalr ra
                return w & 0x7FFF == 0x0067 and (w >> 15) & 31 != 1  # jalr zero, rs1 (not ra): an indirect jump
            return False
        if self.arch == "mips":
            if off < 8:
                return False
            (w,) = self.word.unpack_from(data, off - 8)
            op = w >> 26
            # jal, bal (regimm bgezal/bltzal with any rs), jalr; jr through a register other than $ra
            jr = op == 0 and w & 0x3F == 8 and (w >> 21) & 31 != 31
            return op == 3 or (op == 1 and (w >> 16) & 0x1E == 0x10) or (op == 0 and w & 0x3F == 9) or jr
        if off < 4:
            return False
        (w,) = self.word.unpack_from(data, off - 4)
        # bl (opcode 18 with LK), bctrl, blrl, bctr
        return (w >> 26 == 18 and w & 1 == 1) or w in (0x4E800421, 0x4E800021, 0x4E800420)

    def epilogue_only(self, spans: list[tuple[int, int]]) -> bool:
        """Does the code in `spans` ((start, end) of decoded runs) give back a stack frame it never
        allocated? Then it is the tail of a function (an epilogue its unresolved switch or
        unknown non-returning call left unreached), not a function of its own: a function
        either allocates its frame or leaves the stack pointer alone."""
        frees = False
        for lo, hi in spans:
            r = self.codemap.region(lo)
            if r is None:
                continue
            for kind in self._sp_writes(r, lo - r.va, min(hi, r.end) - r.va):
                if kind < 0:
                    return False  # a frame allocated by this code
                frees = True
        return frees

    def borrowed_frame(self, spans: list[tuple[int, int]]) -> bool:
        """Does the code in `spans` address memory through the frame pointer (PowerPC r31, MIPS
        $fp, RISC-V s0) without ever writing that register? A function sets its frame pointer
        before using it; code that only uses it runs in the frame of a function entered
        elsewhere (the unreached cases of an -O0 switch). Writes are over-approximated (any
        instruction that may write the register counts), so a doubt keeps the candidate."""
        uses = False
        for lo, hi in spans:
            r = self.codemap.region(lo)
            if r is None:
                continue
            for use, write in self._fp_accesses(r, lo - r.va, min(hi, r.end) - r.va):
                if write:
                    return False
                uses = uses or use
        return uses

    def _fp_accesses(self, r: CodeRegion, off: int, end: int) -> list[tuple[bool, bool]]:
        """(uses the frame pointer as a memory base, may write it) per instruction of [off, end)."""
        out = []
        if self.arch == "riscv":
            for size, h in _rv_stream(r.data, off, end):
                if size == 4:
                    opc = h & 0x7F
                    mem = opc in (0x03, 0x07, 0x23, 0x27) and (h >> 15) & 31 == 8  # load/store off s0
                    out.append((mem, opc not in (0x23, 0x27, 0x63) and (h >> 7) & 31 == 8))
                    continue
                q, f3 = h & 3, h >> 13
                if q == 0:  # c.addi4spn, c.fld, c.lw, c.ld (rd' bits 4:2), c.fsd, c.sw, c.sd; base rs1' bits 9:7
                    out.append((f3 != 0 and (h >> 7) & 7 == 0, f3 < 4 and (h >> 2) & 7 == 0))
                elif q == 1:  # rd in bits 11:7 (c.addi, c.li, c.lui, ...), rd' in bits 9:7 (funct3 100)
                    out.append((False, (f3 in (0, 1, 2, 3) and (h >> 7) & 31 == 8) or (f3 == 4 and (h >> 7) & 7 == 0)))
                else:  # c.slli, c.lwsp, c.ldsp, c.mv, c.add (rd bits 11:7); c.swsp/c.sdsp store
                    out.append((False, f3 not in (5, 6, 7) and (h >> 7) & 31 == 8))
            return out
        for w in self._words(r, off, end):
            op = w >> 26
            if self.arch == "mips":
                mem = op in _MIPS_MEM_OPS and (w >> 21) & 31 == 30
                store = op in _MIPS_STORE_OPS
                out.append(
                    (mem, (op == 0 and (w >> 11) & 31 == 30) or (op != 0 and not store and (w >> 16) & 31 == 30))
                )
            else:
                mem = op in _PPC_MEM_OPS and (w >> 16) & 31 == 31
                rd, ra = (w >> 21) & 31 == 31, (w >> 16) & 31 == 31
                out.append((mem, (rd and op in _PPC_RD_OPS) or (ra and op in _PPC_RA_OPS)))
        return out

    def _words(self, r: CodeRegion, off: int, end: int) -> Iterator[int]:
        """The aligned instruction words of [off, end) of `r` (MIPS, PowerPC), in the image's order."""
        unpack = self.word.unpack_from
        for at in range(off + (-(r.va + off)) % 4, end - 3, 4):
            yield unpack(r.data, at)[0]

    def _sp_writes(self, r: CodeRegion, off: int, end: int) -> list[int]:
        """-1 for each allocation of a stack frame in [off, end) of `r`, +1 for each other write of
        the stack pointer (freeing a frame, or restoring it from another register)."""
        out = []
        if self.arch == "riscv":
            for size, h in _rv_stream(r.data, off, end):
                if size == 4:
                    if h & 0x0FFF == 0x0113 and (h >> 12) & 7 == 0:  # addi sp, rs1, imm
                        out.append(-1 if h & 0x000F8000 == 0x00010000 and h >> 31 else 1)
                elif h & 0xEF83 in (0x6101, 0x0101):  # c.addi16sp / c.addi sp
                    out.append(-1 if h & 0x1000 else 1)
                elif h & 0xFF83 == 0x8102 and h & 0x7C:  # c.mv sp, rs2
                    out.append(1)
            return out
        for w in self._words(r, off, end):
            op = w >> 26
            if self.arch == "mips":
                if (w >> 16) in (0x27BD, 0x67BD):  # (d)addiu $sp, $sp, imm
                    out.append(-1 if w & 0x8000 else 1)
                elif op == 0 and (w >> 11) & 31 == 29 and w & 0x3F in (0x21, 0x25, 0x2D):  # move $sp, $r
                    out.append(1)
            elif (op == 37 or (op == 62 and w & 3 == 1)) and (w >> 16) & 0x3FF == 0x21:  # stwu / stdu r1, d(r1)
                out.append(-1 if w & 0x8000 else 1)
            else:
                load = op in (14, 32, 58) and (w >> 21) & 31 == 1  # addi / lwz / ld r1
                if load or (op == 31 and (w >> 16) & 31 == 1 and (w >> 1) & 0x3FF == 444):  # or mr r1, rS
                    out.append(1)
        return out

    def _mips_frame(self, data: bytes | bytearray, off: int, end: int) -> bool:
        """`addiu`/`daddiu $sp, $sp, -N` among the first `_MIPS_WINDOW` words at `off`, with no
        branch or jump before it (gcc -O2 schedules the frame's allocation after a few
        instructions that do not touch the stack)."""
        word = self.word
        for k in range(_MIPS_WINDOW):
            at = off + 4 * k
            if at + 4 > end:
                return False
            (w,) = word.unpack_from(data, at)
            if (w >> 16) in (0x27BD, 0x67BD):
                return w & 0x8000 != 0
            op = w >> 26
            if op in _MIPS_BRANCH_OPS or (op == 0 and w & 0x3F in (8, 9)) or w & 0x03E00000 == 0x03A00000:
                return False  # a branch or jump (jr/jalr), or anything else reading $sp, before it
        return False

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
        """`addi sp, sp, -N`, `c.addi16sp sp, -N` or `c.addi sp, -N` among the first
        `_RISCV_WINDOW` instructions at `off`, with no branch or jump before it (gcc -O2 may
        schedule a few instructions before the frame's allocation)."""
        for _ in range(_RISCV_WINDOW):
            if off + 2 > end:
                return False
            (h,) = struct.unpack_from("<H", data, off)
            if h & 3 == 3:
                if off + 4 > end:
                    return False
                (w,) = struct.unpack_from("<I", data, off)
                if w & 0x000FFFFF == 0x00010113:  # addi sp, sp, imm
                    return w >> 31 == 1
                if w & 0x7F in (0x63, 0x67, 0x6F):  # branch, jalr, jal
                    return False
                off += 4
                continue
            # c.addi16sp (funct3 011) and c.addi sp (funct3 000), rd = sp: the immediate's sign is bit 12
            if h & 0xEF83 in (0x6101, 0x0101):
                return h & 0x1000 != 0
            if (h & 3 == 1 and h >> 13 in (5, 6, 7)) or (h & 0xF07F == 0x8002 and h & 0x0F80):
                return False  # c.j, c.beqz, c.bnez; c.jr, c.jalr
            off += 2
        return False


def _rv_stream(data: bytes, off: int, end: int) -> Iterator[tuple[int, int]]:
    """(size, bits) of each RISC-V instruction in [off, end): 16-bit compressed ones and 32-bit ones
    (a halfword whose low two bits are 11 begins a 32-bit instruction)."""
    while off + 2 <= end:
        (h,) = struct.unpack_from("<H", data, off)
        if h & 3 != 3:
            off += 2
            yield 2, h
            continue
        if off + 4 > end:
            return
        (w,) = struct.unpack_from("<I", data, off)
        off += 4
        yield 4, w
