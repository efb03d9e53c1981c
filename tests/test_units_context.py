"""code_unit.list, data_unit.list, address.resolve's containing function and address.context, on
the sample program built here (unstripped: its symbols are the ground truth)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError


@pytest.fixture()
def sample(workspace, compile_c):
    path = compile_c("sample.c", "-O0")
    prog = workspace.open(path, check_roots=False)
    return workspace, prog, path


def _all(ws, method: str, params: dict, limit: int) -> list[dict]:
    items: list[dict] = []
    cursor = None
    for _ in range(10000):
        page = invoke(ws, method, {**params, "page": {"limit": limit, **({"cursor": cursor} if cursor else {})}})
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("paging did not end")


def _objdump_main(path) -> list[tuple[int, int]]:
    """(address, length) of main's instructions as objdump decodes them."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump is not installed")
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "--disassemble=main", str(path)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    addrs = [int(m.group(1), 16) for m in re.finditer(r"^\s+([0-9a-f]+):\t", out, re.M)]
    return list(zip(addrs, [b - a for a, b in zip(addrs, addrs[1:], strict=False)], strict=False))


def test_code_units_of_main_match_objdump_and_name_the_function(sample):
    ws, prog, path = sample
    main = prog.resolve("main", "/")
    fn = invoke(ws, "function.get", {"selector": {"name": "main"}})
    rng = {"start": hex(main), "end": hex(main + fn["size"])}
    units = _all(ws, "code_unit.list", {"scan": {"range": rng}}, 7)
    truth = _objdump_main(path)
    assert [int(u["address"], 16) for u in units] == [a for a, _n in truth] + [int(units[-1]["address"], 16)]
    assert all(u["length"] == n for u, (_a, n) in zip(units, truth, strict=False))
    assert {(u["function"], u["function_name"], u["kind"]) for u in units} == {(hex(main), "main", "instruction")}
    first = units[0]
    assert bytes.fromhex(first["bytes"]) == prog.image.read(main, first["length"])
    calls = [u for u in units if u["flow"] == "call"]
    assert calls and all(u["mnemonic"] == "call" and u["operands"] for u in calls)
    assert sum(u["length"] for u in units) == fn["size"]


def test_code_units_linear_need_a_range_and_page_like_one_call(sample):
    ws, prog, _path = sample
    with pytest.raises(BinlensError) as err:
        invoke(ws, "code_unit.list", {"mode": "linear"})
    assert err.value.target == "/params/scan/range"
    main = prog.resolve("main", "/")
    rng = {"start": hex(main - 0x40), "end": hex(main + 0x40)}
    whole = invoke(ws, "code_unit.list", {"mode": "linear", "scan": {"range": rng}, "page": {"limit": 1000}})
    assert whole["next_cursor"] is None
    assert _all(ws, "code_unit.list", {"mode": "linear", "scan": {"range": rng}}, 5) == whole["items"]
    assert sum(u["length"] for u in whole["items"]) == 0x80


def test_data_units_strings_pointers_symbols_and_globals(sample):
    ws, prog, _path = sample
    units = _all(ws, "data_unit.list", {}, 10)
    by_addr = {int(u["address"], 16): u for u in units}
    starts = sorted(by_addr)
    for a, b in zip(starts, starts[1:], strict=False):  # units never overlap
        assert a + by_addr[a]["length"] <= b
    greeting = by_addr[prog.resolve("greeting", "/")]
    text_at = int(greeting["value"], 16)
    assert greeting["kind"] == "pointer" and greeting["length"] == 8
    assert greeting["representation"] == f'{hex(text_at)} "binlens sample greeting"'
    assert by_addr[text_at] == {**by_addr[text_at], "kind": "string", "value": "binlens sample greeting"}
    ops = by_addr[prog.resolve("ops", "/")]
    assert ops["kind"] == "pointer" and ops["value"] == hex(prog.resolve("twice", "/"))
    assert "(twice)" in ops["representation"]
    counter = by_addr[prog.resolve("counter", "/")]
    assert (counter["kind"], counter["type"], counter["value"]) == ("symbol", "undefined4", "07000000")
    assert counter["representation"] == ".byte 0x07, 0x00, 0x00, 0x00"
    table = by_addr[prog.resolve("table", "/")]
    assert (table["type"], table["length"]) == ("byte[64]", 64)
    assert table["value"].startswith("01000000010000000200000003000000")
    assert any(u["value"] == "unique marker string for xrefs" for u in units if u["kind"] == "string")

    # a typed global replaces the symbol's bytes with the type's value
    invoke(ws, "global_variable.create", {"selector": {"name": "counter"}, "type": "int"})
    again = invoke(ws, "data_unit.list", {"kind": "global"})
    assert [(u["name"], u["type"], u["value"], u["length"]) for u in again["items"]] == [("counter", "int", 7, 4)]

    strings = _all(ws, "data_unit.list", {"kind": "string"}, 1000)
    assert strings and {u["kind"] for u in strings} == {"string"}
    sec = next(s for s in prog.image.sections if s.name == ".rodata")
    ranged = _all(ws, "data_unit.list", {"scan": {"range": {"start": hex(sec.va), "end": hex(sec.end)}}}, 3)
    assert ranged == [u for u in _all(ws, "data_unit.list", {}, 1000) if sec.va <= int(u["address"], 16) < sec.end]


def test_address_resolve_names_the_containing_function(sample):
    ws, prog, _path = sample
    fib = prog.resolve("fib", "/")
    out = invoke(ws, "address.resolve", {"selector": {"name": "fib+0x4"}})
    assert out["function"] == {"name": "fib", "address": hex(fib), "offset": 4}
    data = invoke(ws, "address.resolve", {"selector": {"name": "counter"}})
    assert data["function"] is None and data["section"] == ".data"
    invoke(ws, "symbol.patch", {"selector": {"name": "fib"}, "name": "fibonacci"})
    renamed = invoke(ws, "address.resolve", {"address": hex(fib + 4)})
    assert renamed["function"]["name"] == "fibonacci"


def test_address_context_gathers_comments_bookmarks_function_and_data(sample):
    ws, prog, _path = sample
    main = prog.resolve("main", "/")
    at = invoke(ws, "code_unit.list", {"scan": {"range": {"start": hex(main), "end": hex(main + 64)}}})["items"][2]
    va = at["address"]
    for kind in ("eol", "pre", "plate"):
        invoke(ws, "comment.create", {"selector": {"address": va}, "kind": kind, "text": f"{kind} note"})
    invoke(ws, "bookmark.create", {"selector": {"address": va}, "category": "todo", "note": "look here"})
    invoke(ws, "bookmark.create", {"selector": {"address": va}, "category": "bug", "note": ""})
    out = invoke(ws, "address.context", {"selector": {"address": va}})
    assert out["comments"] == {"eol": "eol note", "pre": "pre note", "plate": "plate note"}
    assert out["bookmarks"] == [{"category": "bug", "note": ""}, {"category": "todo", "note": "look here"}]
    assert out["function"] == {"name": "main", "address": hex(main), "offset": int(va, 16) - main}
    assert out["instruction"] == {"address": va, "text": f"{at['mnemonic']} {at['operands']}".strip()}
    assert (out["section"], out["data"], out["name"]) == (".text", None, None)

    entry = invoke(ws, "address.context", {"selector": {"name": "main"}})
    assert entry["name"] == "main" and entry["comments"] == {} and entry["bookmarks"] == []

    ops = invoke(ws, "address.context", {"selector": {"name": "ops+0x8"}})
    assert ops["function"] is None and ops["instruction"] is None
    assert ops["data"]["kind"] == "pointer" and ops["data"]["value"] == hex(prog.resolve("thrice", "/"))

    with pytest.raises(BinlensError) as err:
        invoke(ws, "address.context", {"selector": {"name": "no_such_symbol"}})
    assert err.value.code == "not_found" and err.value.target == "/params/selector/name"


def test_thread_local_symbols_are_no_data_units(workspace, tmp_path):
    """A TLS symbol's value is an offset in the thread's block, not an address: no unit for it."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    src = tmp_path / "tls.c"
    src.write_text(
        "__thread long tls_a = 5;\n__thread long tls_b = 7;\nlong plain_counter = 6;\n"
        "int main(void) { return (int)(tls_a + tls_b + plain_counter); }\n"
    )
    out = tmp_path / "tls"
    subprocess.run([cc, "-O1", "-o", str(out), str(src)], check=True, capture_output=True)
    prog = workspace.open(out, check_roots=False)
    tls = [s for s in prog.image.symbols if s.name.startswith("tls_")]  # (offsets 0 and 8 in the block)
    units = _all(workspace, "data_unit.list", {"kind": "symbol"}, 1000)
    names = {u["name"] for u in units}
    assert tls and prog.image.is_mapped(max(s.address for s in tls))  # (a PIE maps its headers at 0)
    assert "plain_counter" in names and not {"tls_a", "tls_b"} & names
    assert not {int(u["address"], 16) for u in units} & {s.address for s in tls}
