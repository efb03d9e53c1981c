"""A set of address ranges with membership by bisect (cold fragments, switch tables, body spans)."""

from __future__ import annotations

import bisect


class IntervalSet:
    """Address ranges given as (start, size): `s(va)` tells whether `va` lies in one of them.

    The test looks only at the range that starts last at or before `va`, so with overlapping
    ranges an address past that range's end counts as outside. `ranges` keeps them as given,
    to build a larger set from."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        self.ranges = list(ranges)
        ranges = sorted(ranges)
        self.starts = [a for a, _ in ranges]
        self.ends = [a + n for a, n in ranges]

    def __call__(self, va: int) -> bool:
        i = bisect.bisect_right(self.starts, va) - 1
        return i >= 0 and va < self.ends[i]
