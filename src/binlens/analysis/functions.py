"""Functions from bodies: basic blocks (chunks merged across returning calls), edges, extent."""

from __future__ import annotations

import bisect

from binlens.analysis.codemap import BODY, CodeMap
from binlens.analysis.discovery import Body, Explorer
from binlens.analysis.model import SOURCES, TERM_NAMES, BasicBlock, Edge, Function
from binlens.loader.image import Image

_ORDER = {s: i for i, s in enumerate(SOURCES)}
_MERGE_KINDS = ("fallthrough", "call_return")


def symbol_names(image: Image) -> dict[int, str]:
    """The symbol or export name at each address (function symbols first, globals before locals)."""
    arm = image.identity.arch == "arm"
    names: dict[int, str] = {}
    for s in sorted(image.symbols, key=lambda s: (s.kind != "function", s.binding == "local", s.name)):
        names.setdefault(s.address & ~1 if arm else s.address, s.name)
    for e in image.exports:
        names.setdefault(e.address & ~1 if arm else e.address, e.name)
    return names


def build_functions(
    image: Image,
    codemap: CodeMap,
    explorer: Explorer,
    bodies: dict[int, Body],
    starts: dict[int, set[str]],
    extents: dict[int, int],
    thunks: dict[int, str],
    noret: set[int],
) -> list[Function]:
    """One Function per body, in address order."""
    names = symbol_names(image)
    thumb = getattr(explorer.backend, "thumb", set())
    order = sorted(bodies)
    out = []
    for idx, f in enumerate(order):
        nxt = order[idx + 1] if idx + 1 < len(order) else 1 << 64
        blocks, edges = _blocks(codemap, explorer, f, bodies[f])
        size = extents.get(f) or _extent(f, blocks, nxt)
        srcs = tuple(sorted(starts.get(f, {"call"}), key=lambda s: _ORDER.get(s, 99)))
        out.append(
            Function(
                address=f,
                size=size,
                sources=srcs,
                blocks=blocks,
                edges=edges,
                symbol_name=names.get(f),
                thunk_name=thunks.get(f),
                noreturn=f in noret,
                calls=sorted(set(bodies[f].calls)),
                mode="thumb" if f in thumb else None,
            )
        )
    return out


def _blocks(codemap: CodeMap, explorer: Explorer, f: int, body: Body) -> tuple[list[BasicBlock], list[Edge]]:
    chunks = explorer.chunks
    starts = sorted(set(body.chunks))
    preds: dict[int, list[tuple[int, str]]] = {}
    succ_n: dict[int, int] = {}
    for s, d, kind in body.edges:
        preds.setdefault(d, []).append((s, kind))
        succ_n[s] = succ_n.get(s, 0) + 1
    owner: dict[int, int] = {}
    ends: dict[int, int] = {}
    terms: dict[int, int] = {}
    for a in starts:
        c = chunks[a]
        p = preds.get(a)
        if a != f and p and len(p) == 1 and p[0][1] in _MERGE_KINDS and succ_n.get(p[0][0]) == 1:
            src = p[0][0]
            if chunks[src][0] == a and src in owner:
                blk = owner[src]
                owner[a] = blk
                ends[blk] = c[0]
                terms[blk] = c[1]
                continue
        owner[a] = a
        ends[a] = c[0]
        terms[a] = c[1]
    blocks = []
    for b in sorted(ends):
        blocks.append(BasicBlock(b, ends[b], _count(codemap, b, ends[b]), TERM_NAMES[terms[b]]))
    edges = []
    seen = set()
    for s, d, kind in body.edges:
        if owner.get(d) != d:
            continue  # merged into its predecessor
        key = (owner[s], d, kind)
        if key not in seen:
            seen.add(key)
            edges.append(Edge(*key))
    edges.sort(key=lambda e: (e.src, e.dst))
    return blocks, edges


def _count(codemap: CodeMap, start: int, end: int) -> int:
    r = codemap.region(start)
    if r is None:
        return 0
    return (end - start) - r.state.count(BODY, start - r.va, end - r.va)


def _extent(f: int, blocks: list[BasicBlock], nxt: int) -> int:
    """Bytes from the entry to the end of the contiguous run of blocks that starts there."""
    i = bisect.bisect_left([b.start for b in blocks], f)
    if i >= len(blocks) or blocks[i].start != f:
        return 0
    end = blocks[i].end
    for b in blocks[i + 1 :]:
        if b.start >= nxt or b.start > end + 16:
            break
        end = max(end, b.end)
    return end - f
