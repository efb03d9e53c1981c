"""listing.get as an agent reads it (issue 23): text by default, pages by byte offset that join to
one unbounded call, string comments for references into a shared string tail, and range listings
that name each line's function; plus the `selector` aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError


@pytest.fixture()
def ws(workspace: Any, compile_c: Any) -> Any:
    workspace.open(compile_c("listing_pages.c"), check_roots=False)
    return workspace


def _pages(ws: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every page of a listing, following next_offset."""
    out = [invoke(ws, "listing.get", params)]
    while out[-1]["next_offset"] is not None:
        assert len(out) < 10_000
        out.append(invoke(ws, "listing.get", {**params, "offset": out[-1]["next_offset"]}))
    return out


def test_text_by_default_lines_on_request(ws: Any) -> None:
    text = invoke(ws, "listing.get", {"selector": {"name": "mix"}})
    assert "lines" not in text and text["text"].startswith("mix:\n")
    assert text["offset"] == 0 and text["next_offset"] is None and text["fragment"] is False
    lines = invoke(ws, "listing.get", {"selector": {"name": "mix"}, "format": "lines"})
    assert "text" not in lines and lines["lines"][0] == {
        "address": text["function"],
        "kind": "label",
        "text": "mix:",
        "bytes": None,
        "comment": None,
    }
    both = invoke(ws, "listing.get", {"selector": {"name": "mix"}, "format": "both"})
    assert both["text"] == text["text"] and both["lines"] == lines["lines"]
    # one row per line, in order
    assert len(text["text"].splitlines()) == len(lines["lines"])


@pytest.mark.parametrize("fmt", ["text", "both"])
def test_pages_join_to_one_unbounded_call(ws: Any, fmt: str) -> None:
    whole = invoke(ws, "listing.get", {"selector": {"name": "main"}, "format": fmt, "max_bytes": 1 << 24})
    assert whole["next_offset"] is None
    pages = _pages(ws, {"selector": {"name": "main"}, "format": fmt, "max_bytes": 256})
    assert len(pages) > 3
    assert "".join(p["text"] for p in pages) == whole["text"]
    at = 0
    for page in pages:
        size = len(page["text"].encode())
        assert page["offset"] == at and 0 < size <= 256 and page["fragment"] is True
        assert page["text"].endswith("\n")  # rows this short are never cut
        at += size
    assert pages[-1]["next_offset"] is None
    if fmt == "both":
        assert [ln for p in pages for ln in p["lines"]] == whole["lines"]


def test_pages_cut_long_lines_on_utf8_boundaries(ws: Any) -> None:
    mix = invoke(ws, "function.get", {"selector": {"name": "mix"}})["address"]
    plate = "é→" * 200  # 1,000 bytes on one line: pages of 256 bytes cut inside it
    invoke(ws, "comment.create", {"selector": {"address": mix}, "kind": "plate", "text": plate})
    whole = invoke(ws, "listing.get", {"selector": {"name": "mix"}, "max_bytes": 1 << 24})["text"]
    assert plate in whole
    pages = _pages(ws, {"selector": {"name": "mix"}, "max_bytes": 256})
    assert "".join(p["text"] for p in pages) == whole
    assert any(not p["text"].endswith("\n") for p in pages[:-1])  # some page ends inside the plate line
    raw = whole.encode()
    inside = next(i for i in range(1, len(raw)) if raw[i] & 0xC0 == 0x80)
    with pytest.raises(BinlensError) as err:
        invoke(ws, "listing.get", {"selector": {"name": "mix"}, "offset": inside})
    assert err.value.code == "invalid_argument" and err.value.target == "/params/offset"
    with pytest.raises(BinlensError) as err:
        invoke(ws, "listing.get", {"selector": {"name": "mix"}, "offset": len(raw) + 1})
    assert err.value.target == "/params/offset"
    end = invoke(ws, "listing.get", {"selector": {"name": "mix"}, "offset": len(raw)})
    assert end["text"] == "" and end["next_offset"] is None


def test_listing_is_compact(ws: Any, compile_c: Any) -> None:
    """At most 2x `objdump -d`'s bytes for the same function (this listing adds names and comments)."""
    import shutil
    import subprocess

    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump is not installed (binutils)")
    fn = invoke(ws, "function.get", {"selector": {"name": "mix"}})
    text = invoke(ws, "listing.get", {"selector": {"name": "mix"}})["text"]
    out = subprocess.run(
        [
            objdump,
            "-d",
            f"--start-address={fn['address']}",
            f"--stop-address={fn['end']}",
            str(compile_c("listing_pages.c")),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    reference = sum(len(ln) + 1 for ln in out.splitlines() if ":\t" in ln)
    assert len(text.encode()) <= 2 * reference, (len(text.encode()), reference)


def test_reference_into_a_shared_string_tail_gets_its_comment(ws: Any) -> None:
    text = invoke(ws, "listing.get", {"selector": {"name": "say_tail"}})["text"]
    assert '; "shared tail of a string"' in text, text
    longer = invoke(ws, "listing.get", {"selector": {"name": "say_long"}})["text"]
    assert '; "the binlens shared tail of a string"' in longer
    # one copy: the shorter string is the tail of the longer one
    strings = invoke(ws, "string.list", {"text": "shared tail of a string"})["items"]
    assert [s["text"] for s in strings] == ["the binlens shared tail of a string"]


def test_range_listing_names_the_function_of_each_line(ws: Any) -> None:
    say_long = invoke(ws, "function.get", {"selector": {"name": "say_long"}})
    say_tail = invoke(ws, "function.get", {"selector": {"name": "say_tail"}})
    start = hex(int(say_long["address"], 16) + 4)  # inside say_long, past its entry
    got = invoke(ws, "listing.get", {"range": {"start": start, "end": say_tail["end"]}, "format": "both"})
    first = got["text"].splitlines()[0]
    assert first == "  ; in say_long", got["text"]
    assert "say_tail:" in got["text"]
    owners = {ln["function"] for ln in got["lines"] if ln["kind"] == "instruction" and "function" in ln}
    assert {say_long["address"], say_tail["address"]} <= owners
    by_line = [(ln["address"], ln.get("function")) for ln in got["lines"] if ln["kind"] == "instruction"]
    for address, owner in by_line:
        if int(say_tail["address"], 16) <= int(address, 16) < int(say_tail["end"], 16):
            assert owner == say_tail["address"]


def test_selector_aliases_of_address_methods(ws: Any) -> None:
    by_address = invoke(ws, "address.resolve", {"address": "mix"})
    assert invoke(ws, "address.resolve", {"selector": {"name": "mix"}}) == by_address
    assert invoke(ws, "address.resolve", {"selector": {"address": by_address["address"]}}) == by_address
    for params in ({}, {"address": "mix", "selector": {"name": "mix"}}):
        with pytest.raises(BinlensError) as err:
            invoke(ws, "address.resolve", params)
        assert err.value.code == "invalid_argument" and err.value.target == "/params/selector"
    with pytest.raises(BinlensError) as err:
        invoke(ws, "address.resolve", {"selector": {"name": "no_such_name"}})
    assert err.value.target == "/params/selector/name"
    refs = invoke(ws, "reference.list", {"selector": {"name": "say_tail"}, "direction": "to"})
    assert refs == invoke(ws, "reference.list", {"address": "say_tail", "direction": "to"}) and refs["items"]
    edited = invoke(ws, "function_parameter.create", {"selector": {"name": "mix"}, "name": "s", "type": "char *"})
    assert [q["name"] for q in edited["prototype"]["parameters"]] == ["s"]
    edited = invoke(ws, "function_parameter.patch", {"function": {"name": "mix"}, "ordinal": 0, "name": "text"})
    assert [q["name"] for q in edited["prototype"]["parameters"]] == ["text"]
    with pytest.raises(BinlensError) as err:
        invoke(ws, "function_parameter.delete", {"ordinal": 0})
    assert err.value.target == "/params/selector"


def test_fixture_is_what_the_tests_expect(compile_c: Any) -> None:
    """The tail has no copy of its own: say_tail refers into the longer string."""
    data = Path(compile_c("listing_pages.c")).read_bytes()
    assert data.count(b"shared tail of a string\x00") == 1


def test_selector_aliases_of_memory_methods(ws: Any) -> None:
    by_address = invoke(ws, "memory.read", {"address": "mix", "length": 8})
    assert invoke(ws, "memory.read", {"selector": {"name": "mix"}, "length": 8}) == by_address
    with pytest.raises(BinlensError) as err:
        invoke(ws, "memory.read", {"selector": {"address": "0x7fffffff0000"}, "length": 8})
    assert err.value.target == "/params/selector/address"
    written = invoke(ws, "memory.write", {"selector": {"name": "mix"}, "data": "90"})
    assert invoke(ws, "memory.read", {"selector": {"name": "mix"}, "length": 1})["data"] == "90" and written
    with pytest.raises(BinlensError) as err:
        invoke(ws, "memory.write", {"data": "90"})
    assert err.value.code == "invalid_argument" and err.value.target == "/params/selector"
