"""Jump tables behind ARM32 and Thumb-2 indirect jumps (the switch dispatches gcc and clang emit).

The shapes handled (any register allocation; the bound check in the same chunk or the one before):

    cmp   rI, #N ; bhi default         ; or bhs; or a conditional exit `bxhi lr` (clang: `it hi`)
    tbb   [pc, rI]                     ; Thumb-2: byte entries at jump+4, target = jump+4 + 2*entry
    tbh   [pc, rI, lsl #1]             ; Thumb-2: halfword entries, the same
    ldrls pc, [pc, rI, lsl #2]         ; ARM (gcc, non-PIC): absolute words at jump+8 (the bound is
    b     default                      ;   the jump's own condition; the next instruction is default)
    addls pc, pc, rI, lsl #2           ; ARM (gcc, PIC): a table of `b case` instructions at jump+8
    adr   rT, tbl ; ldr pc, [rT, rI, lsl #2]               ; absolute words (bit 0: Thumb target)
    adr   rT, tbl ; ldr rE, [rT, rI, lsl #2] ; add pc, rT, rE  ; words relative to the table (clang)
    adr   rT, tbl ; ldr rE, [rT, rI, lsl #2] ; mov pc, rE      ; (clang -O0, non-PIC)
    adr   rT, tbl ; ldr rE, [rT, rI, lsl #2] ; add rT, rE ; bx rT  ; (gcc Thumb -O0)
    and   rI, rX, #15 ; ldr rT, [rT, rI, lsl #2] ; orr rT, rT, #1 ; bx rT  ; gcc's computed goto in
                                       ;   Thumb code (`goto *tbl[op & 15]`): labels without bit 0
                                       ;   in data, the mask bounds the index (the table ends at
                                       ;   the first word that is no code address), and the shared
                                       ;   `orr; bx` is evaluated with the chunks that branch to it

The table register may also come from a literal pool (`ldr rT, [pc, #k]`, with `add rT, pc` in
PIC code) or `movw`/`movt`. They are recognised by a small forward evaluation over the recorded
path to the jump (the jump's chunk, the chunk before it and up to `_MAX_CHUNKS` earlier ones):
registers and stack slots hold symbolic values (a constant, an opaque value with an identity, a
table entry, a computed target), so an index spilled to the stack and reloaded at -O0 keeps its
identity. Conditional instructions are followed by what the path says about their condition: a
conditional exit the path continues past (`bxhi lr`), a conditional branch whose side the path
took, or the jump's own condition (`ldrls pc`) tell which conditions hold since the last compare;
an instruction whose condition is unknown makes what it writes unknown. A table is resolved only
when the jump's target is a known function of a table entry (or, for `b` tables, of the index)
and a compare of that same index bounds it; anything else leaves the jump unresolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import capstone as cs
from capstone import arm

from binlens.analysis.codemap import BODY, CodeMap
from binlens.analysis.switches import common as jt
from binlens.analysis.switches.tables import writable

if TYPE_CHECKING:
    from capstone.arm import ArmOp, ArmOpMem

    from binlens.analysis.decode.capstone_backend import CapstoneBackend
    from binlens.loader.image import Image

_MAX_CHUNKS = 8  # earlier chunks evaluated before the jump's own slice
_MAX_MASK = 256  # `and` with a mask of at most this many values bounds a table
_MASK = 0xFFFFFFFF
_PC, _SP, _LR = arm.ARM_REG_PC, arm.ARM_REG_SP, arm.ARM_REG_LR
_FRAMES = (arm.ARM_REG_SP, arm.ARM_REG_R7, arm.ARM_REG_R11)  # stack slots are kept relative to these
_CLOBBERED_BY_CALL = (arm.ARM_REG_R0, arm.ARM_REG_R1, arm.ARM_REG_R2, arm.ARM_REG_R3, arm.ARM_REG_R12, _LR)
_AL = (arm.ARM_CC_AL, arm.ARM_CC_INVALID)
_HI, _HS = arm.ARM_CC_HI, arm.ARM_CC_HS
_COMPARES = (arm.ARM_INS_CMP, arm.ARM_INS_CMN, arm.ARM_INS_TST, arm.ARM_INS_TEQ)
_BRANCHES = (arm.ARM_INS_B, arm.ARM_INS_BX, arm.ARM_INS_CBZ, arm.ARM_INS_CBNZ)
_CALLS = (arm.ARM_INS_BL, arm.ARM_INS_BLX)
_NO_EFFECT = (arm.ARM_INS_IT, arm.ARM_INS_NOP, arm.ARM_INS_CBZ, arm.ARM_INS_CBNZ)
_LOADS = {
    arm.ARM_INS_LDR: (4, False),
    arm.ARM_INS_LDRH: (2, False),
    arm.ARM_INS_LDRB: (1, False),
    arm.ARM_INS_LDRSH: (2, True),
    arm.ARM_INS_LDRSB: (1, True),
}
_STORES = {arm.ARM_INS_STR: 4, arm.ARM_INS_STRH: 2, arm.ARM_INS_STRB: 1}
_TABLE_BRANCHES = {arm.ARM_INS_TBB: 1, arm.ARM_INS_TBH: 2}

# Symbolic values (tuples, hashable): ("c", k) a constant; ("v", n) an unknown value with an
# identity; ("e", table, size, signed, index) an entry loaded from table[index];
# ("t", base, inner, shift) the computed address base + (inner << shift), inner an entry (a table
# of offsets) or an index (a table of `b` instructions); ("x", index, s) an index shifted left by s.
Value = tuple


def arm_jump_table_targets(
    backend: CapstoneBackend, codemap: CodeMap, slice_start: int, jump_va: int, earlier: jt.Chunks = ()
) -> jt.Resolution:
    """Case targets of the ARM/Thumb indirect jump at `jump_va`, the table address (0 when none),
    and whether a bound check guards it. Only complete, bounded dispatches resolve; otherwise
    `([], 0, True)`. Thumb case targets are added to the backend's Thumb set; a table inside code
    (tbb/tbh, the words after `ldr pc`/`add pc`) is marked in the code map, so it is never decoded."""
    thumb = jump_va in backend.thumb or slice_start in backend.thumb
    image, md, own = jt.jump_slice(backend, slice_start, jump_va, thumb)
    if not own or own[-1].address != jump_va:
        return jt.NONE
    if not _reads_a_table(own):
        # no table next to the jump: a return, a call or tail call through a pointer; or gcc's
        # computed goto in Thumb code, whose shared `orr rT, rT, #1; bx rT` the handlers branch to
        if not (earlier and _thumb_goto(own)):
            return jt.NONE
        own = jt.path_to_jump(md, image, earlier, _MAX_CHUNKS, own)
        if not _reads_a_table(own):
            return jt.NONE
    if len(own) > 1 and _sets_return_address(own[-2]):
        return jt.NONE  # `mov lr, pc; ldr pc, [rT, rI, lsl #2]`: a call through a table of function pointers
    # The jump's own slice first; then with the earlier chunks (a table address set before a loop).
    # Not the other way round: an earlier chunk of one path may make the index a constant
    # (`mov r1, #75; b dispatch`), and a constant index is no table.
    found = _evaluate(image, thumb, own)
    if found is None and earlier:
        found = _evaluate(image, thumb, jt.path_to_jump(md, image, earlier, _MAX_CHUNKS, own))
    if found is None:
        return jt.NONE
    (table, size, signed, count, base, shift, entries, masked), interworking = found
    if not image.is_mapped(table):
        return jt.NONE
    # a table of `b` instructions (no entries): the index selects the slot
    values = jt.read_entries(image, table, size, count, signed) if entries else list(range(count))
    if values is None:
        return jt.NONE
    targets = []
    read = 0
    for v in values:
        t = (base + (v << shift)) & _MASK
        to_thumb = bool(t & 1) if interworking else thumb
        t &= ~1
        if not jt.near_code(codemap, t, jump_va, 2 if to_thumb else 4):
            if masked:
                break  # a mask bounds the index, not the table: the words after it are other data
            continue  # only targets in code next to the jump
        read += 1
        if to_thumb:
            backend.thumb.add(t)
        targets.append(t)
    if not entries:
        return list(dict.fromkeys(targets)), 0, True  # the slots are code, nothing is read
    _mark_data(codemap, table, size * (read if masked else count))
    return list(dict.fromkeys(targets)), table, True


def _evaluate(image: Image, thumb: bool, insns: list[cs.CsInsn]) -> tuple[tuple, bool] | None:
    """The table behind the path `insns` (ending at the jump) and whether its targets interwork."""
    state = _State(image, thumb, _known_false(insns))
    for k, ins in enumerate(insns[:-1]):
        state.step(k, ins)
    target, interworking = state.jump_target(insns[-1])
    found = _table(state, target)
    return None if found is None else (found, interworking)


def _table(state: _State, target: Value) -> tuple[int, int, bool, int, int, int, bool, bool] | None:
    """(table, entry size, signed, entries, base, shift, read entries?, bounded by a mask?) of a
    jump to `target`."""
    if target[0] == "e":
        entry, base, shift = target, 0, 0  # absolute addresses (`ldr pc, [rT, rI, lsl #2]`)
    elif target[0] == "t":
        _t, base, entry, shift = target
    else:
        return None
    if entry[0] == "e":
        _e, table, size, signed, index = entry
        reads = True
    elif entry[0] == "v" and shift == 2:
        table, size, signed, index, reads = base, 4, False, entry, False  # `addls pc, pc, rI, lsl #2`
    else:
        return None
    count = jt.entry_count(state.bounds, index)
    if count is None:
        return None
    return table, size, signed, count, base, shift, reads, index in state.masked


def _mark_data(codemap: CodeMap, va: int, n: int) -> None:
    """Mark unexplored bytes of a table inside code as instruction bodies: never a chunk start."""
    r = codemap.region(va)
    if r is None:
        return
    lo, hi = va - r.va, min(va + n, r.end) - r.va
    state = r.state
    if state.count(0, lo, hi) == hi - lo:
        state[lo:hi] = bytes([BODY]) * (hi - lo)
    else:
        for o in range(lo, hi):
            if state[o] == 0:
                state[o] = BODY


def _reads_a_table(insns: list[cs.CsInsn]) -> bool:
    """tbb/tbh, an indexed load, or `add pc, pc, rI, lsl #2` at or before the jump."""
    jump = insns[-1]
    if jump.id in _TABLE_BRANCHES:
        return True
    ops = jump.operands
    if jump.id == arm.ARM_INS_ADD and len(ops) == 3 and ops[1].type == arm.ARM_OP_REG and ops[1].reg == _PC:
        return True
    for ins in insns:
        ops = ins.operands
        if ins.id in _LOADS and ops and ops[-1].type == arm.ARM_OP_MEM and ops[-1].mem.index != 0:
            return True
    return False


def _thumb_goto(own: list[cs.CsInsn]) -> bool:
    """`orr rT, rT, #1; bx rT`: a jump to a Thumb address read from a table of labels without bit 0."""
    if len(own) < 2 or own[-1].id != arm.ARM_INS_BX or own[-2].id != arm.ARM_INS_ORR:
        return False
    ops = own[-2].operands
    return len(ops) == 3 and ops[2].type == arm.ARM_OP_IMM and ops[2].imm == 1 and ops[0].reg == own[-1].operands[0].reg


def _sets_return_address(ins: cs.CsInsn) -> bool:
    """`mov lr, pc` (or `add lr, pc, #k`): the next jump is a call (ARMv4 style)."""
    ops = ins.operands
    return (
        ins.id in (arm.ARM_INS_MOV, arm.ARM_INS_ADD)
        and len(ops) >= 2
        and ops[0].type == arm.ARM_OP_REG
        and ops[0].reg == _LR
        and ops[1].type == arm.ARM_OP_REG
        and ops[1].reg == _PC
    )


def _opposite(cc: int) -> int:
    """EQ<->NE, HS<->LO, ... (capstone numbers the pairs 1-2, 3-4, ..., 13-14)."""
    return cc + 1 if cc % 2 else cc - 1


def _writes_pc(ins: cs.CsInsn) -> bool:
    ops = ins.operands
    if ins.id in _BRANCHES:
        return True
    if ins.id in (arm.ARM_INS_POP, arm.ARM_INS_LDM) or ins.mnemonic.startswith(("pop", "ldm")):
        return any(op.type == arm.ARM_OP_REG and op.reg == _PC for op in ops)
    return bool(ops) and ops[0].type == arm.ARM_OP_REG and ops[0].reg == _PC and ins.id not in _COMPARES


def _shifted(ops: list) -> tuple[int, int] | None:
    """(register, s) of `lsl rD, rS, #s` (Thumb: three operands; ARM: `rS, lsl #s` as one)."""
    if len(ops) == 3 and ops[1].type == arm.ARM_OP_REG and ops[2].type == arm.ARM_OP_IMM and not ops[1].shift.type:
        return ops[1].reg, ops[2].imm
    if len(ops) == 2 and ops[1].type == arm.ARM_OP_REG and ops[1].shift.type == arm.ARM_SFT_LSL:
        return ops[1].reg, ops[1].shift.value
    return None


def _stores(ins: cs.CsInsn) -> bool:
    return ins.mnemonic.startswith(("st", "push", "vst", "vpush"))


def _sets_flags(ins: cs.CsInsn) -> bool:
    return ins.id in _COMPARES or ins.id in _CALLS or bool(ins.update_flags) or ins.id in (arm.ARM_INS_MSR,)


def _known_false(insns: list[cs.CsInsn]) -> list[frozenset[int]]:
    """Per instruction, the conditions known to be false when it executes on this path.

    Walking back from the jump: the jump's own condition holds; a conditional branch or exit
    before it went the way the path goes on; everything learnt ends at the instruction that set
    the flags (a compare, a flag-setting instruction, a call)."""
    out: list[frozenset[int]] = [frozenset()] * len(insns)
    false: set[int] = set()
    last = len(insns) - 1
    for k in range(last, -1, -1):
        ins = insns[k]
        cc = ins.cc
        if _sets_flags(ins):
            false = set()
        elif cc not in _AL and ins.id != arm.ARM_INS_IT:
            if k == last:
                false.add(_opposite(cc))  # the jump is taken: its condition holds
            elif _writes_pc(ins):
                nxt = insns[k + 1].address
                ops = ins.operands
                if ins.id == arm.ARM_INS_B and ops and ops[0].type == arm.ARM_OP_IMM and nxt == ops[0].imm:
                    false.add(_opposite(cc))  # the path took the branch
                elif nxt == ins.address + ins.size:
                    false.add(cc)  # the path went past a conditional branch or exit
        out[k] = frozenset(false)
    return out


class _State:
    """Registers, stack slots and the bounds learnt along one path."""

    def __init__(self, image: Image, thumb: bool, known_false: list[frozenset[int]]) -> None:
        self.image = image
        self.thumb = thumb
        self.known_false = known_false
        self.regs: dict[int, Value] = {}
        self.slots: dict[tuple[int, int, int], Value] = {}
        self.bounds: dict[Value, int] = {}
        self.masked: set[Value] = set()  # the indices bounded by an `and` with 2^k - 1
        self._next = 0
        self._at = 0  # address of the instruction being evaluated (reads of pc)

    # ------------------------------------------------------------------ values
    def fresh(self) -> Value:
        self._next += 1
        return ("v", self._next)

    def read(self, reg: int) -> Value:
        if reg == _PC:
            return ("c", self._at + (4 if self.thumb else 8))
        v = self.regs.get(reg)
        if v is None:
            v = self.regs[reg] = self.fresh()  # an unknown input keeps one identity along the path
        return v

    def write(self, reg: int, value: Value | None = None) -> None:
        if reg == _PC:
            return
        self.regs[reg] = value if value is not None else self.fresh()
        if reg in _FRAMES:
            self.slots = {s: v for s, v in self.slots.items() if s[0] != reg}

    def clobber(self, ins: cs.CsInsn) -> None:
        """Every register `ins` writes becomes unknown."""
        for r in ins.regs_access()[1]:
            self.write(r)

    # ------------------------------------------------------------------ one instruction
    def step(self, k: int, ins: cs.CsInsn) -> None:
        """Evaluate the `k`-th instruction of the path (not the jump)."""
        self._at = ins.address
        i = ins.id
        if i in _NO_EFFECT or i in _BRANCHES:
            return
        if i in _COMPARES:
            self._compare(k, ins)
            return
        if i in _CALLS:
            for r in _CLOBBERED_BY_CALL:
                self.write(r)
            return
        cc = ins.cc
        if cc not in _AL:
            known = self.known_false[k]
            if cc in known:
                return  # not executed on this path
            if _opposite(cc) not in known:
                self.clobber(ins)  # may or may not execute: what it writes is unknown
                if _stores(ins):
                    self.slots = {}
                return
        if i == arm.ARM_INS_SUB and ins.update_flags:
            self._compare(k, ins)
        elif i in _LOADS:
            self._load(ins)
        elif i in _STORES:
            self._store(ins)
        elif not self._arith(ins):
            self.clobber(ins)
            if _stores(ins) and not ins.mnemonic.startswith(("push", "vpush")):
                self.slots = {}  # stm, strd, vstr ...: may overwrite any slot (push only moves sp)

    def _compare(self, k: int, ins: cs.CsInsn) -> None:
        """`cmp rI, #N` (or `subs rD, rI, #N`): learn rI's bound from the conditions known after it."""
        ops = ins.operands
        if ins.id == arm.ARM_INS_SUB:
            if len(ops) not in (2, 3) or ops[-1].type != arm.ARM_OP_IMM:
                self.clobber(ins)
                return
            value, n = self.read(ops[-2].reg), ops[-1].imm
            self.write(ops[0].reg)
        elif ins.id == arm.ARM_INS_CMP and len(ops) == 2 and ins.cc in _AL and ops[0].type == arm.ARM_OP_REG:
            value, n = self.read(ops[0].reg), self._constant(ops[1])
            if n is None:
                return
        else:
            return
        after = self.known_false[k + 1] if k + 1 < len(self.known_false) else frozenset()
        if _HI in after:
            count = n + 1  # not higher: index <= N
        elif _HS in after:
            count = n  # lower: index < N
        else:
            return
        self.bounds[value] = min(count, self.bounds.get(value, count))

    def _constant(self, op: ArmOp) -> int | None:
        """The value of an immediate or of a register holding a constant (unshifted)."""
        if op.type == arm.ARM_OP_IMM:
            return op.imm & _MASK
        if op.type == arm.ARM_OP_REG and op.shift.type == 0:
            v = self.read(op.reg)
            return v[1] if v[0] == "c" else None
        return None

    def _arith(self, ins: cs.CsInsn) -> bool:
        """adr/mov/movw/movt/add/sub whose result can be followed; False when not modelled."""
        ops = ins.operands
        i = ins.id
        if len(ops) < 2 or ops[0].type != arm.ARM_OP_REG:
            return False  # (flags a `movs`/`adds`/`lsls` sets are followed by _known_false)
        dst = ops[0].reg
        if i == arm.ARM_INS_ADR and ops[1].type == arm.ARM_OP_IMM:
            self.write(dst, ("c", (self._aligned_pc() + ops[1].imm) & _MASK))
            return True
        if i == arm.ARM_INS_MOVW and ops[1].type == arm.ARM_OP_IMM:
            self.write(dst, ("c", ops[1].imm & 0xFFFF))
            return True
        if i == arm.ARM_INS_MOVT and ops[1].type == arm.ARM_OP_IMM:
            v = self.read(dst)
            self.write(dst, ("c", (v[1] & 0xFFFF) | ((ops[1].imm & 0xFFFF) << 16)) if v[0] == "c" else None)
            return True
        shifted = _shifted(ops)
        if i in (arm.ARM_INS_LSL, arm.ARM_INS_MOV) and shifted is not None:
            v, s = self.read(shifted[0]), shifted[1]  # `lsl rD, rI, #s`: a scaled index (`ldr rE, [rD, rT]`)
            self.write(dst, ("c", (v[1] << s) & _MASK) if v[0] == "c" else ("x", v, s) if v[0] == "v" else None)
            return True
        if i == arm.ARM_INS_MOV and len(ops) == 2:
            if ops[1].type == arm.ARM_OP_IMM:
                self.write(dst, ("c", ops[1].imm & _MASK))
            elif ops[1].type == arm.ARM_OP_REG and ops[1].shift.type == 0:
                self.write(dst, self.read(ops[1].reg))
            else:
                return False
            return True
        if i == arm.ARM_INS_AND and len(ops) == 3 and ops[2].type == arm.ARM_OP_IMM and ins.cc in _AL:
            mask = ops[2].imm & _MASK
            if mask & (mask + 1) or not 0 < mask < _MAX_MASK:
                return False
            v = self.fresh()  # `and rI, rX, #2^k - 1` (`switch (x & 7)`, gcc's `goto *tbl[op & 15]`)
            self.write(dst, v)
            self.bounds[v] = mask + 1
            self.masked.add(v)
            return True
        if i == arm.ARM_INS_ORR and len(ops) == 3 and ops[2].type == arm.ARM_OP_IMM and ops[2].imm == 1:
            a = self.read(ops[1].reg)
            if a[0] != "e":
                return False
            self.write(dst, ("t", 1, a, 0))  # a label without bit 0, made a Thumb address (it is even)
            return True
        if i in (arm.ARM_INS_ADD, arm.ARM_INS_SUB) and len(ops) in (2, 3):
            if len(ops) == 2:
                a = self.read(dst)
            elif ops[1].type != arm.ARM_OP_REG:
                return False
            elif ops[1].reg == _PC and self.thumb and ops[2].type == arm.ARM_OP_IMM:
                a = ("c", self._aligned_pc())  # Thumb `add rD, pc, #imm` is `adr`: from Align(pc, 4)
            else:
                a = self.read(ops[1].reg)
            self.write(dst, self._sum(i == arm.ARM_INS_ADD, a, ops[-1]))
            return True
        return False

    def _aligned_pc(self) -> int:
        """The base of `adr` and literal loads: Align(pc, 4)."""
        return (self._at + (4 if self.thumb else 8)) & ~3

    def _sum(self, add: bool, a: Value, op: ArmOp) -> Value:
        if op.type == arm.ARM_OP_IMM:
            if a[0] != "c":
                return self.fresh()
            imm = op.imm
            return ("c", (a[1] + imm if add else a[1] - imm) & _MASK)
        if op.type != arm.ARM_OP_REG or not add:
            return self.fresh()
        b = self.read(op.reg)
        shift = op.shift.value if op.shift.type == arm.ARM_SFT_LSL else 0
        if op.shift.type not in (0, arm.ARM_SFT_LSL) or shift > 4:
            return self.fresh()
        if a[0] == "c" and b[0] == "c":
            return ("c", (a[1] + (b[1] << shift)) & _MASK)
        if shift == 0 and {a[0], b[0]} == {"c", "x"}:
            c, x = (a, b) if a[0] == "c" else (b, a)
            return ("t", c[1], x[1], x[2])  # table + (index << s)
        if a[0] == "c" and (b[0] == "e" or (b[0] == "v" and shift)):
            return ("t", a[1], b, shift)
        if b[0] == "c" and a[0] == "e" and shift == 0:
            return ("t", b[1], a, 0)
        return self.fresh()

    # ------------------------------------------------------------------ memory
    def _load(self, ins: cs.CsInsn) -> None:
        ops = ins.operands
        if len(ops) != 2 or ops[1].type != arm.ARM_OP_MEM or ins.writeback or ops[0].type != arm.ARM_OP_REG:
            self.clobber(ins)
            return
        dst, mem = ops[0].reg, ops[1].mem
        size, signed = _LOADS[ins.id]
        self.write(dst, self._loaded(ops[1], mem, size, signed))

    def _loaded(self, op: ArmOp, mem: ArmOpMem, size: int, signed: bool) -> Value | None:
        """The value a load from `mem` gives (None: unknown)."""
        log2 = {1: 0, 2: 1, 4: 2}[size]
        if mem.index:
            table, index = self.read(mem.base), self.read(mem.index)
            scale = op.shift.value if op.shift.type == arm.ARM_SFT_LSL else 0
            if mem.disp or op.subtracted or op.shift.type not in (0, arm.ARM_SFT_LSL):
                return None
            if scale == 0 and index[0] == "c" and table[0] == "x":
                table, index = index, table  # `ldr rE, [rI << s, rT]`
            if scale == 0 and index[0] == "x":
                index, scale = index[1], index[2]
            return ("e", table[1], size, signed, index) if table[0] == "c" and scale == log2 else None
        base = self.read(mem.base)
        if base[0] == "t" and base[2][0] == "v" and base[3] == log2 and not mem.disp:
            return ("e", base[1], size, signed, base[2])  # `add rA, rT, rI, lsl #s; ldr rE, [rA]`
        if mem.base == _PC and size == 4:
            va = self._aligned_pc() + mem.disp
            raw = self.image.read(va, 4)
            if raw is None or len(raw) < 4 or writable(self.image, va):
                return None
            order: Literal["little", "big"] = "big" if self.image.identity.endian == "big" else "little"
            return ("c", int.from_bytes(raw, order))
        if mem.base in _FRAMES and size == 4:
            key = (mem.base, mem.disp, 4)
            value = self.slots.get(key)
            if value is None:
                value = self.slots[key] = self.fresh()
            return value
        return None

    def _store(self, ins: cs.CsInsn) -> None:
        ops = ins.operands
        mem = ops[-1].mem if ops and ops[-1].type == arm.ARM_OP_MEM else None
        size = _STORES[ins.id]
        if mem is None or mem.base not in _FRAMES or mem.index:
            self.slots = {}  # a store through a pointer may alias any slot
        else:
            lo, hi = mem.disp, mem.disp + size
            self.slots = {s: v for s, v in self.slots.items() if s[0] != mem.base or not (s[1] < hi and lo < s[1] + 4)}
            if size == 4 and not ins.writeback and len(ops) == 2 and ops[0].type == arm.ARM_OP_REG:
                self.slots[(mem.base, mem.disp, 4)] = self.read(ops[0].reg)
        if ins.writeback:
            self.clobber(ins)

    # ------------------------------------------------------------------ the jump
    def jump_target(self, jump: cs.CsInsn) -> tuple[Value, bool]:
        """The symbolic address the jump goes to, and whether bit 0 of it selects Thumb."""
        self._at = jump.address
        ops = jump.operands
        size = _TABLE_BRANCHES.get(jump.id)
        if size is not None:  # tbb/tbh [pc, rI{, lsl #1}]: entries are halfword offsets from jump+4
            mem = ops[0].mem
            scale = ops[0].shift.value if ops[0].shift.type == arm.ARM_SFT_LSL else 0
            if mem.base != _PC or not mem.index or scale != size - 1:
                return ("v", 0), False
            table = jump.address + 4
            return ("t", table, ("e", table, size, False, self.read(mem.index)), 1), False
        if jump.id in (arm.ARM_INS_BX,) and ops:
            return self.read(ops[0].reg), True
        if jump.id == arm.ARM_INS_LDR and len(ops) == 2 and ops[1].type == arm.ARM_OP_MEM:
            value = self._loaded(ops[1], ops[1].mem, 4, False)
            return (value or ("v", 0)), True
        if jump.id == arm.ARM_INS_MOV and len(ops) == 2 and ops[1].type == arm.ARM_OP_REG and ops[1].shift.type == 0:
            return self.read(ops[1].reg), not self.thumb
        if jump.id == arm.ARM_INS_ADD and len(ops) in (2, 3):
            a = self.read(ops[0].reg if len(ops) == 2 else ops[1].reg)
            return self._sum(True, a, ops[-1]), not self.thumb  # ARMv7: an ARM-state `add pc` interworks
        return ("v", 0), False
