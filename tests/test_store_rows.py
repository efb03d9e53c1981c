"""The rows a saved analysis becomes: built whole or in parts (as the analysis process's two
processes build them), merged, they are the same."""

from __future__ import annotations

import pytest

from binlens.store.analysis_save import function_rows, merge_function_rows, owner_spans


@pytest.mark.parametrize("name,opt,pie", [("sample.c", "-O2", True), ("gaps.c", "-O0", False)])
def test_rows_of_parts_merge_to_the_rows_of_all(compile_c, name, opt, pie) -> None:  # noqa: ANN001
    from binlens.analysis import analyze
    from binlens.loader.parse_lief import parse_path

    functions = analyze(parse_path(str(compile_c(name, opt, pie, strip=True)))).functions
    whole = function_rows(functions)
    assert whole.spans == owner_spans(functions) and whole.counts[0] == len(functions)
    for k in (0, 1, len(functions) // 3, len(functions) - 1, len(functions)):
        merged = merge_function_rows(function_rows(functions[:k]), function_rows(functions[k:]))
        assert merged == whole, k


def test_spans_that_interleave_across_the_split_merge_as_owner_spans_would() -> None:
    """The usual parts join end to end; where a part's blocks reach past the other's first start (a
    chunk two functions share), each start is kept once with its first owner, as `owner_spans` does."""
    from binlens.store.analysis_save import FunctionRows

    def rows(spans: tuple) -> FunctionRows:
        return FunctionRows([], [], [], (0, 0, 0), spans)

    joined = merge_function_rows(rows(([10, 20], [15, 25], [1, 1])), rows(([30, 40], [35, 45], [2, 2])))
    assert joined.spans == ([10, 20, 30, 40], [15, 25, 35, 45], [1, 1, 2, 2])
    mixed = merge_function_rows(
        rows(([10, 30, 50], [15, 35, 55], [1, 1, 1])), rows(([20, 30, 40], [25, 33, 45], [2, 2, 2]))
    )
    assert mixed.spans == ([10, 20, 30, 40, 50], [15, 25, 33, 45, 55], [1, 2, 2, 2, 1])
