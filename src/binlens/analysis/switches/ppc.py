"""Jump tables behind PowerPC `bctr` (the switch dispatches gcc and clang emit).

PowerPC (32-bit, big-endian), any register allocation and order of the independent steps:

    cmplwi crN, rI, N          ; or `cmplw crN, rI, rK` with rK a constant (either operand order)
    bgt    crN, default        ; or bge; or ble/blt taken to the dispatch
    lis    rT, tbl@ha          ; or a PIC base: `bcl 20,31,1f` / `bl 1f` + `mflr rP`, then the table
    addi   rT, rT, tbl@l       ;   address loaded from the GOT (`lwz rT, .LC0-.LCTOC1(rP)`)
    slwi   rI, rI, 2
    lwzx   rE, rT, rI          ; or `add rA, rT, rI` + `lwz rE, 0(rA)`
    add    rE, rE, rT          ; table-relative entries (gcc always, clang PIC); absent for absolute ones
    mtctr  rE
    bctr

The forward evaluation is `jumptable_eval.py`'s.
"""

from __future__ import annotations

import bisect
import struct
from typing import TYPE_CHECKING

import capstone as cs

from binlens.analysis.codemap import CodeMap
from binlens.analysis.metadata.ehframe import parse_eh_frame
from binlens.analysis.switches.common import Chunks, PerBackend, Resolution
from binlens.analysis.switches.symbolic import NEGATE, RelocMap, State, Value, resolve

if TYPE_CHECKING:
    from capstone.ppc import PpcOp

    from binlens.analysis.decode.capstone_backend import CapstoneBackend
    from binlens.loader.image import Image

_PROLOGUE = 128  # bytes of a function's start searched for the PIC register's setup


_GEP_SCAN = 1 << 16  # bytes before a PPC64 jump searched for its function's global entry


def toc_before(image: Image, va: int, lowest: int) -> int | None:
    """The PPC64 ELFv2 TOC pointer set by the nearest global entry point before `va`:
    `addis r2, r12, hi` (0x3c4c....) or, in executables, `lis r2, hi` (0x3c40....), followed by
    `addi r2, r2, lo` (0x3842....). Searched back to `lowest` (the code region's start)."""
    start = max(va - _GEP_SCAN, lowest)
    start += (va - start) & 3
    data = image.read(start, va - start)
    if not data:
        return None
    endian = "<" if image.identity.endian == "little" else ">"
    words = struct.unpack(f"{endian}{len(data) // 4}I", data[: len(data) // 4 * 4])
    for k in range(len(words) - 2, -1, -1):
        if words[k] >> 16 in (0x3C4C, 0x3C40) and words[k + 1] >> 16 == 0x3842:
            hi, lo = words[k] & 0xFFFF, words[k + 1] & 0xFFFF
            hi -= (hi & 0x8000) << 1
            lo -= (lo & 0x8000) << 1
            base = start + 4 * k if words[k] >> 16 == 0x3C4C else 0  # `lis r2, hi`: ld's absolute form
            return (base + (hi << 16) + lo) & ((1 << 64) - 1)
    return None


def _function_extents(image: Image) -> list[tuple[int, int]]:
    """The (start, end) of every FDE and FUNC symbol extent, in order."""
    spans = {(f.start, f.start + f.size) for f in parse_eh_frame(image) if f.entry and f.size}
    spans |= {(s.address, s.address + s.size) for s in image.symbols if s.kind == "function" and s.size}
    return sorted(spans)


def _backend_extents(backend: CapstoneBackend) -> list[tuple[int, int]]:
    return _function_extents(backend.image)


def _no_pic_registers(_backend: CapstoneBackend) -> dict[int, Value | None]:
    return {}


# per backend: the function extents; the PIC register r30 by function start (None: not a constant)
_EXTENTS = PerBackend(_backend_extents)
_PIC = PerBackend(_no_pic_registers)


def _function_start(backend: CapstoneBackend, va: int) -> int | None:
    """Start of the innermost FDE or FUNC symbol extent holding `va`."""
    extents = _EXTENTS.get(backend)
    k = bisect.bisect_right(extents, (va, 1 << 64))
    best = None
    for lo, hi in reversed(extents[max(0, k - 8) : k]):
        if lo <= va < hi and (best is None or lo > best):
            best = lo
    return best


_PIC_SCAN = 1 << 14  # bytes before a PowerPC 32 jump searched for its function's PIC base idiom
_PIC_CALLS = (0x429F0005, 0x48000005)  # `bcl 20,31,.+4` (gcc), `bl .+4` (clang)


def _pic_base_before(backend: CapstoneBackend, va: int) -> int | None:
    """The address of the nearest PIC base idiom (`bcl 20,31,1f` / `bl 1f` to the next instruction,
    then `mflr`) before `va`, within `_PIC_SCAN` bytes and the same code region: where the function
    of a jump whose extent is unknown (no FDE, no symbol) sets r30. PowerPC code is big-endian."""
    region = backend.codemap.region(va)
    if region is None:
        return None
    start = max(va - _PIC_SCAN, region.va)
    start += (va - start) & 3
    image = backend.image
    data = image.read(start, va - start)
    if not data:
        return None
    endian = "<" if image.identity.endian == "little" else ">"
    words = struct.unpack(f"{endian}{len(data) // 4}I", data[: len(data) // 4 * 4])
    for k in range(len(words) - 1, -1, -1):
        if words[k] in _PIC_CALLS:
            return start + 4 * k
    return None


_PPC_LOADS = {
    "lbz": (1, False),
    "lhz": (2, False),
    "lha": (2, True),
    "lwz": (4, False),
    "lwa": (4, True),
    "ld": (8, False),
}
PPC_STORES = {"stb": 1, "sth": 2, "stw": 4, "std": 8, "stfs": 4, "stfd": 8}
_PPC_CALL_CLOBBERS = ("r0", *(f"r{k}" for k in range(3, 13)), "ctr")
_PPC_BRANCH = {"bgt": "gt", "bge": "ge", "bnl": "ge", "blt": "lt", "ble": "le", "bng": "le"}


def ppc_base(m: str) -> tuple[str, bool, bool]:
    """(mnemonic without update/indexed suffixes, update form, indexed form) of a load or store."""
    indexed = m.endswith("x")
    if indexed:
        m = m[:-1]
    update = m.endswith("u")
    if update:
        m = m[:-1]
    return m, update, indexed


class PpcState(State):
    FRAME = ("r1", "r31")

    def __init__(self, image: Image, relocs: RelocMap | None = None) -> None:
        super().__init__(image, relocs)
        self.cr: dict[str, tuple[Value, int, bool] | None] = {}

    @staticmethod
    def is_load(ins: cs.CsInsn) -> bool:
        """A load: `l*` with a memory operand or an indexed `l*x`."""
        m = ins.mnemonic
        if not m.startswith("l") or m in ("li", "lis", "la"):
            return False
        return ppc_base(m)[0] in _PPC_LOADS

    @staticmethod
    def indexes(ins: cs.CsInsn) -> bool:
        """`lwzx`/`lwax`/`ldx` ... or `add` (before `lwz rE, 0(rA)`)."""
        m = ins.mnemonic
        if m == "add":
            return True
        base, _update, indexed = ppc_base(m)
        return indexed and m.startswith("l") and base in _PPC_LOADS

    def seed(self, backend: CapstoneBackend, jump_va: int) -> None:
        """Registers set once at the start of the function holding the jump that hold throughout it,
        so the walked path need not reach the prologue:

        - PowerPC 32 PIC register r30 (gcc `bcl 20,31,1f; 1: mflr r30; addis/addi r30, r30,
          .LCTOC1-1b`, clang `bl 1f; 1: mflr r30; lwz r4, off(r30); add r30, r4, r30`): the
          straight-line start of the function (its FDE or FUNC symbol extent) is evaluated and r30
          kept when it is a constant there;
        - PPC64 ELFv2 TOC pointer r2, from the nearest global entry before the jump (`addis r2, r12,
          .TOC.-gep@ha; addi r2, r2, .TOC.-gep@l`, r12 = the entry): kept fixed for the whole walk
          (the TOC is the module's, restored after calls)."""
        if self.ptr_size == 8:
            region = backend.codemap.region(jump_va)
            toc = toc_before(self.image, jump_va, region.va if region is not None else jump_va)
            if toc is not None:
                self.regs["r2"] = self.const(toc)
                self.fixed.add("r2")
            return
        start = _function_start(backend, jump_va)
        if start is None:  # no FDE or symbol: the PIC base idiom nearest before the jump
            start = _pic_base_before(backend, jump_va)
            if start is None:
                return
            self.strict = True  # r30 from a scan: every entry must land on code near the jump
        cache = _PIC.get(backend)
        if start not in cache:
            cache[start] = self._pic_register(backend, start, jump_va)
        r30 = cache[start]
        if r30 is not None:
            self.regs["r30"] = r30

    def _pic_register(self, backend: CapstoneBackend, start: int, jump_va: int) -> Value | None:
        """r30 after the straight-line start of the function at `start` when it is a constant there."""
        image = self.image
        md = backend.md(False)
        data = image.read(start, min(_PROLOGUE, jump_va - start))
        if not data:
            return None
        prologue = PpcState(image)
        insns = list(md.disasm(data, start))
        for k, ins in enumerate(insns):
            m = ins.mnemonic.rstrip("+-")
            ops = ins.operands
            pic_idiom = m.endswith("l") and ops and ops[-1].type == cs.CS_OP_IMM and ops[-1].imm == ins.address + 4
            if m.startswith("b") and not pic_idiom:
                break  # straight-line code only
            prologue.step(ins, insns[k + 1].address if k + 1 < len(insns) else ins.address + 4)
        value = prologue.regs.get("r30")
        return value if value is not None and value[0] == "c" else None

    def jump_value(self, ins: cs.CsInsn) -> Value:
        """`bctr` jumps to the count register."""
        return self.read("ctr")

    def _reg(self, ins: cs.CsInsn, op: PpcOp) -> str:
        return ins.reg_name(op.reg)

    def step(self, ins: cs.CsInsn, next_va: int) -> None:
        """Evaluate `ins`; `next_va` is the address executed after it on this path."""
        m = ins.mnemonic.rstrip("+-")
        ops = ins.operands
        if m.endswith("."):
            self.cr["cr0"] = None  # record forms set cr0
            m = m[:-1]
        if m.startswith("b") and m.endswith("l") and ops and ops[-1].type == cs.CS_OP_IMM:
            nxt = ins.address + 4
            if ops[-1].imm == nxt:  # `bcl 20,31,1f` (capstone: bdnzl) or `bl 1f`: the PIC base idiom
                self.write("lr", self.const(nxt))
                return
        if m.startswith("b") and (m.endswith("l") or m == "bla") and m not in _PPC_BRANCH:
            # a call: bl, bla, bctrl, blrl, conditional `b<cc>l` (taken or not: forget alike)
            nxt = ins.address + 4
            self.memo = {}
            for r in _PPC_CALL_CLOBBERS:
                self.write(r)
            self.write("lr", self.const(nxt))
            for f in ("cr0", "cr1", "cr5", "cr6", "cr7"):
                self.cr[f] = None
            self.slots = {s: v for s, v in self.slots.items() if s[0] == "r31" or s[0] == "r1"}
            return
        if m.startswith("b"):
            if m.startswith("bd"):  # bdnz/bdz count down the ctr
                self.write("ctr")
            self._branch(ins, m, ops, next_va)
            return
        if m.startswith("cmp"):
            self._compare(ins, m, ops)
            return
        if m.startswith("st") and ops and ops[-1].type in (cs.CS_OP_MEM, cs.CS_OP_REG):
            self._store(ins, m, ops)
            return
        if self.is_load(ins):
            self._load(ins, m, ops)
            return
        if m.startswith("l") and len(ops) == 2 and ops[1].type == cs.CS_OP_MEM and ppc_base(m)[1]:
            self.write(ins.reg_name(ops[1].mem.base))  # an update-form load (lfdu ...) moves its base
        if m.startswith("dcbz"):  # zeroes a cache block of memory
            self.memo = {}
            self.slots = {}
        if not self._arith(ins, m, ops):
            if m.startswith(("mtcr", "mcrf", "cr", "mtfsf")):
                self.cr = {}
            elif m in ("lmw", "lswi") and ops and ops[0].type == cs.CS_OP_REG:
                first = int(self._reg(ins, ops[0])[1:])
                for k in range(first, 32):
                    self.write(f"r{k}")
            elif ops and ops[0].type == cs.CS_OP_REG:
                self.write(self._reg(ins, ops[0]))

    def _branch(self, ins: cs.CsInsn, m: str, ops: list, next_va: int) -> None:
        cond = _PPC_BRANCH.get(m)
        if cond is None:
            return
        field = "cr0"
        target = -1
        for op in ops:
            if op.type == cs.CS_OP_REG:
                field = self._reg(ins, op)
            elif op.type == cs.CS_OP_IMM:
                target = op.imm
        flags = self.cr.get(field)
        if flags is None or target in (-1, ins.address + 4):
            return
        if next_va == target:
            holds = cond
        elif next_va == ins.address + 4:
            holds = NEGATE[cond]
        else:
            return
        value, n, reversed_ = flags
        self.bound(value, holds, n, reversed_)

    def _compare(self, ins: cs.CsInsn, m: str, ops: list) -> None:
        field = "cr0"
        rest = list(ops)
        if rest and rest[0].type == cs.CS_OP_REG and self._reg(ins, rest[0]).startswith("cr"):
            field = self._reg(ins, rest.pop(0))
        self.cr[field] = None
        if m not in ("cmplwi", "cmplw", "cmpldi", "cmpld") or len(rest) != 2 or rest[0].type != cs.CS_OP_REG:
            return  # only unsigned compares bound an index
        a = self.read(self._reg(ins, rest[0]))
        if rest[1].type == cs.CS_OP_IMM:
            b = self.const(rest[1].imm)
        elif rest[1].type == cs.CS_OP_REG:
            b = self.read(self._reg(ins, rest[1]))
        else:
            return
        if m in ("cmplwi", "cmplw"):  # a 32-bit compare: the index is the low word
            a = self._low_word(a)
            b = self._low_word(b)
        if b[0] == "c" and a[0] != "c":
            self.cr[field] = (a, b[1], False)
        elif a[0] == "c" and b[0] != "c":
            self.cr[field] = (b, a[1], True)

    def _low_word(self, v: Value) -> Value:
        return ("c", v[1] & 0xFFFFFFFF) if v[0] == "c" else v

    def _load(self, ins: cs.CsInsn, m: str, ops: list) -> None:
        base_m, update, indexed = ppc_base(m)
        size, signed = _PPC_LOADS[base_m]
        dst = self._reg(ins, ops[0])
        if indexed and len(ops) == 3 and ops[1].type == ops[2].type == cs.CS_OP_REG:
            ra, rb = self._reg(ins, ops[1]), self._reg(ins, ops[2])
            addr = self.add(self.const(0) if ra == "r0" else self.read(ra), self.read(rb))
            value = self.pointer_load(addr, size, signed)
            if update:
                self.write(ra, addr)
            self.write(dst, value)
            return
        if len(ops) == 2 and ops[1].type == cs.CS_OP_MEM:
            mem = ops[1].mem
            base = ins.reg_name(mem.base) if mem.base else "r0"
            if self.frame_base(base) and not update:
                self.write(dst, self.slot_load(base, mem.disp, size))
                return
            b = self.const(0) if base == "r0" else self.read(base)
            addr = self.add(b, self.const(mem.disp)) if mem.disp else b
            value = self.pointer_load(addr, size, signed)
            if update:
                self.write(base, addr)  # the update form leaves the effective address in the base
            self.write(dst, value)
            return
        for op in ops:
            if op.type == cs.CS_OP_REG:
                self.write(self._reg(ins, op))

    def _store(self, ins: cs.CsInsn, m: str, ops: list) -> None:
        base_m, update, indexed = ppc_base(m)
        size = PPC_STORES.get(base_m, 0)
        if indexed or len(ops) != 2 or ops[1].type != cs.CS_OP_MEM or ops[0].type != cs.CS_OP_REG:
            self.memo = {}  # a store may change what any pointer reads
            self.slots = {}
            if update and len(ops) == 3 and ops[1].type == cs.CS_OP_REG:
                self.write(self._reg(ins, ops[1]))
            return
        mem = ops[1].mem
        base = ins.reg_name(mem.base) if mem.base else "r0"
        if base != "r1" or update:  # (a spill into the callee's own frame changes no caller pointer)
            self.memo = {}
        src = self._reg(ins, ops[0])
        value = self.read(src) if src.startswith("r") and base_m in ("stw", "std") else None
        if update:
            self.write(base)  # `stwu r1, -N(r1)`: a new frame, the old slots are gone
            return
        self.slot_store(base, mem.disp, size, value)

    def _mask(self, ins: cs.CsInsn, m: str, ops: list, dst: str) -> bool:
        """`clrlwi rD, rS, 32 - k` and `andi. rD, rS, 2**k - 1` (k <= 8 or 16), and `rlwinm rD, rS,
        s, 32 - k - s, 31 - s` ((rS & (2**k - 1)) << s, k <= 8, s <= 3: lua's `tbl[op & 0x7f]`)."""
        if len(ops) < 3 or ops[1].type != cs.CS_OP_REG or any(op.type != cs.CS_OP_IMM for op in ops[2:]):
            return False
        a = self.read(self._reg(ins, ops[1]))
        imms = [op.imm for op in ops[2:]]
        shift = 0
        if m == "clrlwi" and len(imms) == 1:
            k = 32 - imms[0]
        elif m == "andi" and len(imms) == 1 and imms[0] > 0 and not imms[0] & (imms[0] + 1):
            k = imms[0].bit_length()
        elif m == "rlwinm" and len(imms) == 3 and imms[0] <= 3 and imms[2] == 31 - imms[0]:
            shift, k = imms[0], 32 - imms[1] - imms[0]
        else:
            return False
        if not (1 <= k <= 8 or k == 16):
            return False
        v = self.mask_low(self._low_word(a), k)
        self.write(dst, self.shift_left(v, shift) if shift else v)
        return True

    def _arith(self, ins: cs.CsInsn, m: str, ops: list) -> bool:
        """li/lis/addi/addis/add/mr/slwi/sldi/mflr/mtlr/mtctr/extsw/clrldi: False when not modelled."""
        if m in ("mtctr", "mtlr") and len(ops) == 1 and ops[0].type == cs.CS_OP_REG:
            self.write("ctr" if m == "mtctr" else "lr", self.read(self._reg(ins, ops[0])))
            return True
        if not ops or ops[0].type != cs.CS_OP_REG:
            return False
        dst = self._reg(ins, ops[0])
        n = len(ops)
        if m in ("mflr", "mfctr") and n == 1:
            self.write(dst, self.read("lr" if m == "mflr" else "ctr"))
            return True
        if m in ("li", "lis") and n == 2 and ops[1].type == cs.CS_OP_IMM:
            self.write(dst, self.const(ops[1].imm << (16 if m == "lis" else 0)))
            return True
        if m in ("mr", "extsw", "extsh", "extsb") and n == 2 and ops[1].type == cs.CS_OP_REG:
            v = self.read(self._reg(ins, ops[1]))
            if m == "extsw" and v[0] == "e" and v[2] == 4:
                v = ("e", v[1], v[2], True, v[4])
            elif m != "mr" and v[0] == "c":
                bits = {"extsw": 32, "extsh": 16, "extsb": 8}[m]
                k = v[1] & ((1 << bits) - 1)
                v = self.const(k - (1 << bits) if k >> (bits - 1) else k)
            elif m != "mr" and v[0] != "v" and not (m == "extsw" and v[0] == "e"):
                v = self.fresh()
            self.write(dst, v)
            return True
        if m in ("clrlwi", "andi", "rlwinm") and self._mask(ins, m, ops, dst):
            return True
        if n not in (3, 4) or ops[1].type != cs.CS_OP_REG:
            return False
        src = self._reg(ins, ops[1])
        a = self.const(0) if src == "r0" and m in ("addi", "addis") else self.read(src)
        if n == 3 and m in ("addi", "addis", "la") and ops[2].type == cs.CS_OP_IMM:
            self.write(dst, self.add(a, self.const(ops[2].imm << (16 if m == "addis" else 0))))
            return True
        if n == 3 and m == "add" and ops[2].type == cs.CS_OP_REG:
            self.write(dst, self.add(a, self.read(self._reg(ins, ops[2]))))
            return True
        if m in ("slwi", "sldi") and ops[2].type == cs.CS_OP_IMM:
            if m == "slwi" and a[0] != "c" and self.mask != 0xFFFFFFFF:
                self.write(dst)  # the 32-bit shift drops the high word on PPC64
            else:
                self.write(dst, self.shift_left(a, ops[2].imm))
            return True
        if m == "rldic" and n == 4 and ops[2].type == ops[3].type == cs.CS_OP_IMM and ops[2].imm + ops[3].imm == 32:
            # `rldic rD, rS, s, 32 - s`: the zero-extended low word shifted left by s
            self.write(dst, self.shift_left(a, ops[2].imm) if a[0] in ("v", "d") else None)
            return True
        if n == 3 and m == "clrldi" and ops[2].type == cs.CS_OP_IMM and ops[2].imm == 32:
            self.write(dst, a if a[0] in ("v", "d") else self.fresh())  # zero-extending the index word
            return True
        return False


def ppc_jump_table_targets(
    backend: CapstoneBackend, codemap: CodeMap, slice_start: int, jump_va: int, earlier: Chunks = ()
) -> Resolution:
    """Case targets of the PowerPC `bctr` at `jump_va`, the table address (0 when none), and whether
    a bound check guards it. Only complete, bounded dispatches resolve; otherwise `([], 0, True)`."""
    return resolve(
        backend, codemap, slice_start, jump_va, earlier, PpcState, lambda i: i.mnemonic.rstrip("+-") == "bctr", 4
    )
