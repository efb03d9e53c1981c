"""Cross-references: code flow, data reads/writes/address-taking, data pointers, strings."""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Iterable
from itertools import chain

from binlens.analysis.arch.profiles import profile
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode.backend import Backend
from binlens.analysis.discovery.explorer import Explorer
from binlens.analysis.model import XREF_KINDS, Body, FoundString, Refs, edge_triples, pairs
from binlens.analysis.native.kernels import native
from binlens.analysis.refs.strings import is_data_section, readable_size
from binlens.loader.image import Image

_RETAG = {"read", "offset", "pointer"}
_CALL, _JUMP, _JUMP_TABLE, _TAIL_CALL, _READ, _POINTER = map(
    XREF_KINDS.index, ("call", "jump", "jump_table", "tail_call", "read", "pointer")
)
# for `_descent.sort_refs`: each kind code's place among the kinds' names; what a kind becomes when it
# names a string's start (255: stays)
_RANK = bytes(sorted(XREF_KINDS).index(k) for k in XREF_KINDS).ljust(256, b"\0")
_RETAG_TO = bytes(XREF_KINDS.index("string") if k in _RETAG else 255 for k in XREF_KINDS).ljust(256, b"\xff")
_descent = native("_descent")  # `_order`'s sort in C (`sort_refs`), or None
_WORDS = 1 << 14  # data words unpacked at a time by `pointers_in_data`


def collect_refs(
    image: Image,
    codemap: CodeMap,
    backend: Backend,
    explorer: Explorer,
    bodies: dict[int, Body],
    strings: list[FoundString] | set[int],
    jt_tables: dict[int, int],
    data: bool = True,
) -> Refs:
    """Every reference from reached code (and from data unless `data` is false), sorted by (src, dst),
    packed (`Refs`: three arrays instead of an object each; `Refs.xrefs()` gives the objects)."""
    chunks = explorer.chunks
    # chunk starts of all bodies, in order (a chunk shared by bodies repeats: bisect still works);
    # a chunk's end is read where a reference asks (a list of every chunk's end would be 16 MiB on cc1)
    reached = sorted(chain.from_iterable(body.chunks for body in bodies.values()))
    src: array = array("Q")
    dst: array = array("Q")
    kind = bytearray()
    add_src, add_dst, add_kind = src.append, dst.append, kind.append
    b = backend
    bisect_right = bisect.bisect_right
    for s, d, k in zip(b.x_src, b.x_dst, b.x_kind, strict=False):
        i = bisect_right(reached, s) - 1
        if i >= 0 and s < chunks[reached[i]][0]:
            add_src(s)
            add_dst(d)
            add_kind(k)
    for body in bodies.values():
        for site, callee in pairs(body.calls):
            add_src(site)
            add_dst(callee)
            add_kind(_CALL)
        for site, callee in body.tails:
            add_src(site)
            add_dst(callee)
            add_kind(_TAIL_CALL)
        for s, d, edge in edge_triples(body.edges or []):
            if edge == "jump" or edge == "conditional_taken":
                add_src(chunks[s][3])
                add_dst(d)
                add_kind(_JUMP)
            elif edge == "jump_table":
                add_src(chunks[s][3])
                add_dst(d)
                add_kind(_JUMP_TABLE)
    for jump, table in jt_tables.items():
        i = bisect_right(reached, jump) - 1
        if i >= 0 and jump < chunks[reached[i]][0]:
            add_src(jump)
            add_dst(table)
            add_kind(_READ)
    del reached
    str_starts = strings if isinstance(strings, set) else {s.address for s in strings}
    if data:
        thumb_bit = profile(image.identity.arch).thumb_bit
        for at, d in _code_and_string_pointers(image, codemap, str_starts):
            if d & thumb_bit and codemap.contains(d):
                d &= ~1  # a pointer to Thumb code names the instruction (the function's start) at the even address
            add_src(at)
            add_dst(d)
            add_kind(_POINTER)
    refs = Refs(src, dst, kind)
    _order(refs, str_starts)
    return refs


def _code_and_string_pointers(image: Image, codemap: CodeMap, str_starts: set[int]) -> Iterable[tuple[int, int]]:
    """`pointers_in_data(image, codemap, str_starts)`, in no particular order, from the code pointers
    found once and a scan for the string pointers alone (scanning for both again would hold a dict and a
    list of every pointer: ~50 MiB on gcc's cc1). Where both name a place, a relocation named a
    string there last: the string pointer is the one `pointers_in_data` gives."""
    if not str_starts:
        return pointers_in_data(image, codemap, str_starts)
    to_strings = dict(pointers_in_data(image, codemap, str_starts, code=False))
    code = ((at, d) for at, d in pairs(data_pointer_words(image, codemap)) if at not in to_strings)
    return chain(code, to_strings.items())


def _order(refs: Refs, str_starts: set[int]) -> None:
    """Sort `refs` as (src, dst, kind name) tuples sort, drop repeats, and make a read, offset or
    pointer reference to the start of a string a "string" reference (then sort again)."""
    if _descent is not None:  # the same in C, on the arrays in place
        n = _descent.sort_refs((refs.src, refs.dst, refs.kind), _RANK, _RETAG_TO, array("Q", sorted(str_starts)))
        del refs.src[n:], refs.dst[n:], refs.kind[n:]
        return
    keys = sorted(zip(refs.src, refs.dst, map(XREF_KINDS.__getitem__, refs.kind), strict=True))
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
    code = XREF_KINDS.index
    refs.src = array("Q", [t[0] for t in keys])
    refs.dst = array("Q", [t[1] for t in keys])
    refs.kind = bytearray(code(t[2]) for t in keys)


def data_pointer_words(image: Image, codemap: CodeMap) -> array:
    """`pointers_in_data(image, codemap, set())` as the flat words it is kept in: (data address,
    code address) pairs, by address."""
    words = codemap.data_pointers
    if words is None:  # (computed once: the same words each time)
        found = _pointers(image, codemap, set(), True)
        # kept flat and packed, made without a list of pairs (gcc's cc1: 246k pointers, 29 MiB as a
        # list of pairs, 3.8 MiB as words)
        words = array("Q")
        for at in sorted(found):
            words.append(at)
            words.append(found[at])
        codemap.data_pointers = words
    return words


def pointers_in_data(image: Image, codemap: CodeMap, targets: set[int], code: bool = True) -> Iterable[tuple[int, int]]:
    """(data address, target) for aligned words and relative relocations naming code or one of
    `targets` (without `code`: only `targets`, as the words naming code would then be dropped),
    in address order.

    A position-independent ELF (one with `*_RELATIVE` relocations, or MIPS `R_MIPS_REL32`) holds an address in data only
    where a relocation puts one: there the other words are numbers (`1000000` is not a pointer to
    0xf4240), and only the words at relocations count.
    """
    if code and not targets:
        return pairs(data_pointer_words(image, codemap))
    return sorted(_pointers(image, codemap, targets, code).items())


def _pointers(image: Image, codemap: CodeMap, targets: set[int], code: bool) -> dict[int, int]:
    """`pointers_in_data`'s scan (data address -> value); without `code`, a word naming code is not
    kept (where a relocation names code, a word it overrides is dropped, as `pointers_in_data`
    would replace it)."""
    ptr = 8 if image.identity.bits == 64 else 4
    endian = "<" if image.identity.endian == "little" else ">"
    fmt = "Q" if ptr == 8 else "I"
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
    word = struct.Struct(f"{endian}{fmt}")
    view = memoryview(image.data)  # (a view's slices copy nothing)
    at_places = sorted(places) if places is not None else None
    for s in image.sections:
        if not is_data_section(image, s):
            continue
        data = view[s.offset : s.offset + readable_size(s)]
        pad = (-s.va) % ptr
        n = (len(data) - pad) // ptr
        if n <= 0:
            continue
        base = s.va + pad
        if at_places is not None:  # only the words at relocations count: read just those
            i = bisect.bisect_left(at_places, base)
            j = bisect.bisect_left(at_places, base + n * ptr)
            for at in at_places[i:j]:
                k = at - base
                if k % ptr == 0:
                    (v,) = word.unpack_from(data, pad + k)
                    if v and (v in targets or (code and lo <= v < hi and contains(v))):
                        out[at] = v
            continue
        # a block of words at a time: one tuple of a whole section's words would be the largest
        # transient of the engine on big programs (gcc's cc1: +79 MiB while computed-goto tables are looked for)
        for k0 in range(0, n, _WORDS):
            m = min(_WORDS, n - k0)
            at = base + k0 * ptr
            for v in struct.unpack_from(f"{endian}{m}{fmt}", data, pad + k0 * ptr):
                if v and (v in targets or (code and lo <= v < hi and contains(v))):
                    out[at] = v
                at += ptr
    for r in image.relocations:
        if "RELATIVE" not in r.type:
            continue
        v = r.addend
        if not v:  # REL relocations (ARM, i386): the addend is the word at the place (a GOT entry, say)
            raw = image.read(r.address, ptr)
            v = word.unpack(raw)[0] if raw is not None and len(raw) == ptr else 0
        if v and (v in targets or (code and codemap.contains(v))):
            out[r.address] = v
        elif v and codemap.contains(v):
            out.pop(r.address, None)
    return out
