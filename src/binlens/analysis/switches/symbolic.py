"""The forward evaluation shared by the PowerPC and RISC-V jump-table resolvers.

Dispatches are recognised by a small forward evaluation over the recorded path to the jump (the same
walk as the AArch64 resolver, `jumptable_a64.py`): registers and stack slots hold symbolic values
(a constant, an unknown value with an identity, a scaled index, a table address at an index, a
table entry, a computed target), so `-O0` code that spills the index and reloads it keeps the
identity its compare bounded. A table is resolved only when the jump register is an entry of a
constant, read-only table (absolute) or a constant plus such an entry (relative), the entry is
loaded at an index scaled by the entry size, and a compare-and-branch on that same index on the
path bounds it. Anything else leaves the jump unresolved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import capstone as cs

from binlens.analysis.codemap import CodeMap
from binlens.analysis.switches import common as jt

if TYPE_CHECKING:
    from binlens.analysis.decode.capstone_backend import CapstoneBackend
    from binlens.loader.image import Image

_MAX_CHUNKS = 32  # earlier chunks evaluated before the jump's own slice (the PPC GOT register is set once, at entry)

# Symbolic values (hashable tuples): ("c", k) a constant; ("v", n) an unknown value with an
# identity; ("d", v, k) that value plus k (a rebased index); ("h", index, s) index << s (RV64's
# zero extension in two shifts: s = 32, 48, 56); ("z", v, bits) the low `bits` (8, 16) of v,
# zero-extended (held as ("d", z, 0)); ("x", index, shift) index << shift; ("a", table, index,
# shift) the address of table[index] for entries of 1 << shift bytes; ("e", table, size, signed, index) the entry
# loaded from there; ("t", base, entry) the target base + entry.
Value = tuple
# address -> addend of each relative relocation (None for any other relocation there)
RelocMap = dict[int, int | None]

# the bound an unsigned `index <cond> N` gives: "le" index <= N, "lt" index < N
NEGATE = {"gt": "le", "ge": "lt", "le": "gt", "lt": "ge"}
_SWAP = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge"}


# --------------------------------------------------------------------------- shared driver
def resolve(
    backend: CapstoneBackend,
    codemap: CodeMap,
    slice_start: int,
    jump_va: int,
    earlier: jt.Chunks,
    state_cls: type[State],
    is_jump: Callable[[cs.CsInsn], bool],
    align: int,
) -> jt.Resolution:
    """The table behind the indirect jump at `jump_va`, by the forward evaluation of `state_cls`
    over the recorded path to it (`is_jump` tells the jump; case targets are `align`-aligned)."""
    image, md, own = jt.jump_slice(backend, slice_start, jump_va, short_end=True)
    if not own or own[-1].address != jump_va or not is_jump(own[-1]) or not any(map(state_cls.indexes, own)):
        return jt.NONE  # no indexing next to the jump: a PLT stub, a tail call or a call through a pointer
    insns = jt.path_to_jump(md, image, earlier, _MAX_CHUNKS, own)
    state = state_cls(image)
    state.seed(backend, jump_va)
    jt.walk(state, insns)
    target = state.jump_value(insns[-1])
    if target[0] == "t":
        base, entry = target[1], target[2]
    elif target[0] == "e" and target[2] in (4, state.ptr_size):
        base, entry = 0, target  # absolute entries (32-bit ones on RV64 medlow: `.word .L5`, loaded by `lw`)
    else:
        return jt.NONE
    _e, table, size, signed, index = entry
    count = jt.entry_count(state.bounds, index)
    values = None if count is None else jt.read_entries(image, table, size, count, signed)
    if values is None:
        return jt.NONE
    if not base and size == state.ptr_size:  # absolute entries of a PIE: the relocations hold them
        values = [state.relocated(table + k * size, v) for k, v in enumerate(values)]
    masked = state.masks.get(index) == count  # only a mask bounds it: the table may be shorter
    mask = state.mask
    targets = []
    for v in values:
        t = (base + v) & mask
        if jt.near_code(codemap, t, jump_va, align):  # only targets in code next to the jump
            targets.append(t)
        elif masked:
            break  # (`goto *tbl[op & 0x7f]` with fewer than 128 labels: the table ends here)
        elif state.strict:
            return jt.NONE  # a table found through a guessed register: one stray entry rejects it
    return targets, table, True


class State:
    """Registers, stack slots, the pending compares and the bounds learnt along one path."""

    FRAME: tuple[str, ...] = ()  # registers whose [reg + disp] words are tracked as stack slots

    def __init__(self, image: Image, relocs: RelocMap | None = None) -> None:
        self.image = image
        bits = image.identity.bits
        self.ptr_size = 8 if bits == 64 else 4
        self.mask = (1 << bits) - 1
        self.regs: dict[str, Value] = {}
        self.slots: dict[tuple[str, int, int], Value] = {}
        self.bounds: dict[Value, int] = {}
        self.fixed: set[str] = set()  # registers holding one value throughout the function (PPC64 TOC)
        self.masks: dict[Value, int] = {}  # index -> the entries an `and` with 2**k - 1 allows (k <= 8)
        self.strict = False  # a register was guessed (seeded from a scan): accept only a table of code targets
        self.memo: dict[tuple, Value] = {}  # (address, size, signed) -> value loaded, until a store or call
        self._next = 0
        self.relocs = relocs  # the image's `reloc_map`, built on first need when the caller has none

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

    def seed(self, backend: CapstoneBackend, jump_va: int) -> None:
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
        if a[0] in ("v", "d") and s in (32, 48, 56) and self.mask != 0xFFFFFFFF:
            return ("h", a, s)  # the first half of a zero extension: `slli rd, rs, 32; srli rd, rd, 32 - s`
        if a[0] in ("v", "d") and s <= 3:
            return ("x", a, s)
        if a[0] == "x" and a[2] + s <= 3:
            return ("x", a[1], a[2] + s)
        return self.fresh()

    def zero_extend(self, a: Value, bits: int) -> Value | None:
        """The low `bits` of `a`, zero-extended: a 32-bit index keeps its identity (as `sext.w` does);
        a byte or halfword gets one of its own, the same wherever the same value is extended
        (gcc extends the index once for the compare and again for the table). None: not an index."""
        if a[0] == "c":
            return self.const(a[1] & ((1 << bits) - 1))
        if a[0] not in ("v", "d"):
            return None
        return a if bits == 32 else ("d", ("z", a, bits), 0)

    def mask_low(self, a: Value, k: int) -> Value:
        """a & (2**k - 1): a byte or halfword zero extension keeps one identity (`zero_extend`); a
        mask of k <= 8 bits bounds the value to 2**k table entries (`switch (x & 7)` with every
        value a case, `goto *tbl[op & 0x7f]`)."""
        if a[0] == "c":
            return self.const(a[1] & ((1 << k) - 1))
        v = self.zero_extend(a, k) if k in (8, 16) else None
        if v is None:
            v = self.fresh()
        if k <= 8:
            self.bounds[v] = min(1 << k, self.bounds.get(v, 1 << k))
            self.masks[v] = 1 << k
        return v

    def unshift(self, h: Value, imm: int) -> Value | None:
        """`srli rd, rs, imm` of ("h", a, s): the zero-extended low 64 - s bits of a, shifted left
        by s - imm (an entry scale, 0..3); None for other shift amounts."""
        s = h[2]
        if not s - 3 <= imm <= s:
            return None
        z = self.zero_extend(h[1], 64 - s)
        if z is None:
            return None
        return self.shift_left(z, s - imm) if imm < s else z

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
        key = (addr, size)  # `lw` then `lwu` of one word: equal wherever an unsigned bound holds (< 2**31)
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
        relocs = self._reloc_map()
        if va in relocs:
            addend = relocs[va]
            return self.const(addend) if addend is not None and size == self.ptr_size else self.fresh()
        raw = image.read(va, size) if image.is_mapped(va) else None
        if raw is None or len(raw) < size:
            return self.fresh()
        endian: Literal["little", "big"] = "little" if image.identity.endian == "little" else "big"
        return self.const(int.from_bytes(raw, endian, signed=signed))

    def _reloc_map(self) -> RelocMap:
        """The image's `reloc_map` (built once per state unless the caller gave it)."""
        if self.relocs is None:
            self.relocs = reloc_map(self.image)
        return self.relocs

    def relocated(self, va: int, raw: int) -> int:
        """The pointer-sized word at `va` once loaded: a relative relocation's addend (RELA files
        hold 0 in the word itself), else the word read from the file."""
        addend = self._reloc_map().get(va)
        return addend if addend is not None else raw

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
    def frame_base(self, base: str) -> bool:
        """Is a load through `base` a frame slot? Not when the frame register holds a constant or a
        table address: optimised code uses s0 / r31 as an ordinary callee-saved register."""
        return base in self.FRAME and self.regs.get(base, ("v",))[0] not in ("c", "a")

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


def reloc_map(image: Image) -> RelocMap:
    """Address -> addend of each relative relocation of `image` (None for any other relocation there)."""
    relocs: RelocMap = {}
    for r in image.relocations:
        relocs[r.address] = r.addend if r.symbol is None and "RELATIVE" in r.type.upper() else None
    return relocs
