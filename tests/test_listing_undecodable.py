"""Linear listings cover their whole range: bytes that do not decode are data items, not an end."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from binlens.api import invoke
from binlens.loader.parse_lief import parse_path
from conftest import FIXTURE_SRC

GARBAGE = ["06", "27", "d6", "37"]  # invalid in 64-bit mode (tests/fixtures/src/garbage_text.S)


@pytest.fixture()
def garbage(workspace, compile_c):  # noqa: ANN001, ANN201
    """The workspace with garbage_text analysed, and the fixture's symbol addresses."""
    path = compile_c("garbage_text.S", "-O2")
    names = {s.name: s.address for s in parse_path(str(path)).symbols}
    workspace.open(path, check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})
    return workspace, names


def _covers(items: list[dict], start: int, end: int) -> None:
    """The items tile [start, end): each begins where the one before it ends."""
    at = start
    for it in items:
        assert int(it["address"], 16) == at, (hex(at), it)
        at += len(bytes.fromhex(it["bytes"]))
    assert at == end


def test_linear_instruction_list_goes_on_past_undecodable_bytes(garbage) -> None:  # noqa: ANN001
    ws, names = garbage
    start, end = names["before_garbage"], names["after_garbage_end"]
    scan = {"range": {"start": hex(start), "end": hex(end)}}
    got = invoke(ws, "instruction.list", {"mode": "linear", "scan": scan})
    items = got["items"]
    _covers(items, start, end)
    data = [it for it in items if it["flow"] == "data"]
    assert [it["bytes"] for it in data] == GARBAGE
    assert all(it["mnemonic"] == ".byte" and it["operands"] == "0x" + it["bytes"] for it in data)
    assert data[0]["address"] == hex(names["garbage"])
    assert [it["mnemonic"] for it in items if int(it["address"], 16) >= names["after_garbage"]] == ["mov", "add", "ret"]
    assert got["scan"]["complete"] is True and got["next_cursor"] is None

    # paged three at a time, the pages join up to the same items
    paged, cursor = [], None
    while True:
        page = invoke(ws, "instruction.list", {"mode": "linear", "scan": scan, "page": {"limit": 3, "cursor": cursor}})
        paged += page["items"]
        cursor = page["next_cursor"]
        assert page["scan"]["complete"] is (cursor is None)
        if cursor is None:
            break
    assert paged == items


def test_range_listing_shows_undecodable_bytes_as_data_lines(garbage) -> None:  # noqa: ANN001
    ws, names = garbage
    start, end = names["before_garbage"], names["after_garbage_end"]
    got = invoke(ws, "listing.get", {"range": {"start": hex(start), "end": hex(end)}, "format": "both"})
    body = [ln for ln in got["lines"] if ln["kind"] in ("instruction", "data")]
    _covers(body, start, end)
    data = [ln for ln in body if ln["kind"] == "data"]
    assert [ln["bytes"] for ln in data] == GARBAGE
    assert [ln["text"] for ln in data] == [f".byte 0x{b}" for b in GARBAGE]
    assert got["truncated"] is False
    assert "after_garbage:" in got["text"] and ".byte 0xd6" in got["text"]


def test_a_listing_cut_short_says_so(garbage) -> None:  # noqa: ANN001
    ws, names = garbage
    start, end = names["before_garbage"], names["after_garbage_end"]
    got = invoke(
        ws, "listing.get", {"range": {"start": hex(start), "end": hex(end)}, "max_instructions": 4, "format": "both"}
    )
    assert got["truncated"] is True
    assert len([ln for ln in got["lines"] if ln["kind"] in ("instruction", "data")]) == 4


def test_aarch64_data_items_are_whole_instruction_words(workspace, tmp_path) -> None:  # noqa: ANN001
    cc = shutil.which("aarch64-linux-gnu-gcc")
    if cc is None:
        pytest.skip("aarch64-linux-gnu-gcc is not installed")
    out = tmp_path / "garbage_a64"
    src = FIXTURE_SRC / "garbage_a64.S"
    subprocess.run([cc, "-nostdlib", "-static", "-o", str(out), str(src)], check=True, capture_output=True)
    names = {s.name: s.address for s in parse_path(str(out)).symbols}
    workspace.open(out, check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})
    start, end = names["_start"], names["after_garbage_end"]
    scan = {"range": {"start": hex(start), "end": hex(end)}}
    items = invoke(workspace, "instruction.list", {"mode": "linear", "scan": scan})["items"]
    _covers(items, start, end)
    assert [(it["flow"], it["bytes"]) for it in items if it["flow"] == "data"] == [
        ("data", "ffffffff"),
        ("data", "efbeadde"),
    ]
    assert [it["mnemonic"] for it in items][-2:] == ["mov", "svc"]
