"""`.ARM.exidx` (the ARM EHABI unwind index) parsed from the bytes: one entry per code range.

Each entry is two 32-bit words: a prel31 offset to the first address of the range, then
EXIDX_CANTUNWIND (1), an inline unwind description (bit 31 set), or a prel31 offset to the
range's description in `.ARM.extab`. The table is sorted by address and each range runs to the
next entry's address. A linker also adds entries that only end the range before them (the
CANTUNWIND sentinel after the last function, and one for code with no unwind information, such
as the crt files' assembly), so only entries with an unwind description are taken as function
starts (see `exidx_starts`).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlens.analysis.decode.backend import Backend, is_capstone
from binlens.loader.image import Image

if TYPE_CHECKING:
    import capstone as cs

    from binlens.analysis.discovery.explorer import Explorer

EXIDX_CANTUNWIND = 1


@dataclass(frozen=True, slots=True)
class ExidxEntry:
    """One index entry: the range's first address, its size (to the next entry; 0 for the last)
    and how it unwinds: `cantunwind`, `inline` (the description is in the entry) or `extab`."""

    start: int
    size: int
    kind: str


def _prel31(word: int, place: int) -> int:
    off = word & 0x7FFFFFFF
    if off & 0x40000000:
        off -= 0x80000000
    return (place + off) & 0xFFFFFFFF


def parse_exidx(image: Image) -> list[ExidxEntry]:
    """The entries of the image's `.ARM.exidx`, sorted by address (empty when it has none).

    Entries whose address is not in a section are dropped; a truncated last entry, and entries
    past the end of the file, are ignored.
    """
    if image.identity.arch != "arm" or image.identity.format != "ELF":
        return []
    sec = next((s for s in image.sections if s.name == ".ARM.exidx" and s.size and s.fsize), None)
    if sec is None:
        return []
    n = min(sec.size, sec.fsize) // 8
    data = bytes(image.data[sec.offset : sec.offset + 8 * n])
    n = len(data) // 8  # (a section table may claim more bytes than the file holds)
    data = data[: 8 * n]
    order = "<" if image.identity.endian == "little" else ">"
    words = struct.unpack(f"{order}{2 * n}I", data)
    raw = []
    for i in range(n):
        fn, what = words[2 * i], words[2 * i + 1]
        if fn & 0x80000000:
            continue  # bit 31 of the first word is always clear: not an entry
        start = _prel31(fn, sec.va + 8 * i)
        if what == EXIDX_CANTUNWIND:
            kind = "cantunwind"
        elif what & 0x80000000:
            kind = "inline"
        else:
            kind = "extab"
        raw.append((start, kind))
    raw.sort()
    out = []
    for i, (start, kind) in enumerate(raw):
        size = raw[i + 1][0] - start if i + 1 < len(raw) else 0
        out.append(ExidxEntry(start, size, kind))
    return out


def exidx_starts(entries: list[ExidxEntry]) -> list[ExidxEntry]:
    """The entries that name a function start: those with an unwind description (inline or in
    `.ARM.extab`). CANTUNWIND entries also mark leaf functions that a compiler found need no
    unwinding, but as many of them end the range before them (the sentinel after the last
    function, code without unwind information), so they are not taken on their own."""
    return [e for e in entries if e.kind != "cantunwind"]


def _thumb_push(h0: int, h1: int) -> bool:
    """`push {..., lr}` (16-bit) or `push.w`/`stmdb sp!, {..., lr}` (32-bit, neither sp nor pc in the list)."""
    return h0 & 0xFF00 == 0xB500 or (h0 == 0xE92D and h1 & 0x4000 != 0 and h1 & 0xA000 == 0)


def _arm_push(w: int) -> bool:
    """ARM `push {..., lr}` (`stmdb sp!`, neither sp nor pc in the list) or `str lr, [sp, #-4]!`."""
    return (w & 0xFFFF4000 == 0xE92D4000 and w & 0xA000 == 0) or w == 0xE52DE004


def _arm_test(w: int) -> bool:
    """An ARM `cmp`, `cmn`, `tst` or `teq` (register or immediate) with the "always" condition."""
    return w >> 28 == 0xE and (w >> 20) & 0xDF in (0x11, 0x13, 0x15, 0x17)


def guess_state(data: bytes, valid: Callable[[bool], int], order: str = "<") -> bool | None:
    """Is the code whose first bytes are `data` (instructions in byte order `order`) a Thumb
    function's entry (True), an ARM one's (False), or can the bytes not tell (None)?

    `valid(thumb)` is how many instructions decode from `data` in that state before an invalid
    one (at most 4). Rules, most telling first: an ARM `push {.., lr}` followed by ARM words
    (condition "always"); a Thumb `push {.., lr}` at the entry or after one 16-bit instruction;
    ARM words with the "always" condition up to an ARM return (`bx lr`, `pop {.., pc}`); an ARM
    push after one such word (`cmp r0, r1; push {r4, lr}`); four words that all carry the
    "always" condition and decode as ARM; an ARM test followed by a word predicated on it; Thumb
    when the first word would be a conditional ARM instruction (no ARM entry begins with one) and
    the bytes decode as Thumb; Thumb when they begin with `cbz`/`cbnz` and decode as Thumb; then
    the one state in which the bytes decode at all.
    """
    if len(data) < 16:
        return None
    h = struct.unpack_from(order + "8H", data)
    w = struct.unpack_from(order + "4I", data)
    always = sum(1 for x in w[1:] if x >> 28 in (0xE, 0xF))
    if _arm_push(w[0]) and always >= 2:
        return False
    if _thumb_push(h[0], h[1]) or (h[0] < 0xE800 and _thumb_push(h[1], h[2])):
        return True
    for i, x in enumerate(w):  # ARM words up to a return or branch, all with the "always" condition
        if x == 0xE12FFF1E or x & 0xFFFF8000 == 0xE8BD8000:
            if i:
                return False
            break
        if x >> 28 != 0xE:
            break
    arm_ok, thumb_ok = valid(False), valid(True)
    if w[0] >> 28 == 0xE and _arm_push(w[1]) and arm_ok >= 4:
        return False
    if always == 3 and w[0] >> 28 == 0xE and arm_ok >= 4:
        return False
    if _arm_test(w[0]) and w[1] >> 28 < 0xE and arm_ok >= 4:
        return False  # a test, then code predicated on it (`cmp r0, #0; ldrne r3, [r0]`)
    if w[0] >> 28 < 0xE and thumb_ok >= 4:
        return True  # an ARM entry does not begin with a conditional instruction
    if h[0] & 0xF500 == 0xB100 and thumb_ok >= 4:
        return True  # a Thumb null check first: `cbz r0, 1f` / `cbnz`
    if (arm_ok >= 4) != (thumb_ok >= 4):
        return thumb_ok >= 4
    return None


def decodes(md: cs.Cs, data: bytes, va: int) -> int:
    """How many of the first 4 instructions of `data` decode with the capstone decoder `md` (4 when
    a return or an unconditional branch comes first: what follows it is another function)."""
    n = 0
    for ins in md.disasm(data, va, 4):
        n += 1
        m, ops = ins.mnemonic, ins.op_str
        if m in ("bx", "b", "b.w") or (m.startswith("pop") and "pc" in ops) or (m == "ldm" and "pc" in ops):
            return 4
    return n


def seed_exidx_starts(
    image: Image,
    backend: Backend,
    explorer: Explorer,
    starts: list[int],
    noret: set[int],
    add: Callable[[int, str], int | None],
) -> dict[int, int]:
    """Add the function starts `.ARM.exidx` names (as `eh_frame` starts), each in its ARM/Thumb state;
    returns the ranges of those added (start -> bytes to the next entry).

    A range is not a function's extent: it runs over the literal pool and padding after the
    function, and the linker merges an entry into the one before when their unwind descriptions
    are the same, so it may cover two functions. It tells the heuristics where known functions are.

    The table does not say the state. Code reached from the other starts first (`starts`, walked
    now with the `noret` functions) decides it for the functions it calls (`bl` keeps the state,
    `blx` switches). The others are guessed from their first bytes (`guess_state`); when the bytes
    cannot tell, they take the state most of the table's called functions were decoded in (or the
    entry point's).
    """
    entries = exidx_starts(parse_exidx(image))
    if not entries or not is_capstone(backend):  # (ARM32 code: the capstone backend decodes it)
        return {}
    explorer.traverse(starts, noret)
    decided: dict[int, bool] = backend.decoded_thumb
    thumb: set[int] = backend.thumb
    votes = [decided[e.start] for e in entries if e.start in decided]
    prior = 2 * sum(votes) >= len(votes) if votes else bool(image.identity.entry & 1)
    order = "<" if image.code_endian == "little" else ">"
    md = backend.md
    added = {}
    for e in entries:
        va = e.start & ~1
        if va not in decided:
            data = image.read(va, 16) or b""

            def valid(thumb: bool, data: bytes = data, va: int = va) -> int:
                return decodes(md(thumb), data, va)

            state = guess_state(data, valid, order)
            if state is None:
                state = prior
            if state:
                thumb.add(va)
            else:
                thumb.discard(va)
        if add(va, "eh_frame") is not None and e.size > 0:
            added[va] = e.size
    return added


def starts_with_push(data: bytes, thumb: bool, order: str = "<") -> bool:
    """Do the bytes begin with a `push {..., lr}` in that state (Thumb: 16-bit or `push.w`; ARM:
    `push`/`stmdb sp!` followed by two words with the "always" condition, or `str lr, [sp, #-4]!`)?"""
    if len(data) < 16:
        return False
    if thumb:
        h0, h1 = struct.unpack_from(order + "2H", data)
        return _thumb_push(h0, h1)
    w = struct.unpack_from(order + "4I", data)
    return _arm_push(w[0]) and sum(1 for x in w[1:] if x >> 28 in (0xE, 0xF)) >= 2


# a `push {..., lr}` in little-endian code: Thumb 16-bit (b5xx), Thumb-2 `push.w` (e92d 4xxx) or
# ARM (e92d4xxx); sp and pc are not in the list
_PUSH_LE = re.compile(rb"[\x00-\xff]\xb5|\x2d\xe9[\x00-\xff][\x40-\x5f]|[\x00-\xff][\x40-\x5f]\x2d\xe9", re.DOTALL)


def gap_push(data: bytes, off: int, end: int, base: int) -> int | None:
    """The first function entry that begins with a `push {..., lr}` in `data[off:end]` (code at
    virtual address `base` + offset, little-endian instructions), as a code address whose bit 0
    says Thumb; None when there is none. Thumb candidates are halfword-aligned, ARM ones word-aligned;
    each must also pass `starts_with_push` in its state."""
    pos = off + (off & 1)
    while pos < end:
        m = _PUSH_LE.search(data, pos, end)
        if m is None:
            return None
        at = m.start()
        window = data[at : at + 16]
        arm = m.group()[2:] == b"\x2d\xe9"
        if arm:
            if at % 4 == 0 and starts_with_push(window, False):
                return base + at
        elif at % 2 == 0 and starts_with_push(window, True):
            return (base + at) | 1
        pos = at + 1
    return None
