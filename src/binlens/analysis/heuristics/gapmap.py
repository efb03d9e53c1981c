"""The gap heuristic's coverage (`Gaps`): which code bytes some function's chunks hold, counted
between the heuristic's rounds and made into a map for each, and the code addresses reached
instructions take."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from binlens.analysis.codemap import CodeMap
from binlens.analysis.heuristics.prologues import GapPrologues
from binlens.analysis.model import XREF_KINDS, Body
from binlens.analysis.native.kernels import native

if TYPE_CHECKING:
    from binlens.analysis.decode.backend import Backend
    from binlens.analysis.discovery.explorer import Explorer

_K_OFFSET = XREF_KINDS.index("offset")
_descent = native("_descent")  # `cover` and `body_spans` in C (same results), or None


class Gaps:
    """The gap heuristic's coverage of code by functions, kept up to date between its rounds.

    It counts per chunk the bodies that hold it, and each round counts again only the bodies that
    changed since the last one (partition hands back the same Body object when a body did not
    change). Each round's map, a byte per code byte that is 1 inside a chunk some body holds, is made
    anew from the held chunks (`covered`; in C, from their bits) and is the round's to mark further;
    nothing keeps it between rounds. Keeping it, and handing each round a copy, held two bytes per
    byte of code through the heuristics (gcc's cc1: 2 x 20 MiB), and a chunk that shares bytes with
    another (code entered at a misaligned address, a RISC-V instruction decoded across another's
    halves, a MIPS delay slot that starts another chunk) needed laying over the copy, where a map
    made from the held chunks is their union as it is.
    """

    def __init__(self, codemap: CodeMap, explorer: Explorer) -> None:
        self.codemap = codemap
        self.explorer = explorer
        # the chunks some body holds (a bit each with the C extension), and how many hold those that
        # more than one does: a Counter of every held chunk would be 40 MiB on gcc's cc1
        self.held = codemap.address_set()
        self.more: dict[int, int] = {}
        self.bodies: dict[int, Body] = {}
        self.memo: dict[int, dict[int, tuple[int, bool, int] | None]] = {}
        self._refs: list[tuple[int, int]] = []
        self.after_data = False  # set once the data-pointer stages have run (ARM32 leaf guesses wait for it)
        self._refs_upto = 0
        self.prologues: GapPrologues | None = None  # MIPS, PowerPC, RISC-V: the image's prologue tests

    def offset_refs(self, backend: Backend) -> list[tuple[int, int]]:
        """(instruction, code address) of the address-taking references not yet looked at: those
        decoded since the last call join the ones whose instruction no function reached yet (the
        caller keeps in the list what it leaves for later)."""
        n = len(backend.x_kind)
        if n > self._refs_upto:
            self._refs += offset_refs_from(backend, self.codemap, self._refs_upto)
            self._refs_upto = n
        return self._refs

    def covered(self, bodies: dict[int, Body]) -> dict[int, bytearray]:
        """Per region, the coverage of `bodies`: a new map, which the caller may mark further."""
        hold, release = self._hold, self._release
        old = self.bodies
        for f, b in old.items():
            nb = bodies.get(f)
            if nb is b:
                continue
            if nb is None:
                for a in b.chunks:
                    release(a)
            else:  # a recomputed body mostly holds the same chunks: count only the difference
                was, now = set(b.chunks), set(nb.chunks)
                for a in was - now:
                    release(a)
                for a in now - was:
                    hold(a)
        for f, b in bodies.items():
            if f not in old:
                for a in b.chunks:
                    hold(a)
        self.bodies = dict(bodies)
        maps = {r.va: bytearray(len(r.data)) for r in self.codemap.regions}
        cover(self.codemap, maps, self.explorer, self.held)
        return maps

    def _hold(self, a: int) -> None:
        """One more body holds chunk `a`."""
        if a in self.held:
            self.more[a] = self.more.get(a, 1) + 1
        else:
            self.held.add(a)

    def _release(self, a: int) -> None:
        """One body less holds chunk `a` (one did)."""
        n = self.more.get(a)
        if n is None:
            self.held.discard(a)
        elif n == 2:
            del self.more[a]
        else:
            self.more[a] = n - 1


def offset_refs_from(backend: Backend, codemap: CodeMap, start: int) -> list[tuple[int, int]]:
    """(src, dst) of the `offset` references from index `start` on whose target is code."""
    b = backend
    kinds = b.x_kind
    out = []
    contains = codemap.contains
    takes = getattr(b, "takes_address", None)  # x86: only lea and mov/push of an address count
    i = kinds.find(_K_OFFSET, start)
    while i >= 0:
        dst = b.x_dst[i]
        src = b.x_src[i]
        if contains(dst) and (takes is None or takes(src)):
            out.append((src, dst))
        i = kinds.find(_K_OFFSET, i + 1)
    return out


def covered_maps(codemap: CodeMap, explorer: Explorer, bodies: dict[int, Body]) -> dict[int, bytearray]:
    """Per code region, 1 for each byte inside a chunk of some function: the map `Gaps` keeps, built
    from scratch (what the tests check it against)."""
    maps = {r.va: bytearray(len(r.data)) for r in codemap.regions}
    cover(codemap, maps, explorer, set().union(*(b.chunks for b in bodies.values())))
    return maps


def cover(codemap: CodeMap, maps: dict[int, bytearray], explorer: Explorer, chunks: Iterable[int]) -> None:
    """Set the bytes of `chunks` in `maps` to 1: chunks in address order, adjacent ones as one run."""
    if _descent is not None:  # the same marks in C, a chunk at a time
        regions = codemap.regions
        _descent.cover(
            explorer.chunks, chunks, [r.va for r in regions], [r.end for r in regions], [maps[r.va] for r in regions],
        )  # fmt: skip
        return
    get = explorer.chunks.get
    r = None
    m = bytearray()
    base = rend = 0
    lo = hi = -1  # the current run, as offsets into m
    for a in sorted(chunks):
        c = get(a)
        if c is None:
            continue
        if r is None or not base <= a < rend:
            if hi > lo:
                m[lo:hi] = b"\x01" * (hi - lo)
            lo = hi = -1
            r = codemap.region(a)
            if r is None:
                continue
            m = maps[r.va]
            base, rend = r.va, r.end
        o = a - base
        e = min(c[0], rend) - base
        if e <= o:
            continue
        if lo <= o <= hi:
            if e > hi:
                hi = e
        else:
            if hi > lo:
                m[lo:hi] = b"\x01" * (hi - lo)
            lo, hi = o, e
    if hi > lo:
        m[lo:hi] = b"\x01" * (hi - lo)


def body_spans(explorer: Explorer, bodies: dict[int, Body]) -> list[tuple[int, int]]:
    """(entry, size) of the contiguous run of blocks from each function's entry."""
    if _descent is not None:  # the same runs in C
        return _descent.body_spans(explorer.chunks, bodies)
    out = []
    chunks = explorer.chunks
    for f, b in bodies.items():
        end = f
        for a in sorted([a for a in b.chunks if a >= f and a in chunks]):
            if a > end + 16:
                break
            e = chunks[a][0]
            if e > end:
                end = e
        if end > f:
            out.append((f, end - f))
    return out
