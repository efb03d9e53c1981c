"""Jump tables behind PowerPC `bctr` and RISC-V `jr` (the switch dispatches gcc and clang emit).

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

RISC-V 64:

    li     t, N                ; the bound in a register
    bltu   t, rI, default      ; or bgtu/bgeu/bleu/bltu in any operand order, either side taken
    lui    rT, %hi(tbl)        ; or `auipc rT, %pcrel_hi(tbl)` (`lla`)
    addi   rT, rT, %lo(tbl)
    slli   rI, rI, 2
    add    rA, rI, rT
    lw     rE, 0(rA)           ; (ld for 8-byte absolute entries)
    add    rE, rE, rT          ; table-relative entries (PIC); absent for absolute ones
    jr     rE

Both are recognised by a small forward evaluation over the recorded path to the jump (the same
walk as the AArch64 resolver, `jumptable_a64.py`): registers and stack slots hold symbolic values
(a constant, an unknown value with an identity, a scaled index, a table address at an index, a
table entry, a computed target), so `-O0` code that spills the index and reloads it keeps the
identity its compare bounded. A table is resolved only when the jump register is an entry of a
constant, read-only table (absolute) or a constant plus such an entry (relative), the entry is
loaded at an index scaled by the entry size, and a compare-and-branch on that same index on the
path bounds it. Anything else leaves the jump unresolved.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator

import capstone as cs

from binlens.analysis.codemap import CodeMap
from binlens.analysis.ehframe import parse_eh_frame
from binlens.analysis.jumptable import _writable

_MAX_ENTRIES = 4096
_MAX_CHUNKS = 32  # earlier chunks evaluated before the jump's own slice (the PPC GOT register is set once, at entry)
_WINDOW = 1 << 20  # case targets lie within 1 MiB of the jump
_SIZE_CODE = {1: "B", 2: "H", 4: "I", 8: "Q"}

# Symbolic values (hashable tuples): ("c", k) a constant; ("v", n) an unknown value with an
# identity; ("d", v, k) that value plus k (a rebased index); ("h", index) index << 32 (RV64's
# zero extension in two shifts); ("x", index, shift) index << shift; ("a", table, index, shift) the address of
# table[index] for entries of 1 << shift bytes; ("e", table, size, signed, index) the entry
# loaded from there; ("t", base, entry) the target base + entry.
Value = tuple

# the bound an unsigned `index <cond> N` gives: "le" index <= N, "lt" index < N
_NEGATE = {"gt": "le", "ge": "lt", "le": "gt", "lt": "ge"}
_SWAP = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge"}


# --------------------------------------------------------------------------- shared driver
def _resolve(
    backend: object,
    codemap: CodeMap,
    slice_start: int,
    jump_va: int,
    earlier: list[tuple[int, int]],
    state_cls: type[_State],
    is_jump: object,
    align: int,
) -> tuple[list[int], int, bool]:
    image = backend.image  # type: ignore[attr-defined]
    md = backend.md(False)  # type: ignore[attr-defined]
    own = []
    end = jump_va + 4 if image.is_mapped(jump_va + 3) else jump_va + 2  # (a 2-byte `c.jr` may end the code)
    for ins in _decode_path(md, image, [(slice_start, end)]):
        own.append(ins)
        if ins.address >= jump_va:
            break
    if not own or own[-1].address != jump_va or not is_jump(own[-1]) or not any(map(state_cls.indexes, own)):
        return [], 0, True  # no indexing next to the jump: a PLT stub, a tail call or a call through a pointer
    insns = [*_decode_path(md, image, list(reversed(earlier[:_MAX_CHUNKS]))), *own]
    state = state_cls(image)
    state.seed(backend, jump_va)
    for k, ins in enumerate(insns[:-1]):
        state.step(ins, insns[k + 1].address)
    target = state.jump_value(insns[-1])
    if target[0] == "t":
        base, entry = target[1], target[2]
    elif target[0] == "e" and target[2] in (4, state.ptr_size):
        base, entry = 0, target  # absolute entries (32-bit ones on RV64 medlow: `.word .L5`, loaded by `lw`)
    else:
        return [], 0, True
    _e, table, size, signed, index = entry
    count = state.bounds.get(index)
    if count is None or count <= 0 or count > _MAX_ENTRIES:
        return [], 0, True
    if not image.is_mapped(table) or _writable(image, table):
        return [], 0, True
    raw = image.read(table, size * count)
    if raw is None or len(raw) < size * count:
        return [], 0, True
    endian = "<" if image.identity.endian == "little" else ">"
    mask = state.mask
    targets = []
    for (v,) in struct.iter_unpack(endian + _SIZE_CODE[size], raw):
        if signed and v >> (size * 8 - 1):
            v -= 1 << (size * 8)
        t = (base + v) & mask
        if t % align or abs(t - jump_va) > _WINDOW or not codemap.contains(t):
            continue  # only targets in code next to the jump
        targets.append(t)
    return targets, table, True


def _decode_path(md: cs.Cs, image: object, segments: list[tuple[int, int]]) -> Iterator[cs.CsInsn]:
    for start, end in segments:
        data = image.read(start, end - start) if end > start else None  # type: ignore[attr-defined]
        if data is None:
            continue
        yield from md.disasm(data, start)


class _State:
    """Registers, stack slots, the pending compares and the bounds learnt along one path."""

    FRAME: tuple[str, ...] = ()  # registers whose [reg + disp] words are tracked as stack slots

    def __init__(self, image: object) -> None:
        self.image = image
        bits = image.identity.bits  # type: ignore[attr-defined]
        self.ptr_size = 8 if bits == 64 else 4
        self.mask = (1 << bits) - 1
        self.regs: dict[str, Value] = {}
        self.slots: dict[tuple[str, int, int], Value] = {}
        self.bounds: dict[Value, int] = {}
        self.fixed: set[str] = set()  # registers holding one value throughout the function (PPC64 TOC)
        self.memo: dict[tuple, Value] = {}  # (address, size, signed) -> value loaded, until a store or call
        self._next = 0
        self._relocs: dict[int, int | None] | None = None

    @staticmethod
    def is_load(ins: cs.CsInsn) -> bool:  # pragma: no cover - overridden
        """Does `ins` load from memory?"""
        raise NotImplementedError

    @staticmethod
    def indexes(ins: cs.CsInsn) -> bool:  # pragma: no cover - overridden
        """Can `ins` index a table (an indexed load, an add)? A dispatch has one in the jump's slice."""
        raise NotImplementedError

    def step(self, ins: cs.CsInsn, next_va: int) -> None:  # pragma: no cover - overridden
        """Evaluate `ins`; `next_va` is the address executed after it on this path."""
        raise NotImplementedError

    def jump_value(self, ins: cs.CsInsn) -> Value:  # pragma: no cover - overridden
        """The value the indirect jump `ins` goes to."""
        raise NotImplementedError

    def seed(self, backend: object, jump_va: int) -> None:
        """Set what holds throughout the function of `jump_va` before the path is walked (nothing here)."""

    # ------------------------------------------------------------------ values
    def fresh(self) -> Value:
        """A new unknown value."""
        self._next += 1
        return ("v", self._next)

    def read(self, reg: str) -> Value:
        """The register's value; an unread input gets one identity for the whole path."""
        v = self.regs.get(reg)
        if v is None:
            v = self.regs[reg] = self.fresh()  # an unknown input keeps one identity along the path
        return v

    def write(self, reg: str, value: Value | None = None) -> None:
        """Set a register (a new unknown when `value` is None); frame slots based on it are forgotten."""
        if reg in self.fixed:
            return
        self.regs[reg] = value if value is not None else self.fresh()
        if reg in self.FRAME:
            self.slots = {s: v for s, v in self.slots.items() if s[0] != reg}

    def const(self, k: int) -> Value:
        """A constant, wrapped to the register width."""
        return ("c", k & self.mask)

    def add(self, a: Value, b: Value) -> Value:
        """a + b, keeping the shapes a table dispatch builds."""
        if a[0] == "c" and b[0] == "c":
            return self.const(a[1] + b[1])
        if b[0] == "c":
            a, b = b, a
        if a[0] == "c":
            if b[0] == "x":
                return ("a", a[1], b[1], b[2])
            if b[0] == "v":
                return ("d", b, a[1])  # a rebased index (x - 100) or an address: kept apart from both
            if b[0] == "d":
                return ("d", b[1], (b[2] + a[1]) & self.mask)
            if b[0] == "e":
                return ("t", a[1], b)
            if b[0] == "a":
                return ("a", (a[1] + b[1]) & self.mask, b[2], b[3]) if a[1] == 0 else self.fresh()
        return self.fresh()

    def shift_left(self, a: Value, s: int) -> Value:
        """a << s, keeping a scaled index (s <= 3) and the first half of a zero extension."""
        if a[0] == "c":
            return self.const(a[1] << s)
        if a[0] in ("v", "d") and s == 32 and self.mask != 0xFFFFFFFF:
            return ("h", a)  # the first half of a zero extension: `slli rd, rs, 32; srli rd, rd, 32 - s`
        if a[0] in ("v", "d") and s <= 3:
            return ("x", a, s)
        if a[0] == "x" and a[2] + s <= 3:
            return ("x", a[1], a[2] + s)
        return self.fresh()

    def load(self, addr: Value, size: int, signed: bool) -> Value:
        """The value loaded from `addr` (already including the displacement)."""
        if addr[0] == "a" and 1 << addr[3] == size:
            return ("e", addr[1], size, signed, addr[2])
        if addr[0] == "c":
            return self._constant_word(addr[1], size, signed)
        return self.fresh()

    def pointer_load(self, addr: Value, size: int, signed: bool) -> Value:
        """A load through a pointer: a table entry or constant word when the address is known, else
        the value an earlier load from the same address gave (gcc reloads `*p` after comparing it)."""
        if addr[0] in ("c", "a"):
            return self.load(addr, size, signed)
        key = (addr, size, signed)
        value = self.memo.get(key)
        if value is None:
            value = self.memo[key] = self.fresh()
        return value

    def _constant_word(self, va: int, size: int, signed: bool) -> Value:
        """A word at a constant address: a PIC base's offset word in code, a GOT/TOC slot holding
        a table address (its relocation's addend when a relative relocation fills it)."""
        if size != self.ptr_size and size != 4:
            return self.fresh()
        image = self.image
        if self._relocs is None:
            self._relocs = {}
            for r in image.relocations:  # type: ignore[attr-defined]
                self._relocs[r.address] = r.addend if r.symbol is None and "RELATIVE" in r.type.upper() else None
        if va in self._relocs:
            addend = self._relocs[va]
            return self.const(addend) if addend is not None and size == self.ptr_size else self.fresh()
        raw = image.read(va, size) if image.is_mapped(va) else None  # type: ignore[attr-defined]
        if raw is None or len(raw) < size:
            return self.fresh()
        endian = "little" if image.identity.endian == "little" else "big"  # type: ignore[attr-defined]
        return self.const(int.from_bytes(raw, endian, signed=signed))

    def bound(self, value: Value, cond: str, n: int, reversed_: bool) -> None:
        """Learn `value <cond> n` (or `n <cond> value` when `reversed_`) as a bound on value."""
        if reversed_:
            cond = _SWAP[cond]
        if cond == "le":
            count = n + 1
        elif cond == "lt":
            count = n
        else:
            return
        if value[0] in ("v", "d"):
            self.bounds[value] = min(count, self.bounds.get(value, count))

    # ------------------------------------------------------------------ memory
    def slot_load(self, base: str, disp: int, size: int) -> Value:
        """The value last stored to the frame slot [base + disp] of `size` bytes (a new unknown once)."""
        value = self.slots.get((base, disp, size))
        if value is None:
            value = self.slots[(base, disp, size)] = self.fresh()
        return value

    def slot_store(self, base: str, disp: int, size: int, value: Value | None) -> None:
        """A store to [base + disp]: forget the slots it overlaps (all of them through a non-frame
        pointer) and remember a stored register of 4 or 8 bytes."""
        if base not in self.FRAME:
            self.slots = {}  # a store through a pointer may alias any slot
            return
        if not size:  # unknown width (store multiple): forget the frame
            self.slots = {s: v for s, v in self.slots.items() if s[0] != base}
            return
        lo, hi = disp, disp + size
        self.slots = {s: v for s, v in self.slots.items() if s[0] != base or not (s[1] < hi and lo < s[1] + s[2])}
        if value is not None and size in (4, 8):
            self.slots[(base, disp, size)] = value


# --------------------------------------------------------------------------- PowerPC
_PROLOGUE = 128  # bytes of a function's start searched for the PIC register's setup


_GEP_SCAN = 1 << 16  # bytes before a PPC64 jump searched for its function's global entry


def _toc_before(image: object, va: int, lowest: int) -> int | None:
    """The PPC64 ELFv2 TOC pointer set by the nearest global entry point before `va`:
    `addis r2, r12, hi` (0x3c4c....) or, in executables, `lis r2, hi` (0x3c40....), followed by
    `addi r2, r2, lo` (0x3842....). Searched back to `lowest` (the code region's start)."""
    start = max(va - _GEP_SCAN, lowest)
    start += (va - start) & 3
    data = image.read(start, va - start)  # type: ignore[attr-defined]
    if not data:
        return None
    endian = "<" if image.identity.endian == "little" else ">"  # type: ignore[attr-defined]
    words = struct.unpack(f"{endian}{len(data) // 4}I", data[: len(data) // 4 * 4])
    for k in range(len(words) - 2, -1, -1):
        if words[k] >> 16 in (0x3C4C, 0x3C40) and words[k + 1] >> 16 == 0x3842:
            hi, lo = words[k] & 0xFFFF, words[k + 1] & 0xFFFF
            hi -= (hi & 0x8000) << 1
            lo -= (lo & 0x8000) << 1
            base = start + 4 * k if words[k] >> 16 == 0x3C4C else 0  # `lis r2, hi`: ld's absolute form
            return (base + (hi << 16) + lo) & ((1 << 64) - 1)
    return None


def _function_start(backend: object, va: int) -> int | None:
    """Start of the innermost FDE or FUNC symbol extent holding `va` (computed once per backend)."""
    extents = getattr(backend, "_jt_extents", None)
    if extents is None:
        image = backend.image  # type: ignore[attr-defined]
        spans = {(f.start, f.start + f.size) for f in parse_eh_frame(image) if f.entry and f.size}
        spans |= {(s.address, s.address + s.size) for s in image.symbols if s.kind == "function" and s.size}
        extents = sorted(spans)
        backend._jt_extents = extents  # type: ignore[attr-defined]
    k = bisect.bisect_right(extents, (va, 1 << 64))
    best = None
    for lo, hi in reversed(extents[max(0, k - 8) : k]):
        if lo <= va < hi and (best is None or lo > best):
            best = lo
    return best


_PPC_LOADS = {
    "lbz": (1, False),
    "lhz": (2, False),
    "lha": (2, True),
    "lwz": (4, False),
    "lwa": (4, True),
    "ld": (8, False),
}
_PPC_STORES = {"stb": 1, "sth": 2, "stw": 4, "std": 8, "stfs": 4, "stfd": 8}
_PPC_CALL_CLOBBERS = ("r0", *(f"r{k}" for k in range(3, 13)), "ctr")
_PPC_BRANCH = {"bgt": "gt", "bge": "ge", "bnl": "ge", "blt": "lt", "ble": "le", "bng": "le"}


def _ppc_base(m: str) -> tuple[str, bool, bool]:
    """(mnemonic without update/indexed suffixes, update form, indexed form) of a load or store."""
    indexed = m.endswith("x")
    if indexed:
        m = m[:-1]
    update = m.endswith("u")
    if update:
        m = m[:-1]
    return m, update, indexed


class _PpcState(_State):
    FRAME = ("r1", "r31")

    def __init__(self, image: object) -> None:
        super().__init__(image)
        self.cr: dict[str, tuple[Value, int, bool] | None] = {}

    @staticmethod
    def is_load(ins: cs.CsInsn) -> bool:
        """A load: `l*` with a memory operand or an indexed `l*x`."""
        m = ins.mnemonic
        if not m.startswith("l") or m in ("li", "lis", "la"):
            return False
        return _ppc_base(m)[0] in _PPC_LOADS

    @staticmethod
    def indexes(ins: cs.CsInsn) -> bool:
        """`lwzx`/`lwax`/`ldx` ... or `add` (before `lwz rE, 0(rA)`)."""
        m = ins.mnemonic
        if m == "add":
            return True
        base, _update, indexed = _ppc_base(m)
        return indexed and m.startswith("l") and base in _PPC_LOADS

    def seed(self, backend: object, jump_va: int) -> None:
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
            region = backend.codemap.region(jump_va)  # type: ignore[attr-defined]
            toc = _toc_before(self.image, jump_va, region.va if region is not None else jump_va)
            if toc is not None:
                self.regs["r2"] = self.const(toc)
                self.fixed.add("r2")
            return
        start = _function_start(backend, jump_va)
        if start is None:
            return
        cache = backend.__dict__.setdefault("_jt_pic", {})
        if start not in cache:
            cache[start] = self._pic_register(backend, start, jump_va)
        if cache[start] is not None:
            self.regs["r30"] = cache[start]

    def _pic_register(self, backend: object, start: int, jump_va: int) -> Value | None:
        """r30 after the straight-line start of the function at `start` when it is a constant there."""
        image = self.image
        md = backend.md(False)  # type: ignore[attr-defined]
        data = image.read(start, min(_PROLOGUE, jump_va - start))  # type: ignore[attr-defined]
        if not data:
            return None
        prologue = _PpcState(image)
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

    def _reg(self, ins: cs.CsInsn, op: object) -> str:
        return ins.reg_name(op.reg)  # type: ignore[attr-defined]

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
        if m.startswith("l") and len(ops) == 2 and ops[1].type == cs.CS_OP_MEM and _ppc_base(m)[1]:
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
            holds = _NEGATE[cond]
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
        base_m, update, indexed = _ppc_base(m)
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
            if base in self.FRAME and not update:
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
        self.memo = {}  # a store may change what any pointer reads
        base_m, update, indexed = _ppc_base(m)
        size = _PPC_STORES.get(base_m, 0)
        if indexed or len(ops) != 2 or ops[1].type != cs.CS_OP_MEM or ops[0].type != cs.CS_OP_REG:
            self.slots = {}
            if update and len(ops) == 3 and ops[1].type == cs.CS_OP_REG:
                self.write(self._reg(ins, ops[1]))
            return
        mem = ops[1].mem
        base = ins.reg_name(mem.base) if mem.base else "r0"
        src = self._reg(ins, ops[0])
        value = self.read(src) if src.startswith("r") and base_m in ("stw", "std") else None
        if update:
            self.write(base)  # `stwu r1, -N(r1)`: a new frame, the old slots are gone
            return
        self.slot_store(base, mem.disp, size, value)

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
    backend: object,
    codemap: CodeMap,
    slice_start: int,
    jump_va: int,
    earlier: list[tuple[int, int]] = (),  # type: ignore[assignment]
) -> tuple[list[int], int, bool]:
    """Case targets of the PowerPC `bctr` at `jump_va`, the table address (0 when none), and whether
    a bound check guards it. Only complete, bounded dispatches resolve; otherwise `([], 0, True)`."""
    return _resolve(
        backend, codemap, slice_start, jump_va, earlier, _PpcState, lambda i: i.mnemonic.rstrip("+-") == "bctr", 4
    )


# --------------------------------------------------------------------------- RISC-V
_RV_LOADS = {
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
_RV_STORES = {"sb": 1, "sh": 2, "sw": 4, "sd": 8, "swsp": 4, "sdsp": 8, "fsw": 4, "fsd": 8, "fswsp": 4, "fsdsp": 8}
_RV_CALL_CLOBBERS = ("ra", "t0", "t1", "t2", "t3", "t4", "t5", "t6", *(f"a{k}" for k in range(8)))
_RV_BRANCH = {"bltu": "lt", "bgeu": "ge", "bgtu": "gt", "bleu": "le"}
_RV_ALIASES = {"fp": "s0", "x8": "s0", "x2": "sp", "x1": "ra", "x0": "zero"}


def _rv_is_jump(ins: cs.CsInsn) -> bool:
    m = ins.mnemonic.removeprefix("c.")
    return m == "jr" or (m == "jalr" and ins.op_str.startswith(("zero", "x0")))


class _RvState(_State):
    FRAME = ("sp", "s0")

    @staticmethod
    def is_load(ins: cs.CsInsn) -> bool:
        """A load into an integer register."""
        return ins.mnemonic.removeprefix("c.") in _RV_LOADS

    @staticmethod
    def indexes(ins: cs.CsInsn) -> bool:
        """`add` (RISC-V has no indexed loads)."""
        return ins.mnemonic.removeprefix("c.") == "add"

    def _reg(self, ins: cs.CsInsn, op: object) -> str:
        name = ins.reg_name(op.reg) or ""  # type: ignore[attr-defined]
        return _RV_ALIASES.get(name, name)

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
            return self.read(_RV_ALIASES.get(ins.reg_name(mems[0].mem.base), ins.reg_name(mems[0].mem.base)))
        if not regs or any(imms):
            return self.fresh()
        return self.read(self._reg(ins, regs[-1]))

    def step(self, ins: cs.CsInsn, next_va: int) -> None:
        """Evaluate `ins`; `next_va` is the address executed after it on this path."""
        m = ins.mnemonic.removeprefix("c.")
        ops = ins.operands
        if m in ("jal", "jalr", "call"):
            regs = [self._reg(ins, op) for op in ops if op.type == cs.CS_OP_REG]
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
        if m in _RV_STORES:
            self._store(ins, m, ops)
            return
        if m in _RV_LOADS:
            self._load(ins, m, ops)
            return
        if m.startswith(("amo", "sc.")):  # atomics write memory
            self.memo = {}
            self.slots = {}
        if not self._arith(ins, m, ops) and ops and ops[0].type == cs.CS_OP_REG:
            self.write(self._reg(ins, ops[0]))

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
            holds = _NEGATE[_RV_BRANCH[m]]
        else:
            return
        a, b = self.read(self._reg(ins, regs[0])), self.read(self._reg(ins, regs[1]))
        if b[0] == "c" and a[0] != "c":
            self.bound(a, holds, b[1], False)
        elif a[0] == "c" and b[0] != "c":
            self.bound(b, holds, a[1], True)

    def _mem(self, ins: cs.CsInsn, ops: list) -> tuple[str, int] | None:
        """(base register, displacement) of `lw rd, d(rs)` or of capstone's compressed `c.lw rd, d, rs`."""
        if len(ops) == 2 and ops[1].type == cs.CS_OP_MEM:
            mem = ops[1].mem
            name = ins.reg_name(mem.base) or ""
            return _RV_ALIASES.get(name, name), mem.disp
        if len(ops) == 3 and ops[1].type == cs.CS_OP_IMM and ops[2].type == cs.CS_OP_REG:
            return self._reg(ins, ops[2]), ops[1].imm
        return None

    def _load(self, ins: cs.CsInsn, m: str, ops: list) -> None:
        size, signed = _RV_LOADS[m]
        where = self._mem(ins, ops)
        if where is None or not ops or ops[0].type != cs.CS_OP_REG:
            self.slots = {}
            for op in ops[:1]:
                if op.type == cs.CS_OP_REG:
                    self.write(self._reg(ins, op))
            return
        dst = self._reg(ins, ops[0])
        base, disp = where
        if base in self.FRAME:
            self.write(dst, self.slot_load(base, disp, size))
            return
        b = self.read(base)
        addr = self.add(b, self.const(disp)) if disp else b
        self.write(dst, self.pointer_load(addr, size, signed))

    def _store(self, ins: cs.CsInsn, m: str, ops: list) -> None:
        self.memo = {}  # a store may change what any pointer reads
        where = self._mem(ins, ops)
        if where is None or not ops or ops[0].type != cs.CS_OP_REG:
            self.slots = {}
            return
        base, disp = where
        src = self._reg(ins, ops[0])
        value = self.read(src) if not m.startswith("f") else None
        self.slot_store(base, disp, _RV_STORES[m], value)

    def _arith(self, ins: cs.CsInsn, m: str, ops: list) -> bool:
        """li/lui/auipc/addi/add/mv/slli/sext.w/zext.w (and compressed forms): False when not modelled."""
        if not ops or ops[0].type != cs.CS_OP_REG:
            return False
        dst = self._reg(ins, ops[0])
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
        if m in ("mv", "sext.w", "zext.w") and n == 2 and ops[1].type == cs.CS_OP_REG:
            v = self.read(self._reg(ins, ops[1]))
            if m == "sext.w" and v[0] == "c":
                k = v[1] & 0xFFFFFFFF
                v = self.const(k - (1 << 32) if k >> 31 else k)
            elif m == "zext.w" and v[0] == "c":
                v = self.const(v[1] & 0xFFFFFFFF)
            elif m == "sext.w" and v[0] == "e" and v[2] == 4:
                v = ("e", v[1], 4, True, v[4])
            elif m != "mv" and v[0] not in ("v", "d"):
                v = None
            self.write(dst, v)
            return True
        # two-operand compressed forms: `c.addi rd, imm`, `c.add rd, rs`, `c.slli rd, imm`
        if n == 2:
            a = self.read(dst)
            if m in ("addi", "addi16sp") and imm is not None:
                self.write(dst, self.add(a, self.const(imm)))
                return True
            if m == "add" and ops[1].type == cs.CS_OP_REG:
                self.write(dst, self.add(a, self.read(self._reg(ins, ops[1]))))
                return True
            if m == "slli" and imm is not None:
                self.write(dst, self.shift_left(a, imm))
                return True
            if m == "srli" and imm is not None and a[0] == "h" and 29 <= imm <= 32:
                self.write(dst, self.shift_left(a[1], 32 - imm) if imm < 32 else a[1])
                return True
            return False
        if n != 3 or ops[1].type != cs.CS_OP_REG:
            return False
        a = self.read(self._reg(ins, ops[1]))
        if m == "addiw" and imm is not None:  # a 32-bit add: a rebased 32-bit index has its own identity
            if a[0] == "c":
                k = (a[1] + imm) & 0xFFFFFFFF
                self.write(dst, self.const(k - (1 << 32) if k >> 31 else k))
            else:
                self.write(dst, ("d", ("w", a), imm) if a[0] in ("v", "d") else None)
            return True
        if m == "srli" and imm is not None and a[0] == "h" and 29 <= imm <= 32:
            self.write(dst, self.shift_left(a[1], 32 - imm) if imm < 32 else a[1])
            return True
        if m in ("addi", "addi4spn") and imm is not None:
            self.write(dst, self.add(a, self.const(imm)))
            return True
        if m == "add" and ops[2].type == cs.CS_OP_REG:
            self.write(dst, self.add(a, self.read(self._reg(ins, ops[2]))))
            return True
        if m == "slli" and imm is not None:
            self.write(dst, self.shift_left(a, imm))
            return True
        return False


def riscv_jump_table_targets(
    backend: object,
    codemap: CodeMap,
    slice_start: int,
    jump_va: int,
    earlier: list[tuple[int, int]] = (),  # type: ignore[assignment]
) -> tuple[list[int], int, bool]:
    """Case targets of the RISC-V `jr` at `jump_va`, the table address (0 when none), and whether a
    bound check guards it. Only complete, bounded dispatches resolve; otherwise `([], 0, True)`."""
    return _resolve(backend, codemap, slice_start, jump_va, earlier, _RvState, _rv_is_jump, 2)
