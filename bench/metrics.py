"""Scoring of function starts: precision, recall and F1, per binary and micro-averaged."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class Score:
    """Counts of one comparison (or a sum of several); the ratios derive from them."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    def __add__(self, other: Score) -> Score:
        return Score(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn)

    @property
    def precision(self) -> float:
        """Share of predicted starts that are true starts (1.0 when nothing was predicted)."""
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        """Share of true starts that were predicted (1.0 when there is nothing to find)."""
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    @property
    def f1(self) -> float:
        """Harmonic mean of precision and recall."""
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


def in_ranges(addr: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether addr lies in one of the sorted, disjoint [start, end) ranges."""
    i = bisect_right(ranges, (addr, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= addr < ranges[i][1]


def score(
    truth: Iterable[int],
    predicted: Iterable[int],
    scope: list[tuple[int, int]] | None = None,
    neutral: Iterable[int] = (),
) -> Score:
    """Compare predicted function starts with the true ones.

    Predictions outside `scope` (e.g. PLT stubs, which have no FUNC symbol) and at `neutral` addresses
    (functions the ground truth knows but cannot size, such as crt's `_init`) are neither right nor wrong.
    """
    true = set(truth)
    ignore = set(neutral) - true
    ranges = sorted(scope) if scope is not None else None
    pred = {a for a in predicted if a not in ignore and (ranges is None or in_ranges(a, ranges))}
    tp = len(pred & true)
    return Score(tp=tp, fp=len(pred) - tp, fn=len(true) - tp)
