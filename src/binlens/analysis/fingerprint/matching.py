"""BinDiff-style matching of two programs' functions from their fingerprints.

The steps, each over the functions still unmatched: (1) names both programs give one function
each (symbols, exports, import thunks); (2) exact fingerprints unique on both sides; (3) string
sets and import sets unique on both sides; (4) propagation along the call graph from every match
(the unmatched callees and callers of a matched pair, mutual best scores); (5) fuzzy similarity of
candidates that share MinHash bands, best scores first; then propagation again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from binlens.analysis.fingerprint.features import shared_values, similarity
from binlens.analysis.fingerprint.model import EMPTY_BIN, Fingerprint

# the least similarity of a pair each step accepts
ANCHOR_MIN = 0.3  # a unique string or import set
PROPAGATE_MIN = 0.5  # mutual best among a matched pair's callees or callers
LONE_MIN = 0.4  # the one unmatched callee (or caller) on each side
FUZZY_MIN = 0.6  # candidates from shared MinHash bands
SMALL = 10  # instructions below which a function's features say little: fuzzy needs SMALL_MIN
SMALL_MIN = 0.85
# a mutual-best or fuzzy pair with a rival candidate scoring within this is taken only when it
# shares strictly more of its constants, strings and imports than every such rival
AMBIGUOUS = 0.02
NEIGHBOUR_WEIGHT = 0.25  # share of the fuzzy ranking given to agreeing matched callers and callees
_BAND = 2  # MinHash bins per LSH band
_MAX_BUCKET = 64  # a band bucket larger than this (boilerplate) adds no candidates


@dataclass(frozen=True, slots=True)
class Match:
    """A matched pair of functions: left and right entries, how they were matched, the score."""

    left: int
    right: int
    similarity: float
    step: str  # name | exact | strings | imports | callgraph | fuzzy

    @property
    def kind(self) -> str:
        """identical when the exact fingerprints agree, else changed."""
        return "identical" if self.similarity >= 1.0 else "changed"


class Matcher:
    """The matching of two programs' fingerprints (`run`)."""

    def __init__(self, left: Sequence[Fingerprint], right: Sequence[Fingerprint]) -> None:
        self.left = {f.address: f for f in left}
        self.right = {f.address: f for f in right}
        self.l2r: dict[int, Match] = {}
        self.r2l: dict[int, int] = {}
        self.l_callers = _callers(left)
        self.r_callers = _callers(right)
        self._queue: list[Match] = []
        self._l_order, self._r_order = sorted(self.left), sorted(self.right)
        self._l_index = {a: i for i, a in enumerate(self._l_order)}
        self._r_index = {a: i for i, a in enumerate(self._r_order)}

    # ------------------------------------------------------------------ steps
    def run(self, use_names: bool = True) -> list[Match]:
        """Every step in order; the matches by left address."""
        if use_names:
            self._unique_pairs(lambda f: f.name, "name", 0.0)
        self._unique_pairs(lambda f: f.exact, "exact", 1.0)
        self._unique_pairs(lambda f: f.strings or None, "strings", ANCHOR_MIN)
        self._unique_pairs(lambda f: f.imports if len(f.imports) > 1 else None, "imports", ANCHOR_MIN)
        self._propagate()
        self._fuzzy()
        self._propagate()
        return sorted(self.l2r.values(), key=lambda m: m.left)

    def _add(self, la: int, ra: int, step: str, score: float | None = None) -> None:
        if la in self.l2r or ra in self.r2l:
            return
        s = similarity(self.left[la], self.right[ra]) if score is None else score
        m = Match(la, ra, s, step)
        self.l2r[la] = m
        self.r2l[ra] = la
        self._queue.append(m)

    def _unique_pairs(self, key: Callable[[Fingerprint], Hashable | None], step: str, least: float) -> None:
        lk = _unique(key, (f for a, f in self.left.items() if a not in self.l2r))
        rk = _unique(key, (f for a, f in self.right.items() if a not in self.r2l))
        for k, la in lk.items():
            ra = rk.get(k)
            if ra is None:
                continue
            s = similarity(self.left[la], self.right[ra])
            if s >= least:
                self._add(la, ra, step, s)

    def _propagate(self) -> None:
        while self._queue:
            m = self._queue.pop()
            lf, rf = self.left[m.left], self.right[m.right]
            self._pair_up(
                [c for c in lf.callees if c in self.left and c not in self.l2r],
                [c for c in rf.callees if c in self.right and c not in self.r2l],
            )
            self._pair_up(
                [c for c in self.l_callers.get(m.left, ()) if c not in self.l2r],
                [c for c in self.r_callers.get(m.right, ()) if c not in self.r2l],
            )

    def _pair_up(self, ls: list[int], rs: list[int]) -> None:
        """Match a matched pair's unmatched neighbours: the lone one on each side, else mutual bests."""
        if not ls or not rs:
            return
        if len(ls) == 1 and len(rs) == 1:
            s = similarity(self.left[ls[0]], self.right[rs[0]])
            if s >= LONE_MIN:
                self._add(ls[0], rs[0], "callgraph", s)
            return
        if len(ls) * len(rs) > 4096:
            return
        scores = {(la, ra): similarity(self.left[la], self.right[ra]) for la in ls for ra in rs}
        best_l: dict[int, tuple[float, int]] = {}
        best_r: dict[int, tuple[float, int]] = {}
        for (la, ra), s in scores.items():  # (ties: the first in call order wins)
            if la not in best_l or s > best_l[la][0]:
                best_l[la] = (s, ra)
            if ra not in best_r or s > best_r[ra][0]:
                best_r[ra] = (s, la)
        for la, (s, ra) in best_l.items():
            if best_r[ra][1] != la or s < PROPAGATE_MIN:
                continue
            rivals = [(a, b) for (a, b), v in scores.items() if (a == la) != (b == ra) and v > s - AMBIGUOUS]
            if self._decided(la, ra, rivals):
                self._add(la, ra, "callgraph", s)

    def _fuzzy(self) -> None:
        buckets: dict[tuple[int, int, int], tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        for side, fps, taken in ((0, self.left, self.l2r), (1, self.right, self.r2l)):
            for a, f in fps.items():
                if a in taken:
                    continue
                mh = f.minhash
                for i in range(0, len(mh) - _BAND + 1, _BAND):
                    if mh[i] == EMPTY_BIN and mh[i + 1] == EMPTY_BIN:
                        continue
                    buckets[i, mh[i], mh[i + 1]][side].append(a)
        pairs: set[tuple[int, int]] = set()
        for ls, rs in buckets.values():
            if ls and rs and len(ls) * len(rs) <= _MAX_BUCKET * _MAX_BUCKET // 4:
                pairs.update((la, ra) for la in ls for ra in rs)
        scored = []
        for la, ra in pairs:
            lf, rf = self.left[la], self.right[ra]
            sim = similarity(lf, rf)
            least = FUZZY_MIN if min(lf.instructions, rf.instructions) >= SMALL else SMALL_MIN
            if sim >= least:
                scored.append((sim * (1 - NEIGHBOUR_WEIGHT) + self._neighbours(la, ra) * NEIGHBOUR_WEIGHT, sim, la, ra))
        scored.sort(key=lambda t: (-t[0], t[2], t[3]))
        by_l: dict[int, list[tuple[float, int]]] = defaultdict(list)
        by_r: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for rank, _sim, la, ra in scored:
            by_l[la].append((rank, ra))
            by_r[ra].append((rank, la))
        open_pairs = []
        for rank, sim, la, ra in scored:
            if la in self.l2r or ra in self.r2l:
                continue
            rivals = [(la, b) for r, b in by_l[la] if b != ra and b not in self.r2l and r > rank - AMBIGUOUS]
            rivals += [(a, ra) for r, a in by_r[ra] if a != la and a not in self.l2r and r > rank - AMBIGUOUS]
            if self._decided(la, ra, rivals):
                self._add(la, ra, "fuzzy", sim)
            else:
                open_pairs.append((sim, la, ra, rivals))
        # what the features leave open, the address order may settle: a pair whose functions follow
        # (or precede) a matched pair, when no rival pair does
        for sim, la, ra, rivals in open_pairs:
            if la in self.l2r or ra in self.r2l or not self._in_sequence(la, ra):
                continue
            if not any(self._in_sequence(a, b) for a, b in rivals if a not in self.l2r and b not in self.r2l):
                self._add(la, ra, "fuzzy", sim)

    def _in_sequence(self, la: int, ra: int) -> bool:
        """Whether the functions before `la` and `ra` in address order, or those after them, are a
        matched pair (sibling functions are laid out in source order)."""
        i, j = self._l_index[la], self._r_index[ra]
        for di in (-1, 1):
            if 0 <= i + di < len(self._l_order) and 0 <= j + di < len(self._r_order):
                m = self.l2r.get(self._l_order[i + di])
                if m is not None and m.right == self._r_order[j + di]:
                    return True
        return False

    def _decided(self, la: int, ra: int, rivals: list[tuple[int, int]]) -> bool:
        """Whether (la, ra) wins over rival pairs that score nearly as high (siblings such as
        template instances): by sharing strictly more constants, strings and imports than each."""
        if not rivals:
            return True
        mine = shared_values(self.left[la], self.right[ra]) or 0.0
        return all(mine > (shared_values(self.left[a], self.right[b]) or 0.0) for a, b in rivals)

    def _neighbours(self, la: int, ra: int) -> float:
        """How far the matched callers and callees of `la` are those of `ra` (Jaccard; 0.5 when
        neither has a matched neighbour)."""
        lf, rf = self.left[la], self.right[ra]
        mine = {self.l2r[c].right for c in (*lf.callees, *self.l_callers.get(la, ())) if c in self.l2r}
        theirs = {c for c in (*rf.callees, *self.r_callers.get(ra, ())) if c in self.r2l}
        union = mine | theirs
        return len(mine & theirs) / len(union) if union else 0.5


def _unique(key: Callable[[Fingerprint], Hashable | None], fps: Iterable[Fingerprint]) -> dict[Hashable, int]:
    """key -> address for the keys exactly one fingerprint has (None keys left out)."""
    seen: dict[Hashable, int | None] = {}
    for f in fps:
        k = key(f)
        if k is None:
            continue
        seen[k] = None if k in seen else f.address
    return {k: a for k, a in seen.items() if a is not None}


def _callers(fps: Iterable[Fingerprint]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for f in fps:
        for c in f.callees:
            out[c].append(f.address)
    return out


def match_functions(left: Sequence[Fingerprint], right: Sequence[Fingerprint], use_names: bool = True) -> list[Match]:
    """The matched pairs of two programs' functions, by left address (`Matcher.run`)."""
    return Matcher(left, right).run(use_names)
