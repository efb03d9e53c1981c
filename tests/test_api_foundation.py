"""Registry and foundation methods: validation pointers, cursors, budgets, reads, searches, roots."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError
from binlens.workspace import Config, Limits, Workspace
from conftest import run_cli


def call_error(ws, method, params) -> BinlensError:
    with pytest.raises(BinlensError) as err:
        invoke(ws, method, params)
    return err.value


def objdump_bytes(path: Path, symbol: str) -> tuple[int, bytes]:
    """(address, bytes) of a function as `objdump -d` disassembles it."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump is not installed")
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True).stdout
    start = int(re.search(rf"^([0-9a-f]+) <{symbol}>:", out, re.M).group(1), 16)
    raw = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    block = raw.split(f"<{symbol}>:\n", 1)[1].split("\n\n", 1)[0]
    data = bytearray()
    for line in block.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            data += bytes.fromhex(parts[1].replace(" ", ""))
    return start, bytes(data)


@pytest.mark.parametrize("symbol", ["main", "classify", "fib"])
def test_memory_read_matches_objdump(workspace, compile_c, symbol):
    path = compile_c("sample.c", "-O2")
    workspace.open(path, check_roots=False)
    start, want = objdump_bytes(path, symbol)
    got = invoke(workspace, "memory.read", {"address": symbol, "length": len(want)})
    assert got["address"] == hex(start)
    assert bytes.fromhex(got["data"]) == want
    b64 = invoke(workspace, "memory.read", {"address": hex(start), "length": len(want), "encoding": "base64"})
    import base64

    assert base64.b64decode(b64["data"]) == want


def test_validation_errors_point_into_the_request(workspace, compile_c):
    workspace.open(compile_c("sample.c"), check_roots=False)
    assert call_error(workspace, "symbol.list", {"page": {"limit": 5000}}).target == "/params/page/limit"
    err = call_error(workspace, "symbol.list", {"colour": "red"})
    assert (err.code, err.target) == ("invalid_argument", "/params/colour")
    assert call_error(workspace, "symbol.list", {"page": {"bogus": 1}}).target == "/params/page/bogus"
    assert call_error(workspace, "symbol.list", {"page": {"limit": "5"}}).target == "/params/page/limit"  # no coercion
    assert call_error(workspace, "memory.read", {"address": "main"}).target == "/params/length"
    err = call_error(workspace, "symbol.get", {"selector": {"address": "0x1", "name": "main"}})
    assert err.target == "/params/selector"
    err = call_error(workspace, "symbol.get", {"selector": {"name": "no_such_symbol"}})
    assert (err.code, err.target) == ("not_found", "/params/selector/name")
    err = call_error(workspace, "address.resolve", {"address": "nowhere+0x10"})
    assert (err.code, err.target) == ("not_found", "/params/address")
    assert call_error(workspace, "no.such", {}).target == "/method"


def test_address_resolve_symbol_plus_offset(workspace, compile_c):
    path = compile_c("sample.c", "-O0", pie=False)
    workspace.open(path, check_roots=False)
    main = invoke(workspace, "symbol.get", {"selector": {"name": "main"}})
    out = invoke(workspace, "address.resolve", {"address": "main+0x10"})
    assert int(out["address"], 16) == int(main["address"], 16) + 0x10
    assert out["section"] == ".text" and out["perms"] == "r-x" and out["mapped"]
    assert out["symbol"] == {"name": "main", "address": main["address"], "offset": 0x10}
    assert out["file_offset"] == int(out["address"], 16) - 0x400000  # non-PIE: text maps 1:1 above 0x400000


def test_cursor_pages_cover_everything_once_and_bind_to_query_and_program(home, compile_c):
    ws = Workspace(Config(home=home))
    a = ws.open(compile_c("sample.c", "-O0"), check_roots=False)
    b = ws.open(compile_c("sample.c", "-O2"), check_roots=False)
    full = invoke(ws, "symbol.list", {"program": a.handle, "page": {"limit": 1000}})["items"]
    seen, cursor = [], None
    while True:
        page = {"limit": 7} | ({"cursor": cursor} if cursor else {})
        out = invoke(ws, "symbol.list", {"program": a.handle, "page": page})
        seen += out["items"]
        cursor = out["next_cursor"]
        if cursor is None:
            break
    assert seen == full
    first = invoke(ws, "symbol.list", {"program": a.handle, "kind": "function", "page": {"limit": 2}})
    cur = first["next_cursor"]
    err = call_error(ws, "symbol.list", {"program": a.handle, "kind": "object", "page": {"cursor": cur}})
    assert (err.target, "different query" in err.message) == ("/params/page/cursor", True)
    err = call_error(ws, "symbol.list", {"program": b.handle, "kind": "function", "page": {"cursor": cur}})
    assert "another program" in err.message


def test_program_required_when_several_are_open(home, compile_c):
    ws = Workspace(Config(home=home))
    ws.open(compile_c("sample.c", "-O0"), check_roots=False)
    ws.open(compile_c("sample.c", "-O2"), check_roots=False)
    err = call_error(ws, "symbol.list", {})
    assert (err.code, err.target) == ("invalid_argument", "/params/program")


def test_response_budget_refuses_instead_of_cutting(home, compile_c):
    ws = Workspace(Config(home=home, limits=Limits(max_response_bytes=2000)))
    ws.open(compile_c("sample.c"), check_roots=False)
    err = call_error(ws, "symbol.list", {"page": {"limit": 1000}})
    assert err.code == "response_too_large" and err.status == 413
    assert err.details["limit"] == 2000 and err.details["size_at_least"] > 2000
    assert invoke(ws, "symbol.list", {"page": {"limit": 2}})["items"]


def test_same_bytes_reuse_one_database(home, compile_c, tmp_path):
    src = compile_c("sample.c")
    copy = tmp_path / "renamed-copy"
    copy.write_bytes(src.read_bytes())
    one = Workspace(Config(home=home)).open(src, check_roots=False)
    two = Workspace(Config(home=home)).open(copy, check_roots=False)
    assert one.db.path == two.db.path
    assert sorted(p.name for p in (home / "db").glob("*.sqlite")) == [one.db.path.name]
    row = two.db.connect().execute("SELECT value FROM meta WHERE key='schema.core'").fetchone()
    assert row == ("1",)


def test_program_open_only_under_roots(home, compile_c, tmp_path):
    binary = compile_c("sample.c")
    ws = Workspace(Config(home=home, roots=[tmp_path / "allowed"]))
    (tmp_path / "allowed").mkdir()
    err = call_error(ws, "program.open", {"path": str(binary)})
    assert (err.code, err.target) == ("invalid_argument", "/params/path")
    inside = tmp_path / "allowed" / "bin"
    inside.write_bytes(binary.read_bytes())
    link = tmp_path / "allowed" / "escape"
    link.symlink_to(binary)  # a link out of the root is judged by where it points
    assert call_error(ws, "program.open", {"path": str(link)}).target == "/params/path"
    out = invoke(ws, "program.open", {"path": str(inside)})
    assert out["identity"]["format"] == "ELF"
    assert invoke(ws, "program.list", {})["items"][0]["program"] == out["identity"]["program"]
    invoke(ws, "program.close", {})
    assert invoke(ws, "program.list", {})["items"] == []


def test_memory_search_pattern_regex_paging(workspace, compile_c):
    path = compile_c("sample.c", "-O2")
    workspace.open(path, check_roots=False)
    main = invoke(workspace, "memory.read", {"address": "main", "length": 6})
    pattern = " ".join([main["data"][i : i + 2] for i in range(0, 8, 2)] + ["??", "??"])
    hits = invoke(workspace, "memory.search", {"pattern": pattern, "page": {"limit": 1000}})
    assert main["address"] in [h["address"] for h in hits["items"]]
    assert hits["scan"]["complete"] and hits["scan"]["stop_reason"] == "range_end"
    text = invoke(workspace, "memory.search", {"regex": "unique marker string"})
    assert len(text["items"]) == 1 and text["items"][0]["section"] == ".rodata"
    # every zero byte pair, one per page: the cursor resumes where the page stopped
    p1 = invoke(workspace, "memory.search", {"pattern": "00 00", "page": {"limit": 3}})
    assert p1["scan"]["stop_reason"] == "limit" and p1["next_cursor"]
    p2 = invoke(workspace, "memory.search", {"pattern": "00 00", "page": {"limit": 3, "cursor": p1["next_cursor"]}})
    assert int(p2["items"][0]["address"], 16) > int(p1["items"][-1]["address"], 16)
    assert call_error(workspace, "memory.search", {"pattern": "4g"}).target == "/params/pattern"
    assert call_error(workspace, "memory.search", {"regex": "("}).target == "/params/regex"


def test_memory_blocks_and_address_space(workspace, compile_c):
    workspace.open(compile_c("sample.c"), check_roots=False)
    blocks = invoke(workspace, "memory_block.list", {"kind": "section"})["items"]
    text = next(b for b in blocks if b["name"] == ".text")
    assert text["perms"] == "r-x" and text["content"] == "code"
    got = invoke(workspace, "memory_block.get", {"selector": {"address": "main"}})
    assert got["name"] == ".text"
    bss = invoke(workspace, "memory_block.get", {"selector": {"name": ".bss"}})
    assert bss["file_size"] == 0
    spaces = invoke(workspace, "address_space.list", {})["items"]
    assert any(int(s["start"], 16) <= int(text["start"], 16) < int(s["end"], 16) for s in spaces)


def test_interface_lists_methods_with_flat_schemas(workspace):
    out = invoke(workspace, "interface.get", {})
    names = {m["name"] for m in out["methods"]}
    assert {"program.open", "symbol.list", "memory.read", "memory.search", "address.resolve"} <= names
    for m in out["methods"]:
        text = json.dumps(m["input_schema"])
        assert "$ref" not in text and "$defs" not in text
        assert m["effect"] in ("read-only", "mutation", "destructive mutation", "lifecycle")
    one = invoke(workspace, "interface.get", {"method": "memory.read"})["methods"][0]
    assert one["input_schema"]["properties"]["length"]["maximum"] == 65536
    assert one["input_schema"]["additionalProperties"] is False


def test_cli_info_symbols_methods_query(home, compile_c):
    path = compile_c("sample.c", "-O2")
    info = run_cli("info", str(path), home=home)
    assert info.returncode == 0 and "x86-64" in info.stdout and ".text" in info.stdout
    syms = run_cli("symbols", str(path), "--kind", "import", "--json", home=home)
    items = json.loads(syms.stdout)["items"]
    assert {"printf", "puts", "exit"} <= {s["name"] for s in items}
    assert {s["library"] for s in items if s["name"] in ("printf", "puts", "exit")} == {"libc.so.6"}
    methods = run_cli("methods", home=home)
    assert "memory.search" in methods.stdout
    ok = run_cli("query", "-b", str(path), '{"method":"address.resolve","params":{"address":"main"}}', home=home)
    assert ok.returncode == 0 and json.loads(ok.stdout)["result"]["symbol"]["name"] == "main"
    assert ok.stdout.count("\n") == 1
    usage = run_cli("query", "-b", str(path), "{not json", home=home)
    assert usage.returncode == 2 and json.loads(usage.stdout)["error"]["code"] == "invalid_argument"
    limit = run_cli("query", "-b", str(path), '{"method":"symbol.list","params":{"page":{"limit":5000}}}', home=home)
    out = json.loads(limit.stdout)
    assert limit.returncode == 1 and out["error"]["target"] == "/params/page/limit"
    assert out["schema_version"] == 1 and out["program"]["file_name"] == path.name  # identity even on failure
    unknown = run_cli("query", "-b", str(path), '{"method":"nope.nope"}', home=home)
    assert unknown.returncode == 2 and json.loads(unknown.stdout)["error"]["target"] == "/method"
    stdin = run_cli("query", "-b", str(path), "-", stdin='{"method":"session.get","params":{}}', home=home)
    assert json.loads(stdin.stdout)["result"]["programs"][0]["file_name"] == path.name


def test_symbol_list_scan_range(workspace, compile_c):
    workspace.open(compile_c("sample.c", "-O2"), check_roots=False)
    main = invoke(workspace, "symbol.get", {"selector": {"name": "main"}})
    start = int(main["address"], 16)
    rng = {"start": hex(start), "end": hex(start + 1)}
    out = invoke(workspace, "symbol.list", {"scan": {"range": rng}, "kind": "function"})
    assert [s["name"] for s in out["items"]] == ["main"]
    assert out["scan"] == {"complete": True, "stop_reason": "range_end", "scanned_to": None}
    err = call_error(workspace, "symbol.list", {"scan": {"range": {"start": "0x10", "end": "0x5"}}})
    assert err.target == "/params/scan/range/end"
    assert call_error(workspace, "symbol.list", {"scan": {"timeout_ms": 5}}).target == "/params/scan/timeout_ms"


def test_memory_search_backtracking_regex_runs_beside_other_threads(workspace, tmp_path):
    """A pathological regex neither stalls other threads (GIL released) nor outlives its scan timeout."""
    src = tmp_path / "zeros.c"
    src.write_text("char zeros[1 << 20] = {1};\nint main(void) { return zeros[4096]; }\n")
    binary = tmp_path / "zeros"
    subprocess.run(["cc", "-O1", "-o", str(binary), str(src)], check=True, capture_output=True)
    workspace.open(binary, check_roots=False)
    # exponential backtracking over every run of NULs: seconds per 64 KiB chunk
    params = {"regex": r"(?:\x00|\x00\x00){1,24}?\x01", "scan": {"timeout_ms": 1500}}
    result: dict = {}
    gaps: list[float] = []

    def search() -> None:
        result.update(invoke(workspace, "memory.search", params))

    worker = threading.Thread(target=search)
    t0 = time.monotonic()
    worker.start()
    last = time.monotonic()
    while worker.is_alive():
        time.sleep(0.002)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    elapsed = time.monotonic() - t0
    assert result["scan"]["stop_reason"] == "timeout" and not result["scan"]["complete"]
    assert result["scan"]["scanned_to"] and result["items"] == []
    # hang bounds: the regex runs in a killable process, so neither depends on the pattern's cost
    assert elapsed < 20, f"the search ran {elapsed:.1f}s past a 1.5 s scan timeout"
    # with the GIL held through the match this thread would stall until the regex ended
    assert max(gaps) < 2, f"the main thread stalled {max(gaps):.2f}s while the regex ran"
