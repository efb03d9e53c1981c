"""Discovery's walks keep no edges (`engine._EDGES_LATER`): each body's edges are walked once more
when discovery ends, and on demand for the non-returning test. The analysis must be exactly the one
made with the edges kept all along, with the C walk and with the Python walk, on compiled fixtures
and on corpus files of several architectures."""

from __future__ import annotations

import pytest

from binlens.analysis import engine as E
from binlens.analysis.discovery import explorer as D
from conftest import assert_same_analysis_without, corpus_dir

CORPUS = [
    "jmptbl/test_msvc_1900_32.exe",
    "elf/libarm.so",
    "elf/mips-mozi",
    "elf/ip-riscv",
    "mach0/swift-main",
]


@pytest.mark.parametrize("python_walk", [False, True])
@pytest.mark.parametrize(
    "name,opt,pie", [("sample.c", "-O2", True), ("gaps.c", "-O0", False), ("noret_chain.c", "-O2", True)]
)
def test_walks_without_edges_give_the_same_analysis(compile_c, monkeypatch, python_walk, name, opt, pie) -> None:  # noqa: ANN001
    if python_walk:
        monkeypatch.setattr(D, "_c_body", None)
    functions, _refs = assert_same_analysis_without(
        monkeypatch, E, "_EDGES_LATER", compile_c(name, opt, pie, strip=True)
    )
    assert any(edges for _a, _s, _b, edges, _c in functions)  # (the edges are there, not both empty)


@pytest.mark.parametrize("name", CORPUS)
def test_corpus_walks_without_edges_give_the_same_analysis(monkeypatch, name: str) -> None:  # noqa: ANN001
    path = corpus_dir() / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert_same_analysis_without(monkeypatch, E, "_EDGES_LATER", path)


def test_discovery_keeps_no_edges_until_it_ends(compile_c, monkeypatch) -> None:  # noqa: ANN001
    """The bodies the non-returning test sees during discovery hold no edges (the memory saved);
    the functions built after it do have theirs."""
    from binlens.analysis import analyze
    from binlens.loader.parse_lief import parse_path

    seen: list[bool] = []
    real = E.returning_functions

    def spy(bodies, *args):  # noqa: ANN001, ANN202
        seen.append(all(b.edges is None for b in bodies.values()))
        return real(bodies, *args)

    monkeypatch.setattr(E, "returning_functions", spy)
    a = analyze(parse_path(str(compile_c("noret_chain.c", "-O2", True, strip=True))))
    assert seen and all(seen)
    assert sum(len(f.edges) for f in a.functions) > 0
