"""Function bodies, recomputed only where something they depend on changed.

`Explorer.partition` runs after every descent and again after each batch of new tail-call starts
(gap heuristics on a stripped ARM Mach-O call it thousands of times). A body depends on its start's
successor in address order (`nxt`), on the starts its walk reached (`seen`) or ran into (`hits`),
on the chunks it holds (split when another start lands inside one), on the returning status of its
callees, and on the fragment index. Inverted indexes from each of those to the functions that depend
on it give the bodies to recompute directly, instead of testing every function's cache entry on
every call; everything else is reused from the last call. The chunks a walk saw are indexed by
page, not one by one (the per-chunk index was the largest: 1.3M entries on gcc's cc1).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from binlens.analysis.model import Body, pack_calls

if TYPE_CHECKING:
    from binlens.analysis.discovery.explorer import Explorer

Index = dict[int, "int | set[int]"]  # key -> the function depending on it (a set when several do)


def _add(index: Index, keys: Iterable[int], f: int) -> None:
    for a in keys:
        o = index.get(a)
        if o is None:
            index[a] = f
        elif isinstance(o, set):
            o.add(f)
        elif o != f:
            index[a] = {o, f}


def _remove(index: Index, keys: Iterable[int], f: int) -> None:
    for a in keys:
        o = index.get(a)
        if o is None:
            continue
        if isinstance(o, set):
            o.discard(f)
            if len(o) == 1:
                index[a] = next(iter(o))
            elif not o:
                del index[a]
        elif o == f:
            del index[a]


_PAGE = 10  # `seen_by` is kept per 1 KiB page of addresses: one entry per chunk was the largest index


def _pages(chunks: Iterable[int]) -> set[int]:
    return {a >> _PAGE for a in chunks}


def _saw(seen: tuple[int, ...], keys: set[int]) -> bool:
    """Is one of `keys` in `seen` (sorted)? Each of the fewer looked up in the other."""
    if len(keys) > len(seen):
        return not keys.isdisjoint(seen)
    for a in keys:
        i = bisect.bisect_left(seen, a)
        if i < len(seen) and seen[i] == a:
            return True
    return False


def _owners(index: Index, keys: Iterable[int], out: set[int]) -> None:
    get = index.get
    for a in keys:
        o = get(a)
        if o is None:
            continue
        if isinstance(o, set):
            out.update(o)
        else:
            out.add(o)


class Partitioner:
    """The body cache of one Explorer and its inverted indexes."""

    def __init__(self) -> None:
        self.cache: dict[int, tuple] = {}  # f -> (nxt, body, seen, hits, callees, found)
        self.bodies: dict[int, Body] = {}
        self.found: dict[int, set[int]] = {}  # f -> the tail-call starts its body found (non-empty only)
        self.order: list[int] = []  # the starts of the last call, sorted
        self.starts: set[int] = set()
        self.noret: set[int] = set()
        self.key: tuple[int, int] = (0, 0)
        self.extents: dict[int, int] = {}  # the last call's extents and fragment test (for `walk`)
        self.fragments: Callable[[int], bool] = bool
        self.seen_by: Index = {}
        self.hit_by: Index = {}
        self.called_by: Index = {}

    def _forget(self, f: int) -> None:
        hit = self.cache.pop(f, None)
        if hit is not None:
            _remove(self.seen_by, _pages(hit[2]), f)
            _remove(self.hit_by, hit[3], f)
            _remove(self.called_by, hit[4], f)
        self.found.pop(f, None)

    def walk(self, ex: Explorer, f: int) -> Body:
        """`f`'s body walked again with the last call's inputs, its edges recorded: the walk that
        gave the cached body (one is reused only while what it depends on is unchanged)."""
        nxt = self.cache[f][0] if f in self.cache else 1 << 64
        return ex.walk_body(f, nxt, self.extents.get(f), self.starts, self.fragments, self.noret, edges=True)[0]

    def run(
        self,
        ex: Explorer,
        starts: set[int],
        extents: dict[int, int],
        fragments: Callable[[int], bool],
        noret: set[int],
        dirty: set[int],
        accept: Callable[[int], bool] | None = None,
    ) -> tuple[dict[int, Body], set[int]]:
        """(each start's body, the new starts found as tail-call targets), as `Explorer.partition`.

        With `accept`, the tail-call starts it accepts are added to `starts` and partitioned in turn
        until none is new; the second value is then the starts so added. Each turn costs what its
        new starts change: the set differences over every start are taken once, not once a turn
        (a stripped ARM Mach-O gains its tail-call starts a few at a time over dozens of turns)."""
        stale: set[int] = set()
        force: set[int] = set()
        if self.key != (id(fragments), id(extents)):
            # new fragments (demoted cold parts) only change bodies that ran into them
            force.update(f for f, hit in self.cache.items() if any(fragments(x) for x in (*hit[3], *hit[5])))
            stale |= force
            self.key = (id(fragments), id(extents))
        added = starts - self.starts
        removed = self.starts - starts
        noret_changed = noret ^ self.noret
        self.starts = set(starts)
        self.noret = set(noret)
        self.extents, self.fragments = extents, fragments
        self._pass(ex, extents, fragments, dirty, added, removed, noret_changed, stale, force)
        new: set[int] = set()
        for found in self.found.values():
            new |= found
        if accept is None:
            return dict(self.bodies), new
        grown: set[int] = set()
        new = {s for s in new if s not in self.starts and accept(s)}
        while new:
            grown |= new
            self.starts |= new
            redone = self._pass(ex, extents, fragments, set(), new, set(), set(), set(), set())
            # a start found by a body not walked again was accepted or refused in an earlier turn
            new = {s for f in redone for s in self.found.get(f, ()) if s not in self.starts and accept(s)}
        return dict(self.bodies), grown

    def _pass(
        self,
        ex: Explorer,
        extents: dict[int, int],
        fragments: Callable[[int], bool],
        dirty: set[int],
        added: set[int],
        removed: set[int],
        noret_changed: set[int],
        stale: set[int],
        force: set[int],
    ) -> list[int]:
        """Walk again the bodies the changes make stale (`self.starts` and `self.noret` are the new
        ones already); the functions walked again."""
        starts, noret, order = self.starts, self.noret, self.order
        for s in removed:
            del order[bisect.bisect_left(order, s)]
            self.bodies.pop(s, None)
            self._forget(s)
        for s in sorted(added):
            bisect.insort(order, s)
        dirty = dirty | added
        if dirty:  # the functions whose walk saw a dirty chunk: those with a chunk on its page, then exactly
            near: set[int] = set()
            _owners(self.seen_by, _pages(dirty), near)
            stale.update(f for f in near if _saw(self.cache[f][2], dirty))
        _owners(self.hit_by, removed, stale)
        _owners(self.called_by, noret_changed, stale)
        for s in added | removed:  # the start before each changed one has a new `nxt`
            i = bisect.bisect_left(order, s) - 1
            if i >= 0:
                stale.add(order[i])
        stale |= added
        stale &= starts
        n = len(order)
        redone: list[int] = []
        for f in stale:
            i = bisect.bisect_right(order, f)
            nxt = order[i] if i < n else 1 << 64
            hit = self.cache.get(f)
            unchanged = hit is not None and hit[0] == nxt and not _depends(hit, dirty, removed, noret_changed)
            if unchanged and f not in force:
                continue  # (a neighbour whose successor did not change after all)
            self._forget(f)
            b, walked, hit_set, found = ex.walk_body(f, nxt, extents.get(f), starts, fragments, noret)
            # kept as tuples: only iterated (or binary-searched) from here on, at far less memory than sets
            seen, hits, callees = tuple(sorted(walked)), tuple(hit_set), pack_calls(sorted(set(b.calls[1::2])))
            self.cache[f] = (nxt, b, seen, hits, callees, tuple(found))
            _add(self.seen_by, _pages(seen), f)
            _add(self.hit_by, hits, f)
            _add(self.called_by, callees, f)
            if found:
                self.found[f] = found
            self.bodies[f] = b
            redone.append(f)
        return redone


def _depends(hit: tuple, dirty: set[int], removed: set[int], noret_changed: set[int]) -> bool:
    return bool(
        (dirty and _saw(hit[2], dirty))
        or (removed and not removed.isdisjoint(hit[3]))
        or (noret_changed and not noret_changed.isdisjoint(hit[4]))
    )
