"""Jump tables behind RISC-V `jr` (the switch dispatches gcc and clang emit).

RISC-V 64, any register allocation and order of the independent steps:

    li     t, N                ; the bound in a register
    bltu   t, rI, default      ; or bgtu/bgeu/bleu/bltu in any operand order, either side taken
    lui    rT, %hi(tbl)        ; or `auipc rT, %pcrel_hi(tbl)` (`lla`)
    addi   rT, rT, %lo(tbl)
    slli   rI, rI, 2
    add    rA, rI, rT
    lw     rE, 0(rA)           ; (ld for 8-byte absolute entries)
    add    rE, rE, rT          ; table-relative entries (PIC); absent for absolute ones
    jr     rE

The forward evaluation is `jumptable_eval.py`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import capstone as cs

from binlens.analysis.codemap import CodeMap
from binlens.analysis.switches.common import Chunks, Resolution
from binlens.analysis.switches.symbolic import NEGATE, State, Value, resolve

if TYPE_CHECKING:
    from capstone.riscv import RISCVOp

    from binlens.analysis.decode.capstone_backend import CapstoneBackend

RV_LOADS = {
    "lb": (1, True),
    "lbu": (1, False),
    "lh": (2, True),
    "lhu": (2, False),
    "lw": (4, True),
    "lwu": (4, False),
    "ld": (8, False),
    "lwsp": (4, True),
    "ldsp": (8, False),
}
RV_STORES = {"sb": 1, "sh": 2, "sw": 4, "sd": 8, "swsp": 4, "sdsp": 8, "fsw": 4, "fsd": 8, "fswsp": 4, "fsdsp": 8}
_RV_CALL_CLOBBERS = ("ra", "t0", "t1", "t2", "t3", "t4", "t5", "t6", *(f"a{k}" for k in range(8)))
_RV_BRANCH = {"bltu": "lt", "bgeu": "ge", "bgtu": "gt", "bleu": "le"}
RV_ALIASES = {"fp": "s0", "x8": "s0", "x2": "sp", "x1": "ra", "x0": "zero"}


def _rv_is_jump(ins: cs.CsInsn) -> bool:
    m = ins.mnemonic.removeprefix("c.")
    return m == "jr" or (m == "jalr" and ins.op_str.startswith(("zero", "x0")))


def reg_name(ins: cs.CsInsn, op: RISCVOp) -> str:
    """The name of register operand `op` of `ins`, an alias (`fp`, `x8`, ...) by its ABI name."""
    name = ins.reg_name(op.reg) or ""
    return RV_ALIASES.get(name, name)


def mem_operand(ins: cs.CsInsn, ops: list[RISCVOp]) -> tuple[str, int] | None:
    """(base register, displacement) of `lw rd, d(rs)` or of capstone's compressed `c.lw rd, d, rs`."""
    if len(ops) == 2 and ops[1].type == cs.CS_OP_MEM:
        mem = ops[1].mem
        name = ins.reg_name(mem.base) or ""
        return RV_ALIASES.get(name, name), mem.disp
    if len(ops) == 3 and ops[1].type == cs.CS_OP_IMM and ops[2].type == cs.CS_OP_REG:
        return reg_name(ins, ops[2]), ops[1].imm
    return None


class RvState(State):
    FRAME = ("sp", "s0")

    @staticmethod
    def is_load(ins: cs.CsInsn) -> bool:
        """A load into an integer register."""
        return ins.mnemonic.removeprefix("c.") in RV_LOADS

    @staticmethod
    def indexes(ins: cs.CsInsn) -> bool:
        """`add` (RISC-V has no indexed loads)."""
        return ins.mnemonic.removeprefix("c.") == "add"

    def read(self, reg: str) -> Value:
        """The register's value; `zero` reads 0."""
        if reg == "zero":
            return ("c", 0)
        return super().read(reg)

    def write(self, reg: str, value: Value | None = None) -> None:
        """Set a register; writes to `zero` are dropped."""
        if reg != "zero":
            super().write(reg, value)

    def jump_value(self, ins: cs.CsInsn) -> Value:
        """`jr rE` (or `jalr zero, 0(rE)`) jumps to the register (plus an offset, which must be 0)."""
        regs = [op for op in ins.operands if op.type == cs.CS_OP_REG]
        imms = [op.imm for op in ins.operands if op.type == cs.CS_OP_IMM]
        mems = [op for op in ins.operands if op.type == cs.CS_OP_MEM]
        if mems:
            if mems[0].mem.disp:
                return self.fresh()
            return self.read(RV_ALIASES.get(ins.reg_name(mems[0].mem.base), ins.reg_name(mems[0].mem.base)))
        if not regs or any(imms):
            return self.fresh()
        return self.read(reg_name(ins, regs[-1]))

    def step(self, ins: cs.CsInsn, next_va: int) -> None:
        """Evaluate `ins`; `next_va` is the address executed after it on this path."""
        m = ins.mnemonic.removeprefix("c.")
        ops = ins.operands
        if m in ("jal", "jalr", "call"):
            regs = [reg_name(ins, op) for op in ops if op.type == cs.CS_OP_REG]
            if m == "jal" and regs[:1] == ["zero"] or m == "jalr" and regs[:1] == ["zero"]:
                return
            self.memo = {}
            for r in _RV_CALL_CLOBBERS:
                self.write(r)
            self.slots = {s: v for s, v in self.slots.items() if s[0] in self.FRAME}
            return
        if m in _RV_BRANCH:
            self._branch(ins, m, ops, next_va)
            return
        if m.startswith("b") or m in ("j", "jr", "nop", "fence"):
            return
        if m in RV_STORES:
            self._store(ins, m, ops)
            return
        if m in RV_LOADS:
            self._load(ins, m, ops)
            return
        if m.startswith(("amo", "sc.")):  # atomics write memory
            self.memo = {}
            self.slots = {}
        if not self._arith(ins, m, ops) and ops and ops[0].type == cs.CS_OP_REG:
            self.write(reg_name(ins, ops[0]))

    def _branch(self, ins: cs.CsInsn, m: str, ops: list, next_va: int) -> None:
        regs = [op for op in ops if op.type == cs.CS_OP_REG]
        imms = [op.imm for op in ops if op.type == cs.CS_OP_IMM]
        if len(regs) != 2 or len(imms) != 1:
            return
        target = ins.address + imms[0]
        size = ins.size
        if target == ins.address + size:
            return
        if next_va == target:
            holds = _RV_BRANCH[m]
        elif next_va == ins.address + size:
            holds = NEGATE[_RV_BRANCH[m]]
        else:
            return
        a, b = self.read(reg_name(ins, regs[0])), self.read(reg_name(ins, regs[1]))
        if b[0] == "c" and a[0] != "c":
            self.bound(a, holds, b[1], False)
        elif a[0] == "c" and b[0] != "c":
            self.bound(b, holds, a[1], True)

    def _load(self, ins: cs.CsInsn, m: str, ops: list) -> None:
        size, signed = RV_LOADS[m]
        where = mem_operand(ins, ops)
        if where is None or not ops or ops[0].type != cs.CS_OP_REG:
            self.slots = {}
            for op in ops[:1]:
                if op.type == cs.CS_OP_REG:
                    self.write(reg_name(ins, op))
            return
        dst = reg_name(ins, ops[0])
        base, disp = where
        if self.frame_base(base):
            self.write(dst, self.slot_load(base, disp, size))
            return
        b = self.read(base)
        addr = self.add(b, self.const(disp)) if disp else b
        self.write(dst, self.pointer_load(addr, size, signed))

    def _store(self, ins: cs.CsInsn, m: str, ops: list) -> None:
        where = mem_operand(ins, ops)
        if where is None or not ops or ops[0].type != cs.CS_OP_REG:
            self.memo = {}  # a store may change what any pointer reads
            self.slots = {}
            return
        base, disp = where
        if base != "sp":  # (the callee's own frame, below the caller's pointers: a spill changes none)
            self.memo = {}
        src = reg_name(ins, ops[0])
        value = self.read(src) if not m.startswith("f") else None
        self.slot_store(base, disp, RV_STORES[m], value)

    def _arith(self, ins: cs.CsInsn, m: str, ops: list) -> bool:
        """li/lui/auipc/addi/add/mv/slli/sext.w/zext.w (and compressed forms): False when not modelled."""
        if not ops or ops[0].type != cs.CS_OP_REG:
            return False
        dst = reg_name(ins, ops[0])
        n = len(ops)
        imm = ops[-1].imm if ops[-1].type == cs.CS_OP_IMM else None
        if m == "li" and n == 2 and imm is not None:
            self.write(dst, self.const(imm))
            return True
        if m == "lui" and n == 2 and imm is not None:
            k = (imm << 12) & 0xFFFFFFFF
            self.write(dst, self.const(k - (1 << 32) if k >> 31 else k))
            return True
        if m == "auipc" and n == 2 and imm is not None:
            k = (imm << 12) & 0xFFFFFFFF
            self.write(dst, self.const(ins.address + (k - (1 << 32) if k >> 31 else k)))
            return True
        if m in ("zext.b", "zext.h") and n == 2 and ops[1].type == cs.CS_OP_REG:
            self.write(dst, self.mask_low(self.read(reg_name(ins, ops[1])), 8 if m == "zext.b" else 16))
            return True
        if m in ("mv", "sext.w", "zext.w") and n == 2 and ops[1].type == cs.CS_OP_REG:
            v = self.read(reg_name(ins, ops[1]))
            if m == "sext.w" and v[0] == "c":
                k = v[1] & 0xFFFFFFFF
                v = self.const(k - (1 << 32) if k >> 31 else k)
            elif m == "zext.w" and v[0] == "c":
                v = self.const(v[1] & 0xFFFFFFFF)
            elif m == "sext.w" and v[0] == "e" and v[2] == 4:
                v = ("e", v[1], 4, True, v[4])
            elif m != "mv" and v[0] not in ("v", "d"):
                self.write(dst)  # not an index: a new unknown
                return True
            self.write(dst, v)
            return True
        # two-operand compressed forms: `c.addi rd, imm`, `c.add rd, rs`, `c.slli rd, imm`
        if n == 2:
            a = self.read(dst)
            if m in ("addi", "addi16sp") and imm is not None:
                self.write(dst, self.add(a, self.const(imm)))
                return True
            if m == "add" and ops[1].type == cs.CS_OP_REG:
                self.write(dst, self.add(a, self.read(reg_name(ins, ops[1]))))
                return True
            if m == "slli" and imm is not None:
                self.write(dst, self.shift_left(a, imm))
                return True
            if m == "srli" and imm is not None and a[0] == "h":
                self.write(dst, self.unshift(a, imm))
                return True
            return False
        if n != 3 or ops[1].type != cs.CS_OP_REG:
            return False
        a = self.read(reg_name(ins, ops[1]))
        if m == "addiw" and imm is not None:  # a 32-bit add: a rebased 32-bit index has its own identity
            if a[0] == "c":
                k = (a[1] + imm) & 0xFFFFFFFF
                self.write(dst, self.const(k - (1 << 32) if k >> 31 else k))
            else:
                self.write(dst, ("d", ("w", a), imm) if a[0] in ("v", "d") else None)
            return True
        if m == "srli" and imm is not None and a[0] == "h":
            self.write(dst, self.unshift(a, imm))
            return True
        if m == "andi" and imm is not None and imm > 0 and not imm & (imm + 1) and imm.bit_length() <= 8:
            self.write(dst, self.mask_low(a, imm.bit_length()))  # zext.b, `op & 0x7f`
            return True
        if m in ("addi", "addi4spn") and imm is not None:
            self.write(dst, self.add(a, self.const(imm)))
            return True
        if m == "add" and ops[2].type == cs.CS_OP_REG:
            self.write(dst, self.add(a, self.read(reg_name(ins, ops[2]))))
            return True
        if m == "slli" and imm is not None:
            self.write(dst, self.shift_left(a, imm))
            return True
        return False


def riscv_jump_table_targets(
    backend: CapstoneBackend, codemap: CodeMap, slice_start: int, jump_va: int, earlier: Chunks = ()
) -> Resolution:
    """Case targets of the RISC-V `jr` at `jump_va`, the table address (0 when none), and whether a
    bound check guards it. Only complete, bounded dispatches resolve; otherwise `([], 0, True)`."""
    return resolve(backend, codemap, slice_start, jump_va, earlier, RvState, _rv_is_jump, 2)
