"""ARM32 parts of the careful heuristics: the state a guessed start decodes in, pushes and leaf
functions in gaps, and guesses that code found later contradicts (see docs/ENGINE.md, "ARM32
unwind index, gap pushes and wrong-state guesses")."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, cast

from binlens.analysis.codemap import CodeMap, CodeRegion, zero_runs
from binlens.analysis.metadata.armexidx import decodes, gap_push, guess_state, starts_with_push
from binlens.analysis.model import T_COND, T_FALL, Body
from binlens.loader.image import Image

if TYPE_CHECKING:
    from capstone import Cs

    from binlens.analysis.decode.backend import Backend
    from binlens.analysis.decode.capstone_backend import CapstoneBackend
    from binlens.analysis.discovery.explorer import Explorer

_UNSEEN = object()
_PROLOGUE, _POINTER = frozenset({"prologue"}), frozenset({"pointer"})  # sources of guesses alone


def set_arm_state(backend: CapstoneBackend, va: int, thumb: bool) -> None:
    """Decode the unexplored ARM32 code at `va` in the state a pointer to it names (Thumb when its bit 0 was set)."""
    modes = backend.thumb
    if thumb:
        modes.add(va)
    else:
        modes.discard(va)  # e.g. a fall-through guess after a call that does not return


def arm_labels(
    explorer: Explorer, backend: Backend, bodies: dict[int, Body], seeds: Mapping[int, frozenset[str]]
) -> set[int]:
    """ARM32: guesses (`prologue` and `pointer` starts with no other evidence) that another
    function's code runs into (falls through or branches past a condition into): a push or a
    coincidental data word inside a function found before the function was (a shrink-wrapped
    frame, or an entry known only from a later stage); gap guesses another function branches to on
    a condition; and those at a word that a pc-relative load reads (a literal pool, named by a
    data word that happens to hold its address). The caller drops them, and the discovery that
    follows gives their code back to the function."""
    guessed = [va for va, src in seeds.items() if src in (_PROLOGUE, _POINTER)]
    literals = cast("CapstoneBackend", backend).literals  # (ARM32 decodes with capstone)
    out = {va for va in guessed if va in literals}  # a word a pc-relative load reads is data
    into: dict[int, int] = {}  # guess -> the last instruction of the chunk that runs into it
    chunks = explorer.chunks
    for va in guessed:
        a = explorer.pred.get(va)
        c = chunks.get(a) if a is not None else None
        if c is not None and c[0] == va and c[1] in (T_FALL, T_COND):
            into[va] = c[3]
    if into:  # a body that runs into another start lists it among its tails (from that last instruction)
        out.update(s for f, b in bodies.items() for last, s in b.tails if s != f and into.get(s) == last)
    # a gap guess another function branches to on a condition: the exit of a function's checks
    # (`cbz r0, 1f` ... `1: mov.w r0, #-1; bx lr`), found as a leaf before that function was
    pushed = {va for va in guessed if seeds[va] == _PROLOGUE}
    if pushed:
        out.update(s for f, b in bodies.items() for s in b.cond_tails if s != f and s in pushed)
    return out


def arm_pushes(image: Image, codemap: CodeMap, va: int) -> bool:
    """Does the ARM32 code a pointer names (bit 0: Thumb) begin with `push {..., lr}` in that state?"""
    r = codemap.region(va & ~1)
    if r is None:
        return False
    off = (va & ~1) - r.va
    order = "<" if image.code_endian == "little" else ">"
    return starts_with_push(bytes(r.data[off : off + 16]), bool(va & 1), order)


def arm_after_end(
    image: Image, codemap: CodeMap, backend: CapstoneBackend, va: int, thumb: int, tail: bool = False
) -> bool:
    """ARM32: does a function end right before `va` (past padding and the words pc-relative loads
    read)? That is, is the instruction before a return: Thumb `bx lr`, `pop {.., pc}`,
    `pop.w {.., pc}`, `ldr.w pc, [sp], #4`; ARM `bx lr`, `pop {.., pc}`, `ldr pc, [sp], #4`; with `tail`, also an
    unconditional branch or `bx` through a register (a tail call: Thumb `b.n`, `b.w`, `bx rN`; ARM
    `b`, `bx rN`)."""
    r = codemap.region(va)
    if r is None or image.code_endian != "little":
        return False
    literals = backend.literals
    data = r.data
    o = va - r.va
    while o >= 4:
        if (r.va + o - 4) in literals and (r.va + o) % 4 == 0:
            o -= 4
        elif data[o - 2 : o] in (b"\x00\xbf", b"\x00\x00"):
            o -= 2
        else:
            break
    if o < 4:
        return False
    (h,) = struct.unpack_from("<H", data, o - 2)
    (w,) = struct.unpack_from("<I", data, o - 4)
    if h == 0x4770 or h & 0xFF00 == 0xBD00 or (w & 0x8000FFFF == 0x8000E8BD) or w == 0xFB04F85D:
        return True  # (the last: Thumb-2 `ldr.w pc, [sp], #4`, gcc's pop of a lone pc)
    if tail and (h & 0xF800 == 0xE000 or (w & 0xF800 == 0xF000 and w >> 16 & 0xD000 == 0x9000)):
        return True
    if tail and h & 0xFF87 == 0x4700:
        return True  # Thumb `bx rN`: a tail call through a register (`ldr r3, [r0, #56]; bx r3`)
    arm_end = w == 0xE12FFF1E or w & 0xFFFF8000 == 0xE8BD8000 or w == 0xE49DF004
    arm_end = arm_end or tail and (w >> 24 == 0xEA or w & 0xFFFFFFF0 == 0xE12FFF10)
    return (r.va + o) % 4 == 0 and arm_end


def _gap_runs(
    codemap: CodeMap, covered: dict[int, bytearray], within: tuple[int, int] | None
) -> Iterator[tuple[CodeRegion, Iterator[tuple[int, int]]]]:
    """(region, its gaps as offset ranges) for every region, or (`within`: addresses in one region)
    for the gaps inside that range only."""
    if within is None:
        for r in codemap.regions:
            yield r, zero_runs(covered[r.va])
        return
    one = codemap.region(within[0])
    if one is not None:
        yield one, zero_runs(covered[one.va], within[0] - one.va, min(within[1], one.end) - one.va)


def arm_gap_candidates(
    codemap: CodeMap,
    backend: CapstoneBackend,
    covered: dict[int, bytearray],
    memo: dict[int, dict[int, tuple[int, bool, int] | None]],
    within: tuple[int, int] | None = None,
) -> list[tuple[int, int]]:
    """ARM32: in each gap (code no function covers), the first `push {..., lr}` in either state, as
    a code address whose bit 0 says Thumb. A gap usually begins with the literal pool of the
    function before it, so the first non-padding address is data more often than code; the first
    push, Thumb halfword- or ARM word-aligned, is where the next function's frame is built.
    A function may do a little work before its push (`ldr r3, [r0, #8]; push.w {...}`): when
    the gap, past the words pc-relative loads read and padding, begins at most 16 bytes before the
    push with code that runs into it (conditional branches aside: `cbz r0, 1f`), the entry is there instead.
    `memo` keeps the push per gap between rounds (it depends on the gap's bounds and bytes only).
    Each candidate comes with the end of its gap; `within` (addresses in one region): only the
    gaps inside that range."""
    out = []
    literals = backend.literals
    for r, runs in _gap_runs(codemap, covered, within):
        seen = memo.setdefault(r.va, {})
        width = len(r.data) + 1  # a gap's bounds as one int key, as `_gap_candidates` keeps them
        for start, end in runs:
            key = start * width + end
            hit = seen.get(key, _UNSEEN)
            if hit is _UNSEEN:
                va = gap_push(r.data, start, end, r.va)
                hit = seen[key] = None if va is None else (va, True, r.va + end)
            if isinstance(hit, tuple):  # (else None: no push in this gap)
                out.append((_arm_lead_in(r, backend, literals, r.va + start, hit[0]), hit[2]))
    return out


_ARM_PADDING = {2: (b"\x00\xbf", b"\x00\x00"), 4: (b"\x00\x00\xa0\xe1", b"\x00\xf0\x20\xe3", b"\x00\x00\x00\x00")}
# Thumb-2 `nop.w` (f3af 8000): the assembler's padding before a word-aligned literal pool, so that
# the words after it are data, not the lead-in of the function after the pool
_NOP_W = b"\xaf\xf3\x00\x80"


def arm_leaf_candidates(
    image: Image,
    codemap: CodeMap,
    backend: CapstoneBackend,
    covered: dict[int, bytearray],
    prior: bool,
    within: tuple[int, int] | None = None,
) -> list[tuple[int, int, bool]]:
    """ARM32: the first address of each gap (past padding and the words pc-relative loads read)
    when a return or a tail call (an unconditional branch: then the third item is True) comes
    right before it, in the state its first bytes tell (`guess_state`; else
    `prior`, True for Thumb), as a code address whose bit 0 says Thumb: a leaf function nothing
    references (no push to find it by), with the end of its gap. The caller takes it only when its
    code stays inside the gap, or (after a return) when its first block returns or jumps.
    `within` (addresses in one region): only the gaps inside that range."""
    literals = backend.literals
    md = backend.md
    out = []
    for r, runs in _gap_runs(codemap, covered, within):
        for lo, hi in runs:
            g = r.va + lo + (lo & 1)
            end = r.va + hi
            while g + 4 <= end:
                o = g - r.va
                if g in literals and g % 4 == 0:
                    g += 4
                elif r.data[o : o + 2] == b"\x00\xbf" or r.data[o : o + 2] == b"\x00\x00" and not _arm_word(r, o):
                    g += 2
                elif r.data[o : o + 4] == _NOP_W:
                    g += 4
                else:
                    break
            if g + 2 > end:  # (two bytes: a lone `cbz r0, 1f` before a push found first)
                continue
            after_tail = not arm_after_end(image, codemap, backend, g, 0)
            if after_tail and not arm_after_end(image, codemap, backend, g, 0, tail=True):
                continue
            data = (image.read(g, 16) or b"").ljust(16, b"\x00")  # (a short gap at a region's end)
            state = guess_state(data, partial(_valid, md, data, g))
            if state is None:
                state = prior
            if not state and g % 4:
                continue
            out.append((g | int(state), end, after_tail))
    return out


def _valid(md: Callable[[bool], Cs], data: bytes, va: int, thumb: bool) -> int:
    """`guess_state`'s test: how `data` at `va` decodes in that state (`armexidx.decodes`)."""
    return decodes(md(thumb), data, va)


def arm_runs_into(codemap: CodeMap, backend: CapstoneBackend, va: int, push: int) -> bool:
    """ARM32: does the code at `va` (bit 0: Thumb) run into the function start `push` found before
    it by its push, as a function's checks before its frame do (`_arm_lead_in`)?"""
    r = codemap.region(va & ~1)
    thumb = int(backend.decoded_thumb.get(push, False))
    if r is None or thumb != va & 1:
        return False
    literals = backend.literals
    return _arm_lead_in(r, backend, literals, va & ~1, push | thumb) == va


def _arm_word(r: CodeRegion, o: int) -> bool:
    """Is there an ARM instruction with the "always" condition at the word-aligned offset `o` (whose
    low halfword may be zero, like Thumb's `movs r0, r0` padding: `cmp r0, #0` is e3500000)?"""
    return (r.va + o) % 4 == 0 and len(r.data) >= o + 4 and r.data[o + 3] >> 4 == 0xE and r.data[o + 2] != 0


def _arm_lead_in(r: CodeRegion, backend: CapstoneBackend, literals: set[int], lo: int, push: int) -> int:
    """The entry of the function whose push is at `push` (bit 0: Thumb), in a gap that begins at `lo`."""
    thumb = push & 1
    at = push & ~1
    step = 2 if thumb else 4
    g = lo + (lo & 1)
    while g < at:
        if g in literals and g % 4 == 0:
            g += 4
        elif r.data[g - r.va : g - r.va + step] in _ARM_PADDING[step]:
            g += step
        elif thumb and r.data[g - r.va : g - r.va + 4] == _NOP_W:
            g += 4
        else:
            break
    # (up to 64 bytes where a function ends right before: shrink-wrapped code checks its arguments
    # before it builds a frame, `cbz r0, 1f; ldr r3, [r0, #16]; ...; push {r4, lr}`)
    if not 0 < at - g <= 64 or (not thumb and g % 4):
        return push
    if at - g > 16 and not arm_after_end(backend.image, backend.codemap, backend, g, 0):
        return push
    reach = g
    exits = pushes = 0
    for ins in backend.md(bool(thumb)).disasm(bytes(r.data[g - r.va : at - r.va]), g):
        m = ins.mnemonic.split(".")[0]
        ops = ins.op_str
        if m in ("b", "bl", "blx", "bx", "tbb", "tbh", "udf", "bkpt", "svc") or ops.startswith("pc") or "pc}" in ops:
            return push  # only straight-line code and forward exits (`cbz r0, 1f`) come before a push
        exits += m in ("cbz", "cbnz") or m[:1] == "b" and len(m) == 3  # (`bne`, `beq`, ...)
        pushes += m in ("push", "stmdb", "stmfd")
        reach = ins.address + ins.size
    if at - g > 16 and (not exits or pushes):
        return push  # a long lead-in is a check that exits early (data decoded as Thumb pushes too)
    return g | thumb if reach == at else push
