"""Strings in ASCII, UTF-8 and UTF-16LE, and read/write references to a global."""

from __future__ import annotations

import pytest

from binlens.api import invoke
from binlens.loader.parse_lief import parse_path


@pytest.fixture()
def program(workspace, compile_c):
    path = compile_c("strings.c", "-O2", False)
    workspace.open(path, check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})
    img = parse_path(str(path))
    return {s.name: s.address for s in img.symbols}


def test_three_encodings(workspace, program):
    items = invoke(workspace, "string.list", {"page": {"limit": 1000}})["items"]
    by_text = {s["text"]: s for s in items}
    assert by_text["plain ascii text for binlens"]["encoding"] == "ascii"
    assert by_text["héllo wörld, binlens utf-8"]["encoding"] == "utf-8"
    wide = by_text["wide utf-16 text for binlens"]
    assert wide["encoding"] == "utf-16le" and wide["size"] == 2 * len(wide["text"])
    only_wide = invoke(workspace, "string.list", {"encoding": "utf-16le"})["items"]
    assert [s["text"] for s in only_wide] == ["wide utf-16 text for binlens"]
    long_only = invoke(workspace, "string.list", {"min_length": 27, "page": {"limit": 1000}})["items"]
    assert all(s["length"] >= 27 for s in long_only) and "plain ascii text for binlens" in {
        s["text"] for s in long_only
    }
    # the pointers in .data (non-PIE: plain words) are references to the strings
    assert by_text["plain ascii text for binlens"]["references"] >= 1
    assert wide["references"] >= 1


def test_reads_and_writes_of_a_global(workspace, program):
    counter = hex(program["shared_counter"])
    refs = invoke(workspace, "reference.list", {"address": counter})["items"]
    kinds = {(r["function"], r["kind"]) for r in refs}
    assert (hex(program["peek"]), "read") in kinds
    assert (hex(program["bump"]), "write") in kinds
    writes = invoke(workspace, "reference.list", {"address": counter, "kind": ["write"]})["items"]
    assert writes and all(r["kind"] == "write" for r in writes)
