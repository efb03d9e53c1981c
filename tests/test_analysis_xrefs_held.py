"""The references from code keep only those whose instruction lies inside a chunk some body holds:
`xrefs._in_held_chunk` finds the chunk in bits of the code map (`AddrBits.floor`), or without them in
a sorted list of every body's chunk starts. Both must give the same references, and the same whole
analysis, on compiled fixtures and corpus files."""

from __future__ import annotations

import pytest

from binlens.analysis import codemap as C
from conftest import assert_same_analysis_without, corpus_dir

CORPUS = ["elf/libarm.so", "jmptbl/test_msvc_1900_32.exe", "mach0/swift-main", "elf/mips-mozi"]


@pytest.mark.parametrize("name,opt,pie", [("sample.c", "-O2", True), ("gaps.c", "-O0", False)])
def test_references_with_bits_and_with_a_sorted_list(compile_c, monkeypatch, name: str, opt: str, pie: bool) -> None:  # noqa: ANN001
    if C._AddrBits is None:
        pytest.skip("the C extension _descent is not built")
    _functions, refs = assert_same_analysis_without(monkeypatch, C, "_AddrBits", compile_c(name, opt, pie, strip=True))
    assert any(kind in ("read", "offset", "write") for _s, _d, kind in refs)  # (code's data references are there)


@pytest.mark.parametrize("name", CORPUS)
def test_corpus_references_with_bits_and_with_a_sorted_list(monkeypatch, name: str) -> None:  # noqa: ANN001
    if C._AddrBits is None:
        pytest.skip("the C extension _descent is not built")
    path = corpus_dir() / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert_same_analysis_without(monkeypatch, C, "_AddrBits", path)
