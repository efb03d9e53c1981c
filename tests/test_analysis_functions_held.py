"""Building functions with `consume` keeps the chunks that several bodies hold until the last of them
is built: `functions._held_twice` finds them in bits of the code map. It must be the set a count of
every body's chunks gives, on compiled fixtures and on corpus files (the C bit map and plain sets)."""

from __future__ import annotations

from collections import Counter

import pytest

from binlens.analysis import codemap as C
from binlens.analysis import engine as E
from binlens.analysis.discovery.functions import _held_twice
from binlens.loader.isolate import load_image
from conftest import corpus_dir

CORPUS = {"elf/libarm.so": 0, "jmptbl/test_msvc_1900_32.exe": 6, "mach0/swift-main": 0}  # chunks held twice


def _check(path, monkeypatch, bits: bool) -> int:  # noqa: ANN001
    if not bits:
        monkeypatch.setattr(C, "_AddrBits", None)
    with E.gc_paused():
        explored = E.explore(load_image(str(path)))
    held = Counter(a for b in explored.found.bodies.values() for a in b.chunks)
    want = {a for a, n in held.items() if n > 1}
    got = _held_twice(explored.reader.codemap, explored.found.bodies)
    assert {a for a in held if a in got} == want
    return len(want)


@pytest.mark.parametrize("bits", [True, False])
def test_chunks_held_twice_on_fixtures(compile_c, monkeypatch, bits: bool) -> None:  # noqa: ANN001
    for name, opt in (("sample.c", "-O2"), ("gaps.c", "-O0"), ("noret_chain.c", "-O2")):
        _check(compile_c(name, opt, True, strip=True), monkeypatch, bits)


@pytest.mark.parametrize("name", CORPUS)
def test_chunks_held_twice_on_corpus_files(monkeypatch, name: str) -> None:  # noqa: ANN001
    path = corpus_dir() / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert _check(path, monkeypatch, True) == CORPUS[name]


@pytest.mark.parametrize("bits", [True, False])
def test_chunks_held_twice_on_libc(monkeypatch, bits: bool) -> None:  # noqa: ANN001
    from pathlib import Path

    libc = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.is_file():
        pytest.skip(f"{libc} is absent")
    assert _check(libc, monkeypatch, bits) > 100  # (314 with this libc: tail-merged code)
