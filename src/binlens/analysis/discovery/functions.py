"""Functions from bodies: basic blocks (chunks merged across returning calls), edges, extent."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, cast

from binlens.analysis.codemap import BODY, CodeMap
from binlens.analysis.discovery.explorer import Explorer, _descent
from binlens.analysis.model import SOURCES, TERM_NAMES, BasicBlock, Body, Edge, Function, pack_calls, pairs
from binlens.loader.image import Image

if TYPE_CHECKING:
    from binlens.analysis.decode.backend import Backend

_ORDER = {s: i for i, s in enumerate(SOURCES)}
_SRC_DST = itemgetter(0, 1)
_c_merge = _descent.merge if _descent is not None else None  # `_blocks`'s merge in C


def symbol_names(image: Image) -> dict[int, str]:
    """The symbol or export name at each address (function symbols first, globals before locals)."""
    arm = image.identity.arch == "arm"
    names: dict[int, str] = {}
    for s in sorted(image.symbols, key=lambda s: (s.kind != "function", s.binding == "local", s.name)):
        names.setdefault(s.address & ~1 if arm else s.address, s.name)
    for e in image.exports:
        names.setdefault(e.address & ~1 if arm else e.address, e.name)
    return names


def iter_functions(
    image: Image,
    codemap: CodeMap,
    explorer: Explorer,
    bodies: dict[int, Body],
    starts: Mapping[int, frozenset[str]],
    extents: dict[int, int],
    thunks: dict[int, str],
    noret: set[int],
    consume: bool = False,
    part: tuple[int, int] | None = None,
) -> Iterator[Function]:
    """One Function per body, in address order, each built as it is asked for. With `consume`,
    each body is removed from `bodies` once its function is built, and so are its chunks from the
    explorer unless another body holds them too (their memory then serves the next functions'
    blocks). `part` (lo, hi) builds only the functions of the bodies at those places in address
    order (the places when the first function is asked for)."""
    names = symbol_names(image)
    literals: set[int] = getattr(explorer.backend, "literals", set())  # (ARM32 literal pool words)
    in_thumb = _thumb_test(explorer.backend)
    order = sorted(bodies)
    shared: set[int] = set()
    if consume:  # the chunks several bodies hold, in bits (a Counter of cc1's 1.3M would be 39 MiB)
        shared = _held_twice(codemap, bodies)
    lo, hi = part or (0, len(order))
    for f, nxt in zip(order[lo:hi], [*order[lo + 1 : hi + 1], 1 << 64], strict=False):  # (order may be empty)
        body = bodies.pop(f) if consume else bodies[f]
        blocks, edges = _blocks(codemap, explorer, f, body)
        if consume:
            explorer.forget_chunks(body.chunks, shared)
        ext = extents.get(f)  # (an unwind range or symbol size; one over the next start, such as the
        # linker's FDE over all of PowerPC's call stubs, ends there)
        size = min(ext, nxt - f) if ext else _extent(f, blocks, nxt, codemap, literals)
        srcs = tuple(sorted(starts.get(f, {"call"}), key=lambda s: _ORDER.get(s, 99)))
        yield Function(
            address=f,
            size=size,
            sources=srcs,
            blocks=blocks,
            edges=edges,
            symbol_name=names.get(f),
            thunk_name=thunks.get(f),
            noreturn=f in noret,
            calls=pack_calls([x for call in sorted(set(pairs(body.calls))) for x in call]),
            mode="thumb" if in_thumb(f) else None,
        )


def _held_twice(codemap: CodeMap, bodies: dict[int, Body]) -> set[int]:
    """The chunks that more than one body holds (a bit per code byte, `CodeMap.address_set`)."""
    once, twice = codemap.address_set(), codemap.address_set()
    first, again = once.add, twice.add
    for b in bodies.values():
        for a in b.chunks:
            if a in once:
                again(a)
            else:
                first(a)
    return twice


def _thumb_test(backend: Backend) -> Callable[[int], bool]:
    """Is the function at an address Thumb code? ARM32: the state its entry was decoded in (an entry
    that split a chunk has that chunk's state: the nearest decoding start at or below it)."""
    thumb: set[int] = getattr(backend, "thumb", set())  # (capstone's backend: ARM32 keeps these)
    decoded: dict[int, bool] = getattr(backend, "decoded_thumb", {})
    if not decoded:
        return thumb.__contains__
    starts = sorted(decoded)

    def test(f: int) -> bool:
        state = decoded.get(f)
        if state is None:
            i = bisect.bisect_right(starts, f) - 1
            state = decoded[starts[i]] if i >= 0 else f in thumb
        return state

    return test


def _blocks(codemap: CodeMap, explorer: Explorer, f: int, body: Body) -> tuple[list[BasicBlock], list[Edge]]:
    """Basic blocks (chunks merged across a single fall-through/call-return edge) and their edges."""
    if _c_merge is not None:  # the merge in C (`_descent.c`), the objects here
        spans, keys = _c_merge(explorer.chunks, f, body.chunks, body.edges)
        keys.sort(key=_SRC_DST)
        return _block_objects(codemap, spans), [Edge(s, d, k) for s, d, k in keys]
    chunks = explorer.chunks
    edges = cast("list[int | str]", body.edges)  # (every body has its edges once discovery ends)
    # body edges are flat (source, target, kind) triples
    srcs, dsts, kinds = cast("list[int]", edges[0::3]), cast("list[int]", edges[1::3]), cast("list[str]", edges[2::3])
    npred = Counter(dsts)  # counted and mapped at C speed
    succ_n = Counter(srcs)
    via = dict(zip(dsts, srcs, strict=True))  # source and kind of the (last) edge into each chunk
    via_kind = dict(zip(dsts, kinds, strict=True))
    owner: dict[int, int] = {}
    ends: dict[int, int] = {}
    terms: dict[int, int] = {}
    for a in sorted(body.chunks):  # a body lists each chunk once
        c = chunks[a]
        if npred.get(a) == 1 and a != f:
            src, kind = via[a], via_kind[a]
            if (kind == "fallthrough" or kind == "call_return") and succ_n[src] == 1 and chunks[src][0] == a:
                blk = owner.get(src)
                if blk is not None:
                    owner[a] = blk
                    ends[blk] = c[0]
                    terms[blk] = c[1]
                    continue
        owner[a] = a
        ends[a] = c[0]
        terms[a] = c[1]
    blocks = _block_objects(codemap, [(b, e, terms[b]) for b, e in ends.items()])  # (address order)
    own = owner.get
    # edges into merged chunks disappear; duplicates keep their first place (dict order)
    keys = list(dict.fromkeys([(owner[s], d, k) for s, d, k in zip(srcs, dsts, kinds, strict=True) if own(d) == d]))
    keys.sort(key=_SRC_DST)
    return blocks, [Edge(s, d, k) for s, d, k in keys]


def _block_objects(codemap: CodeMap, spans: list[tuple[int, int, int]]) -> list[BasicBlock]:
    """BasicBlocks of (start, end, terminator) spans, their instructions counted in the state map."""
    blocks = []
    r = None
    for b, e, t in spans:
        if r is None or not r.va <= b < r.end:
            r = codemap.region(b)
        n = 0 if r is None else (e - b) - r.state.count(BODY, b - r.va, e - r.va)
        blocks.append(BasicBlock(b, e, n, TERM_NAMES[t]))
    return blocks


def _extent(f: int, blocks: list[BasicBlock], nxt: int, codemap: CodeMap, literals: set[int]) -> int:
    """Bytes from the entry to the end of the contiguous run of blocks that starts there (across
    padding, and across data inside code: an inline `tbb`/`tbh` table, ARM literal pools)."""
    i = bisect.bisect_left([b.start for b in blocks], f)
    if i >= len(blocks) or blocks[i].start != f:
        return 0
    end = blocks[i].end
    for b in blocks[i + 1 :]:
        if b.start >= nxt or b.start > end + 16 and not _data_in_code(codemap, literals, end, b.start):
            break
        end = max(end, b.end)
    if literals:
        end = _past_pool(codemap, literals, end, nxt)
    return end - f


def _past_pool(codemap: CodeMap, literals: set[int], end: int, nxt: int) -> int:
    """ARM32: past the literal pool (and its padding) right after a function's last block."""
    r = codemap.region(end)
    if r is None:
        return end
    data, at, pooled = r.data, end, end
    while at < min(nxt, r.end):
        if at in literals:
            at += 4
            pooled = at
        elif data[at - r.va : at - r.va + 2] in (b"\x00\xbf", b"\x00\x00"):
            at += 2
        else:
            break
    return pooled


def _data_in_code(codemap: CodeMap, literals: set[int], lo: int, hi: int) -> bool:
    """Are the bytes [lo, hi) all data inside code: marked as no chunk's start (a table), words
    that pc-relative loads read (ARM literal pools), or Thumb padding (`nop`, zero halfwords)?"""
    r = codemap.region(lo)
    if r is None or hi > r.end or not literals and r.state.count(BODY, lo - r.va, hi - r.va) != hi - lo:
        return False
    state, data, o = r.state, r.data, lo - r.va
    while o < hi - r.va:
        if state[o] == BODY:
            o += 1
        elif r.va + o in literals:
            o += 4
        elif data[o : o + 2] in (b"\x00\xbf", b"\x00\x00"):
            o += 2
        else:
            return False
    return True
