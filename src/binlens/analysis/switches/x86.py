"""Jump tables behind x86/x86-64 indirect jumps (gcc, clang and MSVC shapes).

The slice is the jump's chunk and the chunk that guards it (`cmp idx, N; ja default`). Table
bases come from the slice's constants (RIP-relative `lea`, absolute displacements, MSVC's
image-base-relative displacements); entries are tried as 32-bit offsets from the table
(PIC gcc/clang), absolute pointers (non-PIC), and image-relative 32-bit values (MSVC x64).
The bound is the guard's compare when found; reading always stops at the first entry that
does not land on code next to the jump.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from binlens.analysis.codemap import BODY, CodeMap, CodeRegion
from binlens.analysis.decode import iced as ix
from binlens.analysis.switches.tables import writable

if TYPE_CHECKING:
    from binlens.analysis.decode.x86 import X86Backend
    from binlens.loader.image import Image

OK = ix.OpKind
MN = ix.Mnemonic
FC = ix.FlowControl
_MAX_ENTRIES = 1024
_WINDOW = 1 << 20  # case targets lie within 1 MiB of the jump
_MAX_MASK = 256  # `and idx, 2^k - 1` bounds a table of at most this many entries
_FULL = ix.RegisterExt.full_register
_IMMEDIATES = {OK.IMMEDIATE8, OK.IMMEDIATE8TO32, OK.IMMEDIATE8TO64, OK.IMMEDIATE32, OK.IMMEDIATE32TO64}
_FRAME = {ix.Register.RBP, ix.Register.RSP, ix.Register.EBP, ix.Register.ESP}
_MOVES = {MN.MOV, MN.MOVZX, MN.MOVSXD, MN.MOVSX, MN.LEA, MN.SHL, MN.ADD, MN.CDQE}


def jump_table_targets(
    backend: X86Backend,
    codemap: CodeMap,
    slice_start: int,
    jump_va: int,
    earlier: Sequence[tuple[int, int]] = (),
) -> tuple[list[int], int, bool]:
    """Case targets of the indirect jump at `jump_va`, the table address (0 when none), and
    whether a bound check guards it (unguarded: a computed goto or an array of function pointers)."""
    b = backend
    insns = [i for i in b.raw_instructions(slice_start, jump_va + 16) if i.ip <= jump_va]
    if not insns or insns[-1].ip != jump_va:
        return [], 0, True
    jmp = insns[-1]
    if jmp.op0_kind == OK.REGISTER and earlier and _set_before(insns[:-1], _FULL(jmp.op0_register)):
        # gcc merges a function's computed gotos into one `jmp reg` that every handler jumps to
        # (clang -O0: `mov reg, [rbp - x]; jmp reg`): the table load is in the chunk that jumped there
        start, end = earlier[0]
        insns = b.raw_instructions(start, end) + insns
        earlier = earlier[1:]
    image = b.image
    ptr = b.ptr_size
    base = image.identity.image_base
    bases: list[int] = []
    gotrel: set[int] = set()
    got = _got_base(image) if ptr == 4 and image.identity.format == "ELF" else None
    scale = 0
    if jmp.op0_kind == OK.MEMORY:
        scale = jmp.memory_index_scale
        if jmp.memory_index != ix.Register.NONE and (jmp.memory_base == ix.Register.NONE or jmp.memory_displacement):
            bases.append(jmp.memory_displacement)  # (`jmp [reg + idx*8]`: the table is in reg)
    for ins in reversed(insns[:-1]):
        if ins.is_ip_rel_memory_operand:
            bases.append(ins.ip_rel_memory_address)
        elif ins.op_count >= 2 and OK.MEMORY in (ins.op0_kind, ins.op1_kind) and ins.memory_index != ix.Register.NONE:
            d = ins.memory_displacement
            if d:
                bases.append(d & ((1 << (ptr * 8)) - 1))
                if d < 0x80000000 and base is not None:
                    bases.append(base + d)
                if got is not None and ins.memory_base != ix.Register.NONE:
                    gotrel.add((got + d) & 0xFFFFFFFF)  # i386 PIC: [ebx + idx*4 + disp], entries relative to GOT
                    bases.append((got + d) & 0xFFFFFFFF)
            scale = scale or ins.memory_index_scale
    if not bases and earlier:
        # the table sits in a register loaded long before (an interpreter's dispatch table)
        reg = _table_register(insns)
        if reg is not None:
            found = _register_constant(b, earlier, reg)
            if found is not None:
                bases.append(found)
    count = _bound(insns)
    limit = None
    if count is None:
        count, exact = _mask_bound(insns)
        if not exact:
            count, limit = None, count  # an upper bound only: read no further, but unguarded
    region = codemap.region(jump_va)
    if region is None:
        return [], 0, True
    sectioned = bool(image.sections)
    best: list[int] = []
    best_base = 0
    seen = set()
    for t in bases:
        if t in seen or not image.is_mapped(t) or writable(image, t) or (sectioned and image.section_at(t) is None):
            # switch tables are read-only; a writable table is an array of function pointers; a
            # table lies in a section (not in the file's headers)
            continue
        seen.add(t)
        for fmt in ["gotrel32"] if t in gotrel else _formats(ptr, scale, base is not None):
            rel = (got if fmt == "gotrel32" else base) or 0  # (the base of entries relative to one: never None there)
            targets = _read(image, region, t, fmt, count or limit, jump_va, rel)
            if len(targets) > len(best):
                best, best_base = targets, t
        if best and count is not None and len(best) >= count:
            break
    return best, best_base, count is not None


def _table_register(insns: list[ix.Instruction]) -> int | None:
    """The base register of the indexed load (or jump) that reads the table."""
    for ins in reversed(insns):
        if OK.MEMORY in (ins.op0_kind, ins.op1_kind) and ins.memory_index != ix.Register.NONE:
            if ins.memory_base not in (ix.Register.NONE, ix.Register.RIP) and ins.memory_displacement == 0:
                return ix.RegisterExt.full_register(ins.memory_base)
            return None
    return None


def _register_constant(backend: X86Backend, earlier: Sequence[tuple[int, int]], reg: int) -> int | None:
    """Walk earlier chunks (most recent first) for `lea reg, [rip+X]` before anything else writes reg."""
    full = ix.RegisterExt.full_register
    for start, end in earlier:
        for ins in reversed(backend.raw_instructions(start, end)):
            if ins.op_count and ins.op0_kind == OK.REGISTER and full(ins.op0_register) == reg:
                if ins.mnemonic == MN.LEA and ins.is_ip_rel_memory_operand:
                    return ins.ip_rel_memory_address
                if ins.mnemonic == MN.MOV and ins.op1_kind in (OK.IMMEDIATE32, OK.IMMEDIATE32TO64, OK.IMMEDIATE64):
                    return ins.immediate(1)
                if ins.mnemonic not in (MN.CMP, MN.TEST, MN.PUSH):
                    return None
    return None


def _got_base(image: Image) -> int | None:
    """i386 PIC code addresses data from _GLOBAL_OFFSET_TABLE_: .got.plt, else .got."""
    secs = {s.name: s.va for s in image.sections}
    return secs.get(".got.plt", secs.get(".got"))


def _formats(ptr: int, scale: int, has_base: bool) -> list[str]:
    """Entry formats to try, most likely first; image-base-relative entries need an image base."""
    if ptr == 8:
        formats = ["rel32", "abs64", "rva32"] if scale != 8 else ["abs64", "rel32", "rva32"]
        return formats if has_base else formats[:2]
    return ["abs32", "rel32"]


def _bound(insns: list[ix.Instruction]) -> int | None:
    """Number of entries from the guard `cmp r, N` (or `sub r, N`) + `ja/jae` closest to the jump.
    The compare is the last instruction before the branch that writes the flags (clang may put a
    `mov` or `lea` between them: `cmp eax, 0x58; mov [rsp+0x38], r14; ja default`)."""
    for k in range(len(insns) - 2, 0, -1):
        j = insns[k]
        if j.flow_control != FC.CONDITIONAL_BRANCH:
            continue
        i = k - 1
        while i > 0 and not insns[i].rflags_modified and insns[i].flow_control == FC.NEXT:
            i -= 1
        c = insns[i]
        if c.mnemonic in (MN.CMP, MN.SUB) and c.op1_kind in (  # clang -O0: `sub rax, N; ja default`
            OK.IMMEDIATE8,
            OK.IMMEDIATE8TO32,
            OK.IMMEDIATE8TO64,
            OK.IMMEDIATE32,
            OK.IMMEDIATE32TO64,
            OK.IMMEDIATE16,
            OK.IMMEDIATE8TO16,
        ):
            n = c.immediate(1) & 0xFFFFFFFF
            if j.mnemonic == MN.JA:
                return n + 1 if n < _MAX_ENTRIES else None
            if j.mnemonic == MN.JAE:
                return n if n <= _MAX_ENTRIES else None
            return None
    return None


def _stack_slot(ins: ix.Instruction) -> tuple[int, int] | None:
    """(base register, displacement) of a plain `[rbp/rsp/ebp/esp + d]` memory operand, else None."""
    if ins.memory_index != ix.Register.NONE or ins.memory_base == ix.Register.NONE:
        return None
    base = _FULL(ins.memory_base)
    return (base, ins.memory_displacement) if base in _FRAME else None


def _set_before(insns: list[ix.Instruction], reg: int) -> bool:
    """Is `reg` set before these instructions run: not written by them, or only reloaded from a
    stack slot (clang -O0 keeps the loaded target in a local)?"""
    for ins in reversed(insns):
        if ins.mnemonic == MN.CDQE and reg == ix.Register.RAX:
            return False
        if (
            ins.op_count
            and ins.op0_kind == OK.REGISTER
            and _FULL(ins.op0_register) == reg
            and ins.mnemonic not in (MN.CMP, MN.TEST, MN.PUSH)
        ):
            return ins.mnemonic == MN.MOV and ins.op1_kind == OK.MEMORY and _stack_slot(ins) is not None
    return True


def _mask_bound(insns: list[ix.Instruction]) -> tuple[int | None, bool]:
    """(number of entries, exact?) from `and idx, 2^k - 1` on the table index (`goto *tbl[op & 0x7f]`).

    Walks back from the jump through the registers its target is computed from: the load from
    the table turns the tracked register into the load's base and index registers; moves,
    extensions, shifts and adds carry the tracking to their sources; a constant (`lea` of a
    fixed address, `mov` of an immediate) or any other write ends it. The first `and` with a
    mask met on a tracked register after the load gives the bound. A zero-extension of a byte
    into the index (`movzx eax, al`, `movzx eax, byte [x]`) when only moves lie between it and
    the load gives 256 as an upper bound when no mask is found, not exact (a compare the slice
    does not hold may bound it lower): sqlite's opcode dispatch, `lea eax, [rbx - 0x80]; movzx eax, al; movsxd rax, [rcx
    + rax*4]`, had been read to 1024 entries, past its table into words that named the middle of
    instructions, whose decoding then hid a function called from nine places.
    """
    jmp = insns[-1]
    loaded = False
    regs: set[int | tuple[int, int]] = set()  # registers, and stack slots (base, displacement)
    if jmp.op0_kind == OK.MEMORY:
        if jmp.memory_index == ix.Register.NONE:
            return None, True
        regs.add(_FULL(jmp.memory_index))
        loaded = True
    elif jmp.op0_kind == OK.REGISTER:
        regs.add(_FULL(jmp.op0_register))
    else:
        return None, True
    pure = True  # only moves between the table load and here: the index is the value tracked
    byte = False  # a zero-extended byte met on the way: at most 256 entries, unless a mask says fewer
    for ins in reversed(insns[:-1]):
        m = ins.mnemonic
        if m == MN.CDQE:
            continue  # rax from eax: the same value, tracked or not
        if ins.op_count == 2 and ins.op0_kind == OK.MEMORY and m == MN.MOV:
            slot = _stack_slot(ins)
            if slot is not None and slot in regs:  # a spill of a tracked value: track what was stored
                regs.discard(slot)
                if ins.op1_kind != OK.REGISTER:
                    return (256, False) if byte else (None, True)
                regs.add(_FULL(ins.op1_register))
            continue
        if not ins.op_count or ins.op0_kind != OK.REGISTER:
            continue
        r = _FULL(ins.op0_register)
        if r not in regs or m in (MN.CMP, MN.TEST, MN.PUSH):
            continue
        regs.discard(r)
        if loaded and pure and m == MN.MOVZX and _byte_source(ins):
            byte = True  # the index is a byte; an `and` before this one may bound it lower
        if ins.op_count >= 2 and ins.op1_kind == OK.MEMORY and m != MN.LEA:
            if m not in (MN.MOV, MN.MOVSXD, MN.MOVZX, MN.MOVSX) or ins.is_ip_rel_memory_operand:
                return (256, False) if byte else (None, True)
            slot = _stack_slot(ins)
            if slot is not None:
                regs.add(slot)  # a reload of a local (-O0)
            else:
                regs.update(_FULL(x) for x in (ins.memory_base, ins.memory_index) if x != ix.Register.NONE)
                loaded = True
        elif m == MN.AND and ins.op1_kind in _IMMEDIATES:
            n = (ins.immediate(1) & 0xFFFFFFFF) + 1
            if loaded and n & (n - 1) == 0 and 2 <= n <= _MAX_MASK:
                return n, True
            return (256, False) if byte else (None, True)
        elif m == MN.LEA:
            if ins.is_ip_rel_memory_operand or ins.memory_base == ix.Register.NONE == ins.memory_index:
                continue  # a constant address: the table, not the index
            pure = pure and not loaded
            regs.update(_FULL(x) for x in (ins.memory_base, ins.memory_index) if x != ix.Register.NONE)
        elif m in _MOVES:
            if ins.op_count >= 2 and ins.op1_kind == OK.REGISTER:
                regs.add(_FULL(ins.op1_register))
            if m in (MN.SHL, MN.ADD):
                regs.add(r)  # the register is read as well as written
                pure = pure and not loaded
            elif ins.op_count >= 2 and ins.op1_kind != OK.REGISTER:
                continue  # `mov r, imm`: a constant
        else:
            return (256, False) if byte else (None, True)
        if not regs:
            return (256, False) if byte else (None, True)
    return (256, False) if byte else (None, True)


def _byte_source(ins: ix.Instruction) -> bool:
    """Is the source of this `movzx` a byte (an 8-bit register or a byte in memory)?"""
    if ins.op1_kind == OK.REGISTER:
        return ix.RegisterExt.size(ins.op1_register) == 1
    return ins.op1_kind == OK.MEMORY and ins.memory_size == ix.MemorySize.UINT8


def _read(
    image: Image, region: CodeRegion, table: int, fmt: str, count: int | None, jump_va: int, base: int
) -> list[int]:
    """The case targets of the table at `table` read as `fmt` entries (`rva32`, `gotrel32`: relative
    to `base`): up to `count`, up to the first that leaves the jump's region or window."""
    size = 8 if fmt == "abs64" else 4
    limit = count if count is not None else _MAX_ENTRIES
    raw = image.read(table, size * limit)
    if raw is None:
        # the table may end near the end of its section: read what is mapped
        raw = b""
        while len(raw) < size * limit:
            chunk = image.read(table + len(raw), size)
            if chunk is None:
                break
            raw += chunk
    endian = "<" if image.identity.endian == "little" else ">"
    code = {"rel32": "i", "abs64": "Q", "rva32": "I", "abs32": "I", "gotrel32": "i"}[fmt]
    out: list[int] = []
    r = region
    for k in range(len(raw) // size):
        (v,) = struct.unpack_from(endian + code, raw, k * size)
        if fmt == "rel32":
            t = (table + v) & 0xFFFFFFFFFFFFFFFF
        elif fmt in ("rva32", "gotrel32"):
            t = (base + v) & 0xFFFFFFFFFFFFFFFF
        else:
            t = v
        if not (r.va <= t < r.end) or abs(t - jump_va) > _WINDOW:
            break
        if r.state[t - r.va] == BODY:
            break
        out.append(t)
    return out
