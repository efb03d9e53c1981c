"""The code pointers in data, found once and kept as packed words, and the passes that read them:
the references' pointers to code and strings (the kept code pointers and a scan for the string
pointers alone) against a scan for both, on compiled fixtures (PIE and not) and corpus files (REL
and RELA relocations, several architectures)."""

from __future__ import annotations

import pytest

from binlens.analysis.codemap import CodeMap
from binlens.analysis.refs import xrefs as X
from binlens.analysis.refs.strings import find_strings
from binlens.loader.parse_lief import parse_path
from conftest import corpus_dir

CORPUS = ["elf/libarm.so", "elf/mips-mozi", "elf/ip-riscv", "pe/winmain.exe", "mach0/ls-osx-x86_64"]


def _check(path: str) -> int:
    image = parse_path(path)
    str_starts = {s.address for s in find_strings(image)}
    both = sorted(X.pointers_in_data(image, CodeMap(image), str_starts))  # one scan for both
    codemap = CodeMap(image)
    first = list(X.pointers_in_data(image, codemap, set()))
    assert list(X.pointers_in_data(image, codemap, set())) == first  # (the kept words, read again)
    assert list(X.data_pointer_words(image, codemap)) == [x for pair in first for x in pair]
    assert first == sorted(first) and len({at for at, _ in first}) == len(first)
    assert sorted(X._code_and_string_pointers(image, codemap, str_starts)) == both
    strings_only = X.pointers_in_data(image, codemap, str_starts, code=False)
    assert strings_only == [(at, v) for at, v in both if v in str_starts]
    return len(both)


@pytest.mark.parametrize("pie", [False, True])
def test_pointers_to_code_and_strings_are_those_one_scan_finds(compile_c, pie: bool) -> None:
    assert _check(str(compile_c("strings.c", "-O2", pie))) > 0
    assert _check(str(compile_c("callbacks.c", "-O2", pie, strip=True))) > 0


@pytest.mark.parametrize("name", CORPUS)
def test_corpus_pointers_to_code_and_strings_are_those_one_scan_finds(name: str) -> None:
    path = corpus_dir() / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    _check(str(path))
