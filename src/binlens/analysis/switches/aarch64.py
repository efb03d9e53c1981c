"""Jump tables behind AArch64 `br xN` (the switch dispatches gcc and clang emit).

The shapes handled (any register allocation, any order of the independent steps):

    cmp   wI, #N             ; or `subs wD, wI, #N` (the value compared is wI before the write)
    b.hi  default            ; or b.hs; or b.ls/b.lo to the dispatch (the taken side)
    adrp  xT, tbl
    add   xT, xT, :lo12:tbl  ; (or `adr xT, tbl`)
    ldrb  wE, [xT, wI, uxtw] ; ldrh ... lsl #1, ldr/ldrsw ... lsl #2 (the index scaled by the size)
    adr   xB, anchor         ; or the table itself as the base
    add   xB, xB, wE, sxtb #2; or `xE, lsl #2`, `wE, sxtw`, `wE, sxth #2`, a plain `xE`
    br    xB

They are recognised by a small forward evaluation over the recorded path to the jump (the
jump's chunk, the chunk before it and up to `_MAX_CHUNKS` earlier ones): registers and stack
slots hold symbolic values (a constant, an opaque value with an identity, a table entry, a
computed target), so an index spilled to the stack and reloaded at -O0 keeps its identity. A
table is resolved only when everything is known: the branch register is `base + extend(entry)
<< shift` with a constant base, the entry is loaded from a constant read-only table at the
index, and a compare-and-branch on that same index on the path bounds it. Anything else leaves
the jump unresolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import capstone as cs
from capstone import arm64 as a64

from binlens.analysis.codemap import CodeMap
from binlens.analysis.switches import common as jt

if TYPE_CHECKING:
    from capstone.arm64 import Arm64Op

    from binlens.analysis.decode.capstone_backend import CapstoneBackend

_MAX_MASK = 256  # `and` with a mask of at most this many values bounds a table
_MAX_CHUNKS = 8  # earlier chunks evaluated before the jump's own slice
_MASK = (1 << 64) - 1
_ZR = "zr"
_SP, _FP = 31, 29
RegKey = int | str  # a register as `_State.key` names it: its number, or its name (the zero register, others)
_CLOBBERED_BY_CALL = (*range(19), 30)
_COMPARES = ("cmp", "cmn", "tst", "ccmp", "ccmn", "fcmp", "fcmpe", "fccmp", "fccmpe")
_EXT_BITS = {
    a64.ARM64_EXT_UXTB: (8, False),
    a64.ARM64_EXT_UXTH: (16, False),
    a64.ARM64_EXT_UXTW: (32, False),
    a64.ARM64_EXT_UXTX: (64, False),
    a64.ARM64_EXT_SXTB: (8, True),
    a64.ARM64_EXT_SXTH: (16, True),
    a64.ARM64_EXT_SXTW: (32, True),
    a64.ARM64_EXT_SXTX: (64, True),
    a64.ARM64_EXT_INVALID: (64, False),
}
# (condition that holds on the taken side, holds on the fall-through side): "le" = index <= N,
# "lt" = index < N, for an unsigned compare of the index with N
_BOUND_SIDES = {
    a64.ARM64_CC_HI: (None, "le"),
    a64.ARM64_CC_HS: (None, "lt"),
    a64.ARM64_CC_LS: ("le", None),
    a64.ARM64_CC_LO: ("lt", None),
}

# Symbolic values (tuples, hashable): ("c", k) a constant; ("v", n) an unknown value with an
# identity; ("e", table, size, signed, width, index) an entry loaded from table[index];
# ("t", base, entry, ext, shift) the computed target base + (extend(entry) << shift).
Value = tuple


def a64_jump_table_targets(
    backend: CapstoneBackend, codemap: CodeMap, slice_start: int, jump_va: int, earlier: jt.Chunks = ()
) -> jt.Resolution:
    """Case targets of the AArch64 `br` at `jump_va`, the table address (0 when none), and whether a
    bound check guards it. Only complete, bounded dispatches resolve; otherwise `([], 0, True)`."""
    image, md, own = jt.jump_slice(backend, slice_start, jump_va)
    if not own or own[-1].address != jump_va or own[-1].mnemonic != "br":
        return jt.NONE
    # the load is next to the jump, or (gcc -O0 merges a function's computed gotos into one `br`
    # that every handler jumps to) in the chunk that jumped there
    if not any(map(_indexed_load, own)) and not any(map(_indexed_load, jt.decode_path(md, image, earlier[:1]))):
        return jt.NONE  # no table load next to the jump: a tail call or a call through a pointer
    insns = jt.path_to_jump(md, image, earlier, _MAX_CHUNKS, own)
    state = _State(md)
    jt.walk(state, insns)
    target = state.read(insns[-1].operands[0].reg)
    if target[0] == "e" and target[2] == 8:
        # `br` to the entry itself: a table of absolute code pointers (`goto *tbl[op & 0x7f]`)
        entry, base, ext, shift, absolute = target, 0, 0, 0, True
    elif target[0] == "t":
        _t, base, entry, ext, shift = target
        absolute = False
    else:
        return jt.NONE
    _e, table, size, signed, width, index = entry
    count = jt.entry_count(state.bounds, index)
    values = None if count is None else jt.read_entries(image, table, size, count, False)
    if values is None:
        return jt.NONE
    targets = []
    for v in values:
        t = v if absolute else (base + (_extend(_register_value(v, size, signed, width), ext) << shift)) & _MASK
        if jt.near_code(codemap, t, jump_va, 4):  # only targets in code next to the jump
            targets.append(t)
        elif absolute:
            break  # a mask bounds the index, not the table: the words after it are other data
    return targets, table, True


def _register_value(raw: int, size: int, signed: bool, width: int) -> int:
    """The destination register's 64-bit value after `ldr{s}{b,h,w}` of `raw` into a W/X register."""
    if signed and raw >> (size * 8 - 1):
        raw -= 1 << (size * 8)
    return raw & ((1 << width) - 1)


def _extend(value: int, ext: int) -> int:
    """The operand value after an `add`'s extend (uxtb ... sxtx; none = the whole register)."""
    bits, signed = _EXT_BITS[ext]
    value &= (1 << bits) - 1
    if signed and value >> (bits - 1):
        value -= 1 << bits
    return value


def _indexed_load(ins: cs.CsInsn) -> bool:
    """A load from `[xT, xI ...]` (register index): what reads a table entry."""
    ops = ins.operands
    return ins.mnemonic.startswith("ld") and bool(ops) and ops[-1].type == a64.ARM64_OP_MEM and ops[-1].mem.index != 0


class _State:
    """Registers, stack slots, the last compare and the bounds learnt along one path."""

    def __init__(self, md: cs.Cs) -> None:
        self.md = md
        self.regs: dict[RegKey, Value] = {}
        self.slots: dict[tuple[RegKey, int, int], Value] = {}
        self.flags: tuple[Value, int] | None = None
        self.bounds: dict[Value, int] = {}
        self._next = 0

    # ------------------------------------------------------------------ values
    def fresh(self) -> Value:
        self._next += 1
        return ("v", self._next)

    def key(self, reg: int) -> RegKey:
        """Canonical register: w8 and x8 are one register; sp/wsp 31; the zero register apart."""
        name = self.md.reg_name(reg) or ""
        if name in ("xzr", "wzr"):
            return _ZR
        if name in ("sp", "wsp"):
            return _SP
        if name == "fp":
            return _FP
        if name == "lr":
            return 30
        if name[:1] in ("x", "w") and name[1:].isdigit():
            return int(name[1:])
        return name

    def read(self, reg: int) -> Value:
        k = self.key(reg)
        if k == _ZR:
            return ("c", 0)
        v = self.regs.get(k)
        if v is None:
            v = self.regs[k] = self.fresh()  # an unknown input keeps one identity along the path
        return v

    def write(self, reg: int, value: Value | None = None) -> None:
        k = self.key(reg)
        if k == _ZR:
            return
        self.regs[k] = value if value is not None else self.fresh()
        if k in (_SP, _FP):
            self.slots = {s: v for s, v in self.slots.items() if s[0] != k}

    # ------------------------------------------------------------------ one instruction
    def step(self, ins: cs.CsInsn, next_va: int) -> None:
        """Evaluate `ins`; `next_va` is the address executed after it on this path."""
        m = ins.mnemonic
        ops = ins.operands
        if m.startswith("b.") or m == "b":
            if m != "b":
                self._branch(ins, next_va)
            return
        if m in ("bl", "blr", "blraa", "blrab", "blraaz", "blrabz"):
            for r in _CLOBBERED_BY_CALL:
                self.regs[r] = self.fresh()
            self.flags = None
            return
        if m in ("cbz", "cbnz", "tbz", "tbnz", "nop", "bti", "hint"):
            return
        if m in _COMPARES:
            self.flags = None
            if m == "cmp" and len(ops) == 2:
                bound = self._operand_constant(ops[1])
                if bound is not None and ops[0].type == a64.ARM64_OP_REG:
                    self.flags = (self.read(ops[0].reg), bound)
            return
        if m == "subs" and len(ops) == 3 and ops[1].type == a64.ARM64_OP_REG:
            bound = self._operand_constant(ops[2])
            compared = self.read(ops[1].reg)
            self.write(ops[0].reg)
            self.flags = (compared, bound) if bound is not None else None
            return
        if ins.update_flags:
            self.flags = None
        if m.startswith("ld") and ops and ops[-1].type == a64.ARM64_OP_MEM:
            self._load(ins, m, ops)
        elif m.startswith("st") and ops and ops[-1].type == a64.ARM64_OP_MEM:
            self._store(ins, m, ops)
        elif not self._arith(m, ops):
            for r in ins.regs_access()[1]:
                if self.md.reg_name(r) != "nzcv":
                    self.write(r)

    def _branch(self, ins: cs.CsInsn, next_va: int) -> None:
        """A conditional branch: learn the index bound on the side this path takes."""
        if self.flags is None:
            return
        sides = _BOUND_SIDES.get(ins.cc)
        target = ins.operands[0].imm if ins.operands else -1
        if sides is None or target == ins.address + 4:
            return
        if next_va == target:
            side = sides[0]
        elif next_va == ins.address + 4:
            side = sides[1]
        else:
            return
        if side is not None:
            value, n = self.flags
            count = n + 1 if side == "le" else n
            self.bounds[value] = min(count, self.bounds.get(value, count))

    def _operand_constant(self, op: Arm64Op) -> int | None:
        """The value of an immediate (with its `lsl #12`) or of a register holding a constant."""
        if op.type == a64.ARM64_OP_IMM:
            imm = op.imm
            if op.shift.type == a64.ARM64_SFT_LSL:
                imm <<= op.shift.value
            return imm if imm >= 0 else None
        if op.type == a64.ARM64_OP_REG and op.shift.type == 0 and op.ext == 0:
            v = self.read(op.reg)
            return v[1] if v[0] == "c" and v[1] >= 0 else None
        return None

    def _arith(self, m: str, ops: list) -> bool:
        """adrp/adr/mov/add/sub/extends whose result can be followed; False when not modelled."""
        if len(ops) < 2 or ops[0].type != a64.ARM64_OP_REG:
            return False
        dst = ops[0].reg
        if m in ("adrp", "adr") and ops[1].type == a64.ARM64_OP_IMM:
            self.write(dst, ("c", ops[1].imm))
            return True
        mask = 0xFFFFFFFF if self._is_w(dst) else _MASK
        if m in ("mov", "sxtw", "uxtw") and len(ops) == 2:
            if ops[1].type == a64.ARM64_OP_IMM:
                self.write(dst, ("c", ops[1].imm & mask))
            elif ops[1].type == a64.ARM64_OP_REG and ops[1].shift.type == 0:
                v = self.read(ops[1].reg)
                self.write(dst, ("c", v[1] & mask) if v[0] == "c" and m == "mov" else v)
            else:
                return False
            return True
        if m in ("add", "sub") and len(ops) == 3 and ops[1].type == a64.ARM64_OP_REG:
            self.write(dst, self._sum(m, dst, ops))
            return True
        if m == "and" and len(ops) == 3 and ops[1].type == a64.ARM64_OP_REG and ops[2].type == a64.ARM64_OP_IMM:
            value = self.fresh()
            n = ops[2].imm + 1
            if n & (n - 1) == 0 and 2 <= n <= _MAX_MASK:
                self.bounds[value] = n  # `and wI, wX, #2^k - 1` bounds an index like a compare
            self.write(dst, value)
            return True
        return False

    def _sum(self, m: str, dst: int, ops: list) -> Value:
        a = self.read(ops[1].reg)
        op = ops[2]
        if op.type == a64.ARM64_OP_IMM:
            imm = self._operand_constant(op)
            if a[0] == "c" and imm is not None:
                mask = 0xFFFFFFFF if self.key(dst) != _SP and self._is_w(dst) else _MASK
                return ("c", (a[1] + imm if m == "add" else a[1] - imm) & mask)
            return self.fresh()
        if m != "add" or op.type != a64.ARM64_OP_REG or (self.key(dst) != _SP and self._is_w(dst)):
            return self.fresh()
        b = self.read(op.reg)
        shift = op.shift.value if op.shift.type == a64.ARM64_SFT_LSL else 0
        if op.shift.type not in (0, a64.ARM64_SFT_LSL) or shift > 4:
            return self.fresh()
        if a[0] == "c" and b[0] == "e":
            return ("t", a[1], b, op.ext, shift)
        if b[0] == "c" and a[0] == "e" and op.ext == 0 and shift == 0:
            return ("t", b[1], a, 0, 0)
        if a[0] == "c" and b[0] == "c" and op.ext == 0:
            return ("c", (a[1] + (b[1] << shift)) & _MASK)
        return self.fresh()

    def _is_w(self, reg: int) -> bool:
        return (self.md.reg_name(reg) or "").startswith("w")

    # ------------------------------------------------------------------ memory
    def _load(self, ins: cs.CsInsn, m: str, ops: list) -> None:
        mem = ops[-1].mem
        regs = [op.reg for op in ops[:-1] if op.type == a64.ARM64_OP_REG]
        if ins.writeback or len(regs) != 1 or m.startswith(("ldp", "ldx", "ldax", "ldn")):
            for r in ins.regs_access()[1]:
                self.write(r)
            return
        dst = regs[0]
        if (self.md.reg_name(dst) or "")[:1] not in ("x", "w"):
            self.write(dst)  # SIMD and FP registers: not an index or a table entry
            return
        size, signed = _load_size(m, self._is_w(dst))
        width = 32 if self._is_w(dst) else 64
        if mem.index:
            table = self.read(mem.base)
            index = self.read(mem.index)
            op = ops[-1]
            scale = op.shift.value if op.shift.type == a64.ARM64_SFT_LSL else 0
            ok = (
                size
                and table[0] == "c"
                and mem.disp == 0
                and op.shift.type in (0, a64.ARM64_SFT_LSL)
                and scale == {1: 0, 2: 1, 4: 2, 8: 3}[size]
            )
            self.write(dst, ("e", table[1], size, signed, width, index) if ok else None)
            return
        base = self.key(mem.base)
        if base in (_SP, _FP) and size:
            value = self.slots.get((base, mem.disp, size))
            if value is None:
                value = self.slots[(base, mem.disp, size)] = self.fresh()
            self.write(dst, value if not signed else None)
            return
        self.write(dst)

    def _store(self, ins: cs.CsInsn, m: str, ops: list) -> None:
        mem = ops[-1].mem
        base = self.key(mem.base)
        regs = [op.reg for op in ops[:-1] if op.type == a64.ARM64_OP_REG]
        if base not in (_SP, _FP) or mem.index:
            self.slots = {}  # a store through a pointer may alias any slot
        else:
            size = _store_size(m, self.md.reg_name(regs[0]) if regs else "") * (2 if m.startswith("stp") else 1)
            lo, hi = mem.disp, mem.disp + max(size, 16)  # unknown sizes: assume a wide store
            if ins.writeback or not size:
                self.slots = {s: v for s, v in self.slots.items() if s[0] != base}
            else:
                self.slots = {
                    s: v for s, v in self.slots.items() if s[0] != base or not (s[1] < hi and lo < s[1] + s[2])
                }
            if m in ("str", "stur") and len(regs) == 1 and size in (4, 8) and not ins.writeback:
                self.slots[(base, mem.disp, size)] = self.read(regs[0])
        for r in ins.regs_access()[1]:
            self.write(r)  # writeback of the base, status registers of exclusive stores


def _store_size(m: str, reg: str) -> int:
    """Bytes written per register by a store (0 when unknown)."""
    if not m.startswith(("stp", "stnp")):
        if m.endswith("b"):
            return 1
        if m.endswith("h"):
            return 2
    if reg in ("sp", "xzr"):
        return 8
    if reg == "wzr":
        return 4
    return {"x": 8, "w": 4, "q": 16, "d": 8, "s": 4, "h": 2, "b": 1}.get(reg[:1], 0)


def _load_size(m: str, to_w: bool) -> tuple[int, bool]:
    """(bytes, sign-extending) of a plain load mnemonic (ldr, ldur, ldrb ... ldursw); (0, False) else."""
    m = m.removeprefix("ld")
    if m.startswith("ur"):
        m = m[2:]
    elif m.startswith("r"):
        m = m[1:]
    else:
        return 0, False
    if m == "":
        return (4 if to_w else 8), False
    return {"b": (1, False), "h": (2, False), "sb": (1, True), "sh": (2, True), "sw": (4, True)}.get(m, (0, False))
