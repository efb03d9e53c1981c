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
