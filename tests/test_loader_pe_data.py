"""Data inside a PE's code sections (`loader/pe_data.py`): located from the file's own tables, never
decoded as code, never a function start, and scanned for strings.

`dhcpssvc.dll` of the corpus is an x64 Windows DLL whose `.rdata` is merged into `.text`: its IAT,
debug directory, strings and tables come before the code, its unwind records, delay-import and
import descriptors, hint/name entries and export directory after it.
"""

from __future__ import annotations

import bisect
import json
from functools import cache

import lief
import pytest

from binlens.analysis import analyze
from binlens.loader.image import decode_image, encode_image
from binlens.loader.parse_lief import parse_path
from binlens.loader.pe_data import (
    _close_gaps,
    clip,
    looks_like_data,
    merge,
    relocation_ranges,
    shape_strings,
    string_at,
    unwind_ranges,
)
from conftest import corpus_dir, run_cli


def _reader(base: int, blob: bytes):  # type: ignore[no-untyped-def]
    def read(va: int, size: int) -> bytes | None:
        if not base <= va < base + len(blob):
            return None
        return blob[va - base : va - base + size]

    return read


# --- the extraction's parts, on bytes made here -------------------------------------------------
def test_merge_joins_overlapping_touching_and_near_ranges() -> None:
    ranges = [(30, 40, "string"), (10, 20, "pointer"), (15, 25, "directory"), (25, 26, "x")]
    assert merge(ranges) == [(10, 26, "pointer"), (30, 40, "string")]
    assert merge(ranges, gap=4) == [(10, 26, "pointer"), (30, 40, "string")]  # 4 bytes apart
    assert merge(ranges, gap=5) == [(10, 40, "pointer")]
    assert merge([(5, 5, "empty")]) == []


def test_clip_keeps_only_the_parts_inside_code_spans() -> None:
    spans = [(100, 200), (300, 400)]
    got = clip([(50, 120, "a"), (150, 350, "b"), (400, 500, "c"), (10, 20, "d")], spans)
    assert got == [(100, 120, "a"), (150, 200, "b"), (300, 350, "b")]


def test_relocations_each_dir64_and_only_runs_of_three_highlow() -> None:
    places = [(0x1000, "DIR64"), (0x2000, "HIGHLOW"), (0x2004, "HIGHLOW"), (0x3000, "HIGHLOW")]
    places += [(0x3004, "HIGHLOW"), (0x3008, "HIGHLOW"), (0x300C, "HIGHLOW"), (0x4000, "ABSOLUTE")]
    # two relocated dwords four bytes apart fit one x86 instruction (`mov dword [abs], offset x`)
    assert relocation_ranges(places) == [(0x1000, 0x1008, "pointer"), (0x3000, 0x3010, "table")]


def test_unwind_records_sized_from_their_header_and_joined_without_a_function_between() -> None:
    base = 0x10000
    blob = bytearray(0x200)
    # 0x10000: version 1, no handler, 3 codes -> 4 + 2 * 4 = 12 bytes
    blob[0:4] = bytes([0x01, 0x05, 3, 0])
    # 0x10020: with an exception handler (flag 1), 2 codes -> 4 + 4 + 4 = 12 bytes (handler data after it)
    blob[0x20:0x24] = bytes([0x01 | 1 << 3, 0x04, 2, 0])
    # 0x10100: chained (flag 4), 1 code -> 4 + 4 + 12 = 20 bytes
    blob[0x100:0x104] = bytes([0x01 | 4 << 3, 0x00, 1, 0])
    read = _reader(base, bytes(blob))
    rows = [(0x1000, 0x1010, base), (0x1010, 0x1020, base + 0x20), (0x1020, 0x1030, base + 0x100)]
    functions = [(0x1000, 0x1010), (0x1010, 0x1020), (0x1020, 0x1030)]
    assert unwind_ranges(rows, read, functions) == [(base, base + 0x114, "unwind")]
    # a function between two records keeps them apart (the bytes between are its code)
    functions.append((base + 0x80, base + 0x90))
    assert unwind_ranges(rows, read, sorted(functions)) == [
        (base, base + 0x2C, "unwind"),
        (base + 0x100, base + 0x114, "unwind"),
    ]


def test_gaps_between_data_filled_only_where_no_code_lies() -> None:
    functions = [(0x5000, 0x5100), (0x5200, 0x5300)]
    fstarts = [lo for lo, _hi in functions]
    claimed = [(0x1800, 0x180F, "code")]  # (the entry point's first bytes)
    ranges = [(0x1000, 0x1100, "a"), (0x1108, 0x1200, "b"), (0x1400, 0x1500, "c"), (0x1700, 0x1750, "d")]
    ranges += [(0x1900, 0x1A00, "e"), (0x5100, 0x5108, "f"), (0x5110, 0x5120, "g"), (0x5180, 0x5190, "h")]
    ranges += [(0x6000, 0x6010, "i"), (0x6100, 0x6110, "j")]
    got = _close_gaps(ranges, functions, fstarts, claimed, [0x1800])
    filled = sorted(set(got) - set(ranges))
    assert filled == [
        (0x1100, 0x1108, "a"),  # before the first function
        (0x1200, 0x1400, "b"),
        (0x1500, 0x1700, "c"),  # (not 0x1750..0x1900: the entry point lies there)
        (0x5108, 0x5110, "f"),  # between two functions: only a gap of less than 16 bytes
        (0x6010, 0x6100, "i"),  # after the last function
    ]


def test_strings_at_a_target_and_by_shape() -> None:
    base = 0x5000
    blob = b"\x00\x00Hello world\x00\x00\x00" + "Wide!".encode("utf-16le") + b"\x00\x00" + b"ab\x00\x00" + bytes(8)
    blob += b"H\x8d\x05\x10\x00\x00\x00\xc3"  # lea rax, [rip + 0x10]; ret
    read = _reader(base, blob)
    assert string_at(read, base + 2) == len("Hello world") + 1
    wide = blob.index(b"W\x00")
    assert string_at(read, base + wide) == 12
    short = blob.index(b"ab\x00")
    assert string_at(read, base + short) == 0
    assert string_at(read, base + short, short=True) == 3
    assert [(lo - base, hi - base) for lo, hi, _k in shape_strings(blob, base)] == [(2, 14), (wide, wide + 12)]
    code = blob.index(b"H\x8d")
    assert looks_like_data(read, base + 2, short=False)
    assert looks_like_data(read, base + short + 4, short=False)  # eight zero bytes
    assert looks_like_data(read, base + short, short=True) and not looks_like_data(read, base + short, short=False)
    assert not looks_like_data(read, base + code, short=True)


# --- dhcpssvc.dll ------------------------------------------------------------------------------
@cache
def _dhcp():  # type: ignore[no-untyped-def]
    path = corpus_dir("pe") / "dhcpssvc.dll"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    cfg = lief.PE.ParserConfig()
    cfg.parse_exceptions = True
    return parse_path(str(path)), lief.PE.parse(str(path), cfg)


@cache
def _dhcp_analysis():  # type: ignore[no-untyped-def]
    image, _b = _dhcp()
    return analyze(image)


def _inside(ranges: list[tuple[int, int, str]], va: int) -> bool:
    i = bisect.bisect_right([lo for lo, _hi, _k in ranges], va) - 1
    return i >= 0 and va < ranges[i][1]


def _directory_ranges(image, b) -> list[tuple[int, int, str]]:  # type: ignore[no-untyped-def]
    """The data directories inside .text, read with LIEF here, and what the import ones point to."""
    base = image.identity.image_base
    out = []
    for d in b.data_directories:
        if d.rva and d.size and d.has_section and d.section.name == ".text":
            out.append((base + d.rva, base + d.rva + d.size, str(d.type)))
    for lib in b.imports:
        n = 8 * (len(lib.entries) + 1)
        out.append((base + lib.import_lookup_table_rva, base + lib.import_lookup_table_rva + n, "ILT"))
    for dbg in b.debug:
        out.append((base + dbg.addressof_rawdata, base + dbg.addressof_rawdata + dbg.sizeof_data, "debug data"))
    return sorted(out)


def test_dhcpssvc_data_ranges_cover_every_directory_in_text() -> None:
    image, b = _dhcp()
    ranges = image.data_ranges
    assert ranges == sorted(ranges) and all(lo < hi for lo, hi, _k in ranges)
    assert all(hi <= nlo for (_l, hi, _k), (nlo, _h, _k2) in zip(ranges, ranges[1:], strict=False))
    dirs = _directory_ranges(image, b)
    assert len(dirs) >= 6  # export, import, IAT, debug, delay import, ILTs, CodeView record
    for lo, hi, what in dirs:
        assert all(_inside(ranges, va) for va in range(lo, hi)), what
    # the code `.pdata` describes is never data
    base = image.identity.image_base
    for f in b.exceptions:
        assert not any(lo < base + f.rva_end and base + f.rva_start < hi for lo, hi, _k in ranges), hex(f.rva_start)
    # the delay-load thunks (`lea rax, [slot]; jmp __tailMerge_...`), which its delay-import
    # address table names, stay code
    assert not _inside(ranges, base + 0x99254) and image.read(base + 0x99254, 3) == b"H\x8d\x05"
    # the worker sends the ranges with the rest of the image
    assert decode_image(encode_image(image), image.data).data_ranges == ranges


def test_dhcpssvc_no_function_starts_in_data_and_pdata_functions_kept() -> None:
    image, b = _dhcp()
    result = _dhcp_analysis()
    starts = {f.address for f in result.functions}
    dirs = _directory_ranges(image, b)
    assert not [hex(va) for va in starts if _inside(image.data_ranges, va)]
    assert not [hex(va) for va in starts if _inside(dirs, va)]
    # before: 2,836 functions, 1,491 of them guesses from pointers, most on strings and tables
    assert len(result.functions) < 1500
    base = image.identity.image_base
    assert {base + f.rva_start for f in b.exceptions} <= starts  # every function .pdata lists
    assert base + 0x99254 in starts  # a delay-load thunk (no .pdata entry; its delay IAT slot names it)
    # no function starts at a string
    strings = {s.address for s in result.strings}
    assert not starts & strings


def test_dhcpssvc_strings_in_text_are_listed() -> None:
    _image, _b = _dhcp()
    result = _dhcp_analysis()
    text = [s for s in result.strings if s.section == ".text"]
    assert len(text) > 2000  # 0 before: the scanner read data sections only
    found = {s.text for s in text}
    assert any(t.startswith("Inside HandleRogueStart(") for t in found)
    assert "netutils.dll" in found  # a delay-loaded library's name
    assert "DisableRogueDetection" in found or any("DisableRogue" in t for t in found)  # UTF-16
    assert any(s.encoding == "utf-16le" for s in text)


def test_dhcpssvc_string_list_over_the_api(tmp_path) -> None:  # noqa: ANN001
    """`string.list` (the one-shot CLI) shows strings of `.text`."""
    _dhcp()
    path = corpus_dir("pe") / "dhcpssvc.dll"
    params = {"section": ".text", "text": "HandleRogue", "page": {"limit": 5}}
    run = run_cli("query", "-b", str(path), json.dumps({"method": "string.list", "params": params}), home=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    items = json.loads(run.stdout)["result"]["items"]
    assert items and all(i["section"] == ".text" and "HandleRogue" in i["text"] for i in items), items
