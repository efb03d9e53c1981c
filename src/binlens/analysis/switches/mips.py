"""Jump tables behind MIPS `jr $r` (the switch dispatches gcc and clang emit).

The shapes handled (any register allocation, any order of the independent steps, delay slots
included):

    sltiu $c, $i, N            ; or `sltu $c, $i, $k` with $k a constant
    beqz  $c, default          ; (or `bnez $c, dispatch`: the taken side)
    sll   $s, $i, 2            ; (dsll ..., 3 for 8-byte entries)
    lui   $t, %hi(tbl)         ; non-PIC: absolute entries
    addiu $t, $t, %lo(tbl)     ;   (or `%lo(tbl)` folded into the load's offset)
      -- or, PIC (abicalls) --
    lw    $t, %got(tbl)($gp)   ; the table's page from the GOT ($gp = _gp)
    addiu $t, $t, %lo(tbl)     ;   (or folded into the load)
    addu  $t, $t, $s
    lw    $e, 0($t)            ; (ld for 8-byte entries)
    addu  $e, $e, $gp          ; PIC only: `.gpword` (n64: `.gpdword`) entries are offsets from _gp
    jr    $e

They are recognised by a small forward evaluation over the recorded path to the jump (the jump's
chunk, the chunk before it and up to `_MAX_CHUNKS` earlier ones), as in `jumptable_a64.py`:
registers and stack slots hold symbolic values, so an index spilled to the stack and reloaded at
`-O0` keeps its identity. `$gp` is `_gp` (from `PT_MIPS_REGINFO`, the `_gp` symbol or `.got` +
0x7ff0) unless the path computes it: the `lui`/`addiu` of `_gp_disp` plus `$t9` (n64: `lui`, plus
`$t9`, `daddiu`), where `$t9` is the address of that `lui` (the function's entry, where `.cpload`
and clang put it). A table is resolved only when everything is known: the jump register is an
entry loaded from a constant read-only table at the index (or such an entry plus a constant), and a
compare-and-branch (or a mask: `andi $i, $x, 2^k - 1`) on that same index on the path bounds it.
Anything else leaves the jump unresolved.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import capstone as cs
from capstone import mips as mp

from binlens.analysis.codemap import CodeMap
from binlens.analysis.switches import common as jt
from binlens.analysis.switches.tables import writable

if TYPE_CHECKING:
    from binlens.analysis.decode.capstone_backend import CapstoneBackend
    from binlens.loader.image import Image

_MAX_CHUNKS = 8  # earlier chunks evaluated before the jump's own slice
_GP_BIAS = 0x7FF0  # _gp lies this far past the start of the GOT
_PT_MIPS_REGINFO = 0x70000000
_STACK = ("sp", "fp", "s8")
# registers a call may change (o32 and n32/n64 names as capstone prints them)
_CLOBBERED_BY_CALL = (
    *("at", "v0", "v1", "a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7"),
    *(f"t{k}" for k in range(10)),
    *("ra", "hi", "lo", "ac0"),
)
LOADS = {"lb": (1, True), "lbu": (1, False), "lh": (2, True), "lhu": (2, False), "lw": (4, True)}
LOADS_64 = {"lwu": (4, False), "ld": (8, True)}
STORES = {"sb": 1, "sh": 2, "sw": 4, "sd": 8}
# instructions whose first register operand is read, not written
_NO_DEST = frozenset(
    {
        *("mult", "multu", "div", "divu", "dmult", "dmultu", "ddiv", "ddivu", "madd", "maddu", "msub", "msubu"),
        *("mthi", "mtlo", "mtc0", "mtc1", "mtc2", "mthc1", "dmtc0", "dmtc1", "dmtc2", "ctc0", "ctc1", "ctc2"),
        *("teq", "tne", "tge", "tgeu", "tlt", "tltu", "teqi", "tnei", "tgei", "tgeiu", "tlti", "tltiu"),
        *("sync", "cache", "pref", "nop", "ssnop", "ehb", "break", "syscall", "wait", "sdbbp", "jr", "jr.hb"),
    }
)

# Symbolic values (tuples, hashable): ("c", k) a constant; ("v", n) an unknown value with an
# identity; ("s", v, s) the value v shifted left by s; ("x", k, v, s) the constant k plus (v << s);
# ("e", table, size, v) an entry loaded from table[v]; ("t", k, entry) the constant k plus an
# entry; ("lt", v, n) the truth of v < n (unsigned); ("g", k) `%hi` of _gp plus $t9 (n64), _gp
# once its `%lo` is added.
Value = tuple


def mips_jump_table_targets(
    backend: CapstoneBackend, codemap: CodeMap, slice_start: int, jump_va: int, earlier: jt.Chunks = ()
) -> jt.Resolution:
    """Case targets of the MIPS `jr` at `jump_va`, the table address (0 when none), and whether a
    bound check guards it. Only complete, bounded dispatches resolve; otherwise `([], 0, True)`."""
    image, md, own = jt.jump_slice(backend, slice_start, jump_va)
    if not own or own[-1].address != jump_va or own[-1].mnemonic not in ("jr", "jr.hb"):
        return jt.NONE
    if not own[-1].operands or md.reg_name(own[-1].operands[0].reg) == "ra":
        return jt.NONE
    if not any(ins.mnemonic in ("lw", "ld") for ins in own):
        return jt.NONE  # no table load next to the jump: a tail call through $t9 or a pointer
    bits = image.identity.bits
    insns = jt.path_to_jump(md, image, earlier, _MAX_CHUNKS, own)
    state = MipsState(md, image, gp_value(backend, image), bits)
    jt.walk(state, insns)
    target = state.read(insns[-1].operands[0].reg)
    if target[0] == "e":
        base, entry = 0, target
    elif target[0] == "t":
        _t, base, entry = target
    else:
        return jt.NONE
    _e, table, size, index = entry
    count = jt.entry_count(state.bounds, index)
    if count is None or size * 8 != bits and base == 0:
        return jt.NONE  # absolute entries are pointer-sized
    values = jt.read_entries(image, table, size, count, True)
    if values is None:
        return jt.NONE
    mask = (1 << bits) - 1
    targets = []
    for v in values:
        t = (base + v) & mask
        if jt.near_code(codemap, t, jump_va, 4):  # only targets in code next to the jump
            targets.append(t)
        elif base == 0:
            break  # absolute entries: a mask bounds the index, not the table; the words after it are other data
    return targets, table, True


def gp_value(backend: CapstoneBackend, image: Image) -> int | None:
    """The `_gp` of `image` (the backend's; worked out once per backend): `PT_MIPS_REGINFO`'s
    ri_gp_value, else the `_gp` symbol, else the `.got` section's address + 0x7ff0; None when none
    is known."""
    return _GP.get(backend)


def _image_gp(image: Image) -> int | None:
    """`gp_value` of `image`."""
    gp = _reginfo_gp(image)
    if gp is None:
        gp = next((s.address for s in image.symbols if s.name == "_gp"), None)
    if gp is None:
        got = next((s for s in image.sections if s.name == ".got"), None)
        gp = got.va + _GP_BIAS if got is not None else None
    return gp


def _backend_gp(backend: CapstoneBackend) -> int | None:
    return _image_gp(backend.image)


_GP = jt.PerBackend(_backend_gp)


def _reginfo_gp(image: Image) -> int | None:
    """ri_gp_value of the ELF's `PT_MIPS_REGINFO` segment (o32/n32 objects carry one)."""
    data = image.data
    if image.identity.format != "ELF" or len(data) < 52 or data[:4] != b"\x7fELF":
        return None
    e = "<" if data[5] == 1 else ">"
    if data[4] == 1:
        phoff, phentsize, phnum = struct.unpack_from(e + "I", data, 28)[0], *struct.unpack_from(e + "HH", data, 42)
        fields = e + "IIIIIIII"
    else:
        if len(data) < 64:
            return None
        phoff, phentsize, phnum = struct.unpack_from(e + "Q", data, 32)[0], *struct.unpack_from(e + "HH", data, 54)
        fields = e + "IIQQQQQQ"
    for k in range(min(phnum, 256)):
        at = phoff + k * phentsize
        if at + struct.calcsize(fields) > len(data):
            return None
        ph = struct.unpack_from(fields, data, at)
        ptype, offset = ph[0], (ph[1] if data[4] == 1 else ph[2])
        filesz = ph[4] if data[4] == 1 else ph[5]
        if ptype == _PT_MIPS_REGINFO and filesz >= 24 and offset + 24 <= len(data):
            gp = struct.unpack_from(e + "I", data, offset + 20)[0]
            return gp or None
    return None


_REG_NAMES: dict[int, str] = {}  # capstone MIPS register id -> name (the same in every MIPS mode)


def reg_name(md: cs.Cs, reg: int) -> str:
    """The name of MIPS register `reg` (capstone's id) as `md` prints it."""
    k = _REG_NAMES.get(reg)
    if k is None:  # (a ctypes call each time otherwise: 400k of them on sqlite3 -O0's address pairs)
        k = _REG_NAMES[reg] = md.reg_name(reg) or str(reg)
    return k


def word(v: int, wide: bool, bits: int) -> int:
    """`v` as a register of `bits` holds the result of an operation: 32-bit operations (not `wide`)
    sign-extend on MIPS64."""
    mask = (1 << bits) - 1
    if wide or bits == 32:
        return v & mask
    v &= 0xFFFFFFFF
    return (v - (1 << 32) if v >> 31 else v) & mask


class MipsState:
    """Registers, stack slots, the pending branch and the bounds learnt along one path."""

    def __init__(self, md: cs.Cs, image: Image, gp: int | None, bits: int) -> None:
        self.md = md
        self.image = image
        self.gp = gp
        self.bits = bits
        self.mask = (1 << bits) - 1
        self.regs: dict[str, Value] = {}
        self.lui_at: dict[str, int] = {}  # register -> address of the `lui` its constant began with
        self.slots: dict[tuple[str, int, int], Value] = {}
        # loads through other pointers: (root value, offset, mnemonic) -> the value read, forgotten at
        # any store or call; `offsets` knows unknown values that are another one plus a constant
        self.memory: dict[tuple[Value, int, str], Value] = {}
        self.offsets: dict[Value, tuple[Value, int]] = {}
        self.bounds: dict[Value, int] = {}
        self.pending: tuple[cs.CsInsn, Value | None] | None = None  # a branch whose delay slot is next
        self._next = 0
        if gp is not None:
            self.regs["gp"] = ("c", gp)

    # ------------------------------------------------------------------ values
    def fresh(self) -> Value:
        self._next += 1
        return ("v", self._next)

    def name(self, reg: int) -> str:
        """The name of register `reg` (capstone's id)."""
        k = _REG_NAMES.get(reg)  # (`reg_name`'s cache, read here first: this runs for every operand)
        return k if k is not None else reg_name(self.md, reg)

    def read(self, reg: int) -> Value:
        k = self.name(reg)
        if k == "zero":
            return ("c", 0)
        v = self.regs.get(k)
        if v is None:
            v = self.regs[k] = self.fresh()  # an unknown input keeps one identity along the path
        return v

    def write(self, reg: int | str, value: Value | None = None, lui_at: int | None = None) -> None:
        k = reg if isinstance(reg, str) else self.name(reg)
        if k == "zero":
            return
        if k == "gp" and (value is None or value[0] != "c") and self.gp is not None:
            value = ("c", self.gp)  # $gp is _gp throughout a function (reloaded after calls)
        self.regs[k] = value if value is not None else self.fresh()
        if lui_at is None:
            self.lui_at.pop(k, None)
        else:
            self.lui_at[k] = lui_at
        if k in _STACK:
            self.slots = {s: v for s, v in self.slots.items() if s[0] != k}

    def _word(self, v: int, wide: bool) -> int:
        """A result as the register holds it: 32-bit operations sign-extend on MIPS64 (`word`,
        written out here: it runs for most instructions evaluated)."""
        if wide or self.bits == 32:
            return v & self.mask
        v &= 0xFFFFFFFF
        return (v - (1 << 32) if v >> 31 else v) & self.mask

    # ------------------------------------------------------------------ one instruction
    def step(self, ins: cs.CsInsn, next_va: int) -> None:
        """Evaluate `ins`; `next_va` is the address executed after it on this path."""
        if self.pending is not None:
            branch, cond = self.pending
            self.pending = None
            likely = branch.mnemonic.endswith("l") and branch.mnemonic not in ("bal", "jal")
            target = _branch_target(branch)
            if not (likely and next_va != target):
                self._evaluate(ins)  # the delay slot (annulled on a branch-likely's fall-through)
            if cond is not None:
                self._learn(branch, cond, next_va)
            if branch.mnemonic in ("jal", "jalr", "bal", "jalr.hb", "bgezal", "bltzal", "jalx"):
                for r in _CLOBBERED_BY_CALL:
                    self.write(r)
                self.memory = {}
                self.write("gp")
            return
        m = ins.mnemonic
        if m.startswith(("b", "j")) and m not in ("break",):
            self.pending = (ins, self._condition(ins))
            return
        self._evaluate(ins)

    def _condition(self, ins: cs.CsInsn) -> Value | None:
        """The bound test a branch makes: ("lt", v, n) when it branches on `v < n` being 0 or not."""
        ops = ins.operands
        regs = [op.reg for op in ops if op.type == mp.MIPS_OP_REG]
        m = ins.mnemonic.removesuffix("l")
        if m in ("beqz", "bnez") and len(regs) == 1 or m in ("beq", "bne") and len(regs) == 2:
            values = [self.read(r) for r in regs]
            if len(values) == 2:
                if values[1] != ("c", 0):
                    values.reverse()
                if values[1] != ("c", 0):
                    return None
            return values[0] if values[0][0] == "lt" else None
        return None

    def _learn(self, branch: cs.CsInsn, cond: Value, next_va: int) -> None:
        """After `b{eq,ne}z (v < n)`: the side where the test held bounds v to n entries."""
        target = _branch_target(branch)
        if target == branch.address + 8:
            return
        if next_va == target:
            taken = True
        elif next_va == branch.address + 8:
            taken = False
        else:
            return
        holds = taken != branch.mnemonic.startswith("beq")  # beqz taken: the test failed
        if holds:
            _lt, value, n = cond
            self.bounds[value] = min(n, self.bounds.get(value, n))

    def _evaluate(self, ins: cs.CsInsn) -> None:
        m = ins.mnemonic
        ops = ins.operands
        if m == "syscall":
            for r in ("v0", "v1", "a3"):
                self.write(r)  # the result and the error flag
            return
        if m in _NO_DEST or not ops or ops[0].type != mp.MIPS_OP_REG:
            return
        if len(ops) == 2 and ops[1].type == mp.MIPS_OP_MEM:
            if m in STORES or m in ("sc", "scd") or m.startswith(("sw", "sd", "sb", "sh")):
                self._store(m, ops)
            else:
                self._load(m, ops)
            return
        if not self._arith(ins, m, ops):
            self.write(ops[0].reg)

    def _arith(self, ins: cs.CsInsn, m: str, ops: list) -> bool:
        """lui/li/move/addiu/ori/addu/sll/sltiu/sltu whose result can be followed; False when not modelled."""
        dst = ops[0].reg
        imm = ops[-1].imm if ops[-1].type == mp.MIPS_OP_IMM else None
        src = [op.reg for op in ops[1:] if op.type == mp.MIPS_OP_REG]
        wide = m.startswith("d")
        if m == "lui" and imm is not None:
            self.write(dst, ("c", self._word(imm << 16, False)), lui_at=ins.address)
            return True
        if m == "li" and imm is not None:
            self.write(dst, ("c", imm & self.mask))
            return True
        if m == "move" and len(src) == 1:
            self.write(dst, self.read(src[0]), self.lui_at.get(self.name(src[0])))
            return True
        if m in ("addiu", "daddiu", "addi", "daddi", "ori") and len(src) == 1 and imm is not None:
            a = self.read(src[0])
            if a[0] == "c":
                v = a[1] | imm if m == "ori" else a[1] + imm
                self.write(dst, ("c", self._word(v, wide)), self.lui_at.get(self.name(src[0])))
            elif a[0] == "x" and m != "ori":
                self.write(dst, ("x", self._word(a[1] + imm, wide), a[2], a[3]))
            elif (
                a[0] == "g" and m != "ori" and self.gp is not None and 0 <= self._word(a[1] + imm, wide) - self.gp < 256
            ):
                # n64 `%gp_rel(f)` is relative to the function's entry ($t9), which can lie a few
                # instructions before the `lui` (gcc -O0 sets up the frame first)
                self.write(dst, ("c", self.gp))
            elif a[0] == "v" and m != "ori":
                value = self.fresh()  # a pointer moved on (`addiu $p, $p, 1`): same memory, new offset
                root, k = self.offsets.get(a, (a, 0))
                self.offsets[value] = (root, k + imm)
                self.write(dst, value)
            else:
                self.write(dst)
            return True
        if m in ("addu", "daddu", "add", "dadd") and len(src) == 2:
            self.write(dst, self._sum(src, wide))
            return True
        if m in ("sll", "dsll") and len(src) == 1 and imm is not None:
            a = self.read(src[0])
            if a[0] == "c":
                self.write(dst, ("c", self._word(a[1] << imm, wide)))
            elif a[0] == "v" and 1 <= imm <= 3:
                self.write(dst, ("s", a, imm))
            else:
                self.write(dst)
            return True
        if m in ("andi", "ext", "dext") and len(src) == 1:
            # `andi $d, $s, 2^k - 1` (or `ext $d, $s, 0, k`): an index below 2^k, as `switch (x & 7)` has
            ints = [op.imm for op in ops if op.type == mp.MIPS_OP_IMM]
            a = self.read(src[0])
            if m != "andi" and len(ints) == 2 and ints[0] == 0 and ints[1] >= 32 and a[0] == "v":
                self.write(dst, a)  # `dext $d, $s, 0, 32`: the 32-bit index zero-extended keeps its bound
                return True
            count = ints[0] + 1 if m == "andi" else 1 << ints[1] if len(ints) == 2 and ints[0] == 0 else 0
            value = self.fresh()
            if 2 <= count <= jt.MAX_ENTRIES and count & (count - 1) == 0:
                self.bounds[value] = count
            self.write(dst, value)
            return True
        if m in ("sltiu", "sltu") and len(src) >= 1:
            bound = imm if m == "sltiu" else None
            if m == "sltu" and len(src) == 2:
                b = self.read(src[1])
                bound = b[1] if b[0] == "c" else None
            a = self.read(src[0])
            if bound is not None and 0 < bound <= jt.MAX_ENTRIES and a[0] == "v":
                self.write(dst, ("lt", a, bound))
            else:
                self.write(dst)
            return True
        return False

    def _sum(self, src: list[int], wide: bool) -> Value:
        a, b = self.read(src[0]), self.read(src[1])
        names = [self.name(r) for r in src]
        for x, y in ((a, b), (b, a)):
            if x[0] == "c" and y[0] == "c":
                return ("c", self._word(x[1] + y[1], wide))
            if x[0] == "c" and y[0] == "s":
                return ("x", x[1], y[1], y[2])
            if x[0] == "x" and y[0] == "c":
                return ("x", self._word(x[1] + y[1], wide), x[2], x[3])
            if x[0] == "c" and y[0] == "e":
                return ("t", x[1], y)
        # `addu $d, <_gp_disp>, $t9`: $t9 holds the function's entry, the address of the `lui`
        for k, (x, y) in enumerate(((a, b), (b, a))):
            lui = self.lui_at.get(names[k])
            if x[0] == "c" and lui is not None and names[1 - k] == "t9" and y[0] == "v":
                gp = self._word(x[1] + lui, wide)
                if self.gp is None or gp == self.gp:
                    return ("c", gp)
                return ("g", gp)  # n64: `lui; daddu $t9; daddiu %lo`: _gp once the %lo is added
        return self.fresh()

    # ------------------------------------------------------------------ memory
    def _load(self, m: str, ops: list) -> None:
        dst = ops[0].reg
        size_signed = LOADS.get(m) or (LOADS_64.get(m) if self.bits == 64 else None)
        if size_signed is None:
            self.write(dst)  # lwl/lwr, FP loads, ll ...: not an index or a table entry
            return
        size, _signed = size_signed
        base = self.name(ops[1].mem.base)
        disp = ops[1].mem.disp
        b = self.read(ops[1].mem.base)
        if b[0] == "x" and 1 << b[3] == size and size >= 4:
            self.write(dst, ("e", self._word(b[1] + disp, True), size, b[2]))
            return
        if b[0] == "c" and size * 8 == self.bits:
            addr = self._word(b[1] + disp, True)
            word = self._constant_word(addr, size)
            self.write(dst, ("c", word) if word is not None else None)
            return
        if base in _STACK:
            value = self.slots.get((base, disp, size))
            if value is None:
                value = self.slots[(base, disp, size)] = self.fresh()
            self.write(dst, value)
            return
        if b[0] == "v":  # the same bytes loaded again read the same value (gcc re-reads `*p` after `p++`)
            root, k = self.offsets.get(b, (b, 0))
            value = self.memory.get((root, k + disp, m))
            if value is None:
                value = self.memory[(root, k + disp, m)] = self.fresh()
            self.write(dst, value)
            return
        self.write(dst)

    def _constant_word(self, addr: int, size: int) -> int | None:
        """A pointer read from the GOT (around _gp) or from read-only memory; None otherwise."""
        in_got = self.gp is not None and self.gp - _GP_BIAS <= addr < self.gp + 0x8000
        if not in_got and (not self.image.is_mapped(addr) or writable(self.image, addr)):
            return None
        raw = self.image.read(addr, size)
        if raw is None or len(raw) < size:
            return None
        e = "<" if self.image.identity.endian == "little" else ">"
        return struct.unpack(e + ("I" if size == 4 else "Q"), raw)[0]

    def _store(self, m: str, ops: list) -> None:
        mem = ops[1].mem
        base = self.name(mem.base)
        self.memory = {}  # any store may change what a pointer reads (it may point into the stack)
        if base not in _STACK:
            self.slots = {}  # a store through a pointer may alias any slot
        else:
            size = STORES.get(m, 8)
            lo, hi = mem.disp, mem.disp + size
            self.slots = {s: v for s, v in self.slots.items() if s[0] != base or not (s[1] < hi and lo < s[1] + s[2])}
            if m in ("sw", "sd"):
                self.slots[(base, mem.disp, size)] = self.read(ops[0].reg)
        if m in ("sc", "scd"):
            self.write(ops[0].reg)


def _branch_target(ins: cs.CsInsn) -> int:
    for op in ins.operands:
        if op.type == mp.MIPS_OP_IMM:
            return op.imm
    return -1
