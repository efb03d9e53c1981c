"""instruction.search on binaries compiled here, checked against objdump -d of the same file.

`tests/fixtures/src/insn_search.c` holds SHA-1's round constants 0x5a827999 and 0x6ed9eba1 as
immediates and calls through registers (a callback, a table of operations). The x86-64 build goes
through the iced fast path (with the immediate's byte prefilter), the AArch64 build through the
listing's decode; libc.so.6, when present, pages a long search through deadlines.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError
from conftest import FIXTURE_SRC

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def _objdump(tool: str, exe: Path) -> list[tuple[int, str]]:
    """(address, text) of every instruction line of `tool -d exe`."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    out = subprocess.run([tool, "-d", "--no-show-raw-insn", str(exe)], capture_output=True, text=True, check=True)
    rows = []
    for line in out.stdout.splitlines():
        m = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2).strip()))
    return rows


def _search(workspace, **params):
    """Every hit of one search, through its pages (a page of 1,000 at most)."""
    out, cursor = [], None
    while True:
        page = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        data = invoke(workspace, "instruction.search", {**params, "page": page})
        out += data["items"]
        cursor = data["next_cursor"]
        assert (cursor is None) == data["scan"]["complete"]
        if cursor is None:
            return out


@pytest.fixture(scope="module")
def x86(compile_c):
    return compile_c("insn_search.c", "-O2", True)


@pytest.fixture()
def opened(workspace, x86):
    workspace.open(str(x86), check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})
    return workspace


def test_every_call_through_a_register_is_objdumps(opened, x86):
    hits = _search(opened, mnemonic="call", operands="r*")
    want = {a for a, text in _objdump("objdump", x86) if re.fullmatch(r"(notrack )?call\s+\*%r\w+", text)}
    assert len(want) >= 2 and {int(x["address"], 16) for x in hits} == want
    assert all(x["mnemonic"].endswith("call") and x["function"] and x["function_name"] for x in hits)
    assert "apply" in {x["function_name"] for x in hits}  # (and _init's call of __gmon_start__)
    # `call` and a memory operand: the table's call, `call qword ptr [rdx+rax*8]`
    table = _search(opened, mnemonic="call", operands_regex=r"^qword ptr \[r\w+\+r\w+\*8\]$")
    assert [x["function_name"] for x in table] == ["dispatch"]


def test_an_immediate_finds_the_constant_the_source_uses(opened, x86):
    for value in ("0x5a827999", 0x6ED9EBA1):
        hits = _search(opened, immediate=value)
        text = hex(value) if isinstance(value, int) else value
        want = {a for a, t in _objdump("objdump", x86) if text in t}
        assert want and {int(x["address"], 16) for x in hits} == want, (value, hits)
        assert hits[0]["function_name"] == ("sha1_round1" if text == "0x5a827999" else "sha1_round2")
        assert text in hits[0]["operands"]
    # a negative displacement, by its value and its 64-bit bits
    neg = _search(opened, immediate=-8, mnemonic="*")
    assert neg == _search(opened, immediate="0xfffffffffffffff8")


def test_mnemonic_globs_references_and_a_function(opened, x86):
    jumps = _search(opened, mnemonic="j*")
    assert jumps and all(x["mnemonic"].split()[-1].startswith("j") for x in jumps)
    round1 = invoke(opened, "address.resolve", {"selector": {"name": "sha1_round1"}})["address"]
    calls = _search(opened, references="sha1_round1")
    assert [x["function_name"] for x in calls] == ["main"] and calls[0]["operands"] == round1
    inside = _search(opened, mnemonic="*", selector={"name": "sha1_round1"})
    assert inside and {x["function_name"] for x in inside} == {"sha1_round1"}
    listed = invoke(
        opened, "instruction.list", {"scan": {"range": {"start": round1, "end": hex(int(round1, 16) + 4096)}}}
    )
    mine = [x["address"] for x in listed["items"] if x["function"] == round1]
    assert [x["address"] for x in inside] == mine


def test_pages_join_to_the_unpaged_result(opened):
    whole = invoke(opened, "instruction.search", {"mnemonic": "*", "page": {"limit": 1000}})
    assert whole["scan"]["complete"] and len(whole["items"]) > 50
    joined, cursor = [], None
    while True:
        page = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        data = invoke(opened, "instruction.search", {"mnemonic": "*", "page": page})
        assert len(data["items"]) <= 7
        joined += data["items"]
        cursor = data["next_cursor"]
        if cursor is None:
            assert data["scan"]["stop_reason"] == "range_end"
            break
        assert data["scan"]["stop_reason"] == "limit"
    assert joined == whole["items"]
    # a range: the hits inside it, the same items
    lo, hi = whole["items"][10]["address"], whole["items"][20]["address"]
    ranged = _search(opened, mnemonic="*", scan={"range": {"start": lo, "end": hi}})
    assert ranged == whole["items"][10:20]


@pytest.mark.parametrize(
    ("params", "code", "target"),
    [
        ({"operands_regex": "(unclosed"}, "invalid_argument", "/params/operands_regex"),
        ({"immediate": "0xzz"}, "invalid_argument", "/params/immediate"),
        ({"immediate": True}, "invalid_argument", "/params/immediate"),
        ({"immediate": 1 << 64}, "invalid_argument", "/params/immediate"),
        ({"references": "no_such_function"}, "not_found", "/params/references"),
        ({}, "invalid_argument", "/params"),
        ({"mnemonic": ""}, "invalid_argument", "/params/mnemonic"),
        ({"mnemonic": "call", "page": {"cursor": "bogus"}}, "invalid_argument", "/params/page/cursor"),
        ({"mnemonic": "call", "selector": {"name": "nowhere"}}, "not_found", "/params/selector/name"),
    ],
)
def test_bad_patterns_are_errors_with_a_pointer(opened, params, code, target):
    with pytest.raises(BinlensError) as err:
        invoke(opened, "instruction.search", params)
    assert (err.value.code, err.value.target) == (code, target), err.value.to_dict()


def test_a_cursor_of_another_query_is_refused(opened):
    first = invoke(opened, "instruction.search", {"mnemonic": "*", "page": {"limit": 2}})
    with pytest.raises(BinlensError) as err:
        invoke(opened, "instruction.search", {"mnemonic": "mov", "page": {"cursor": first["next_cursor"]}})
    assert err.value.target == "/params/page/cursor"


def test_aarch64_through_the_listings_decode(workspace, tmp_path):
    cc = shutil.which("aarch64-linux-gnu-gcc")
    if cc is None:
        pytest.skip("aarch64-linux-gnu-gcc is not installed (Debian package gcc-aarch64-linux-gnu)")
    exe = tmp_path / "insn_search_a64"
    src = str(FIXTURE_SRC / "insn_search.c")
    subprocess.run([cc, "-O2", "-nostdlib", "-static", "-Wl,-e,main", "-o", str(exe), src], check=True)
    workspace.open(str(exe), check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})
    dump = _objdump("aarch64-linux-gnu-objdump", exe)
    blr = _search(workspace, mnemonic="blr")
    assert {int(x["address"], 16) for x in blr} == {a for a, t in dump if t.split()[0] == "blr"} != set()
    movk = _search(workspace, immediate=0x5A82)
    assert [x["mnemonic"] for x in movk] == ["movk"] and movk[0]["function_name"] == "sha1_round1"
    assert {int(x["address"], 16) for x in movk} == {a for a, t in dump if "#0x5a82" in t}


def test_libc_pages_through_deadlines_to_the_whole_result(workspace):
    """Short deadlines stop pages early (how early depends on the machine); following the cursors
    still gives exactly the hits of one unbounded search."""
    if not LIBC.exists():
        pytest.skip(f"{LIBC} is absent")
    workspace.open(str(LIBC), check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True, "timeout_ms": 600000})
    params = {"operands": "r*, 0x*", "mnemonic": "and"}
    whole = _search(workspace, **params, scan={"timeout_ms": 60000})
    joined, cursor, reasons = [], None, set()
    for _ in range(10000):
        page = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        data = invoke(workspace, "instruction.search", {**params, "page": page, "scan": {"timeout_ms": 100}})
        joined += data["items"]
        reasons.add(data["scan"]["stop_reason"])
        cursor = data["next_cursor"]
        if cursor is None:
            break
    assert joined == whole and len(whole) > 100 and reasons <= {"timeout", "range_end", "limit"}
    imm = _search(workspace, immediate="0x7fffffff")
    assert imm and all("0x7fffffff" in x["operands"] for x in imm)


def test_a_range_that_starts_inside_an_instruction_keeps_its_bounds(opened):
    """The blocks are decoded from their starts: a range from the middle of an instruction lists
    the next instructions as the listing does, not bytes decoded out of step."""
    whole = _search(opened, mnemonic="*", selector={"name": "sha1_round1"})
    longest = max(whole[:-1], key=lambda x: len(x["operands"]))
    i = whole.index(longest)
    inside = hex(int(longest["address"], 16) + 1)
    ranged = _search(opened, mnemonic="*", scan={"range": {"start": inside, "end": whole[-1]["address"]}})
    assert ranged == whole[i + 1 : -1]
