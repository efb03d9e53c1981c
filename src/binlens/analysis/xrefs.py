"""Cross-references: code flow, data reads/writes/address-taking, data pointers, strings."""

from __future__ import annotations

import bisect
import struct
from itertools import chain

from binlens.analysis.codemap import CodeMap
from binlens.analysis.discovery import Body, Explorer
from binlens.analysis.model import XREF_KINDS, StringItem, Xref
from binlens.analysis.strings import is_data_section
from binlens.loader.image import Image

_RETAG = {"read", "offset", "pointer"}


def collect_xrefs(
    image: Image,
    codemap: CodeMap,
    backend: object,
    explorer: Explorer,
    bodies: dict[int, Body],
    strings: list[StringItem] | set[int],
    jt_tables: dict[int, int],
    data: bool = True,
) -> list[Xref]:
    """Every reference from reached code (and from data unless `data` is false), sorted by (src, dst)."""
    chunks = explorer.chunks
    # chunk starts of all bodies, in order (a chunk shared by bodies repeats: bisect still works)
    reached = sorted(chain.from_iterable(body.chunks for body in bodies.values()))
    ends = [chunks[a][0] for a in reached]
    # a list, not a set: sorted once, repeats then sit together and are dropped (less memory)
    keys: list[tuple[int, int, str]] = []
    add = keys.append
    b = backend
    kinds = XREF_KINDS
    bisect_right = bisect.bisect_right
    for src, dst, k in zip(b.x_src, b.x_dst, b.x_kind, strict=False):  # type: ignore[attr-defined]
        i = bisect_right(reached, src) - 1
        if i >= 0 and src < ends[i]:
            add((src, dst, kinds[k]))
    for body in bodies.values():
        for site, callee in body.calls:
            add((site, callee, "call"))
        for site, callee in body.tails:
            add((site, callee, "tail_call"))
        it = iter(body.edges)
        for s, d, kind in zip(it, it, it, strict=True):
            if kind == "jump" or kind == "conditional_taken":
                add((chunks[s][3], d, "jump"))
            elif kind == "jump_table":
                add((chunks[s][3], d, "jump_table"))
    for jump, table in jt_tables.items():
        i = bisect_right(reached, jump) - 1
        if i >= 0 and jump < ends[i]:
            add((jump, table, "read"))
    str_starts = strings if isinstance(strings, set) else {s.address for s in strings}
    if data:
        thumb_bit = 1 if image.identity.arch == "arm" else 0
        for src, dst in pointers_in_data(image, codemap, str_starts):
            if dst & thumb_bit and codemap.contains(dst):
                dst &= ~1  # a pointer to Thumb code names the instruction (the function's start) at the even address
            add((src, dst, "pointer"))
    keys.sort()
    n = 0
    prev = None
    retag = False
    for t in keys:
        if t != prev:
            prev = t
            if t[2] in _RETAG and t[1] in str_starts:  # a reference to the start of a string
                t = (t[0], t[1], "string")
                retag = True
            keys[n] = t
            n += 1
    del keys[n:]
    if retag:
        keys.sort()  # nearly sorted already
    for i, (src, dst, kind) in enumerate(keys):  # in place: each tuple is freed as its Xref replaces it
        keys[i] = Xref(src, dst, kind)  # type: ignore[call-overload]
    return keys  # type: ignore[return-value]


def pointers_in_data(image: Image, codemap: CodeMap, targets: set[int]) -> list[tuple[int, int]]:
    """(data address, target) for aligned words and relative relocations naming code or a string.

    A position-independent ELF (one with `*_RELATIVE` relocations, or MIPS `R_MIPS_REL32`) holds an address in data only
    where a relocation puts one: there the other words are numbers (`1000000` is not a pointer to
    0xf4240), and only the words at relocations count.
    """
    if not targets and codemap.data_pointers is not None:
        return codemap.data_pointers  # (the same list each time: callers only read it)
    ptr = 8 if image.identity.bits == 64 else 4
    endian = "<" if image.identity.endian == "little" else ">"
    code = "Q" if ptr == 8 else "I"
    out: dict[int, int] = {}
    contains = codemap.contains
    lo = min((r.va for r in codemap.regions), default=0)  # most words lie outside all code: one compare
    hi = max((r.end for r in codemap.regions), default=0)
    places: set[int] | None = None
    if image.identity.format == "ELF" and any(
        (r.type.endswith("_RELATIVE") and not r.type.endswith("IRELATIVE")) or r.type == "MIPS_REL32"
        for r in image.relocations
    ):
        places = {r.address for r in image.relocations}
    for s in image.sections:
        if not is_data_section(image, s):
            continue
        data = bytes(image.data[s.offset : s.offset + min(s.fsize, s.size)])
        pad = (-s.va) % ptr
        n = (len(data) - pad) // ptr
        if n <= 0:
            continue
        for k, v in enumerate(struct.unpack_from(f"{endian}{n}{code}", data, pad)):
            if v and (v in targets or (lo <= v < hi and contains(v))):
                at = s.va + pad + k * ptr
                if places is None or at in places:
                    out[at] = v
    word = struct.Struct(f"{endian}{code}")
    for r in image.relocations:
        if "RELATIVE" not in r.type:
            continue
        v = r.addend
        if not v:  # REL relocations (ARM, i386): the addend is the word at the place (a GOT entry, say)
            raw = image.read(r.address, ptr)
            v = word.unpack(raw)[0] if raw is not None and len(raw) == ptr else 0
        if v and (v in targets or codemap.contains(v)):
            out[r.address] = v
    found = sorted(out.items())
    if not targets:
        codemap.data_pointers = found
    return found
