"""Owner spans merged run by run (`merge_function_rows`): the C merge (`store/_rows.c`'s `merge_spans`) and the
Python one give what `owner_spans` gives for all the blocks at once: each start once, with its least
(end, function), in start order, whatever the runs' overlap (a batch's cold blocks below every run
before it, the same start in both, one run empty)."""

from __future__ import annotations

import random
from array import array
from types import SimpleNamespace

import pytest

from binlens.store import analysis_save
from binlens.store.analysis_save import FunctionRows, merge_function_rows, owner_spans

_rows_c = analysis_save._c_rows


def _functions(rng: random.Random, n: int, lo: int, hi: int) -> list:
    """`n` functions of random blocks in [lo, hi) (blocks of different functions may share a start)."""
    fs = []
    for _ in range(n):
        blocks = []
        for _ in range(rng.randint(1, 6)):
            st = rng.randrange(lo, hi)
            blocks.append(SimpleNamespace(start=st, end=st + rng.randint(1, 40)))
        fs.append(SimpleNamespace(address=rng.randrange(lo, hi), blocks=blocks))
    return fs


def _rows(functions: list) -> FunctionRows:
    return FunctionRows([], [], array("q"), (0, 0, 0), owner_spans(functions))


@pytest.mark.parametrize("c_merge", [True, False])
@pytest.mark.parametrize("seed", range(25))
def test_runs_merged_are_the_spans_of_all(monkeypatch, c_merge: bool, seed: int) -> None:
    if c_merge and _rows_c is None:
        pytest.skip("the C extension _rows is not built")
    if not c_merge:
        monkeypatch.setattr(analysis_save, "_c_rows", None)
    rng = random.Random(seed)
    runs = [_functions(rng, rng.randint(0, 30), 0, rng.choice([50, 400, 5000])) for _ in range(rng.randint(1, 6))]
    if seed % 5 == 0:  # the same spans twice: every start repeats
        runs = [runs[0], runs[0]]
    merged = _rows(runs[0])
    for run in runs[1:]:
        merged = merge_function_rows(merged, _rows(run))
    want = owner_spans([f for run in runs for f in run])
    assert merged.spans == want
    assert len(set(merged.spans[0])) == len(merged.spans[0])


def test_the_c_merge_refuses_arrays_without_room() -> None:
    if _rows_c is None:
        pytest.skip("the C extension _rows is not built")
    one = [array("Q", [1, 2]) for _ in range(3)]
    two = [array("Q", [3]) for _ in range(3)]
    with pytest.raises(ValueError, match="room"):
        _rows_c.merge_spans(*one, *two, 2)
    with pytest.raises(ValueError, match="one length"):
        _rows_c.merge_spans(*one, array("Q", [3]), array("Q", [3, 4]), array("Q", [3]), 1)
