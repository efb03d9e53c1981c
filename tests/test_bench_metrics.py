"""The benchmark's scoring of function starts (bench/metrics.py) on hand-checked cases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_metrics", Path(__file__).parents[1] / "bench" / "metrics.py")
metrics = importlib.util.module_from_spec(_spec)
sys.modules["bench_metrics"] = metrics  # dataclasses look their module up there
_spec.loader.exec_module(metrics)


def test_counts_and_ratios() -> None:
    s = metrics.score(truth=[0x10, 0x20, 0x30, 0x40], predicted=[0x10, 0x20, 0x30, 0x35, 0x99])
    assert (s.tp, s.fp, s.fn) == (3, 2, 1)
    assert s.precision == pytest.approx(3 / 5)
    assert s.recall == pytest.approx(3 / 4)
    assert s.f1 == pytest.approx(2 * 0.6 * 0.75 / 1.35)


def test_scope_and_neutral_addresses_are_not_scored() -> None:
    # 0x5 is a PLT stub (out of scope), 0x18 is crt's frame_dummy (a size-0 FUNC symbol).
    s = metrics.score(truth=[0x10, 0x20], predicted=[0x5, 0x10, 0x18, 0x20], scope=[(0x10, 0x100)], neutral=[0x18])
    assert (s.tp, s.fp, s.fn) == (2, 0, 0)
    assert s.f1 == 1.0
    # A true start is never neutral, and a prediction at the end of a range is out of it.
    s = metrics.score(truth=[0x10], predicted=[0x10, 0x100], scope=[(0x10, 0x100)], neutral=[0x10])
    assert (s.tp, s.fp, s.fn) == (1, 0, 0)


def test_micro_average_sums_counts_not_ratios() -> None:
    a = metrics.score(truth=range(100), predicted=range(100))
    b = metrics.score(truth=[1, 2], predicted=[])
    total = a + b
    assert (total.tp, total.fp, total.fn) == (100, 0, 2)
    assert total.recall == pytest.approx(100 / 102)
    assert b.f1 == 0.0 and b.precision == 1.0


def test_in_ranges_edges() -> None:
    ranges = [(0x10, 0x20), (0x30, 0x40)]
    inside = [a for a in (0xF, 0x10, 0x1F, 0x20, 0x30, 0x3F, 0x40) if metrics.in_ranges(a, ranges)]
    assert inside == [0x10, 0x1F, 0x30, 0x3F]
