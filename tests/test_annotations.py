"""Annotation methods on a compiled sample: success and failure of each, undo/redo, batches, export/import."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from binlens.api import REGISTRY, invoke
from binlens.errors import BinlensError
from binlens.workspace import Config, Workspace


def call(ws: Workspace, method: str, **params: Any) -> Any:
    return invoke(ws, method, params)


def fails(ws: Workspace, code: str, method: str, **params: Any) -> BinlensError:
    with pytest.raises(BinlensError) as info:
        invoke(ws, method, params)
    assert info.value.code == code, info.value.to_dict()
    return info.value


@pytest.fixture()
def sample(compile_c) -> Path:
    return compile_c("sample.c", "-O0")


@pytest.fixture()
def ws(workspace: Workspace, sample: Path) -> Workspace:
    workspace.open(sample, check_roots=False)
    return workspace


def snapshot(ws: Workspace) -> dict[str, Any]:
    doc = call(ws, "annotations.export")
    counter = call(ws, "memory.read", address="counter", length=4)
    return {"doc": doc, "counter": counter}


# --- names ------------------------------------------------------------------------------------------
def test_symbol_patch_rename_conflict_and_reset(ws):
    prog = next(iter(ws.programs.values()))
    fib = prog.resolve("fib", "/")
    out = call(ws, "symbol.patch", selector={"name": "fib"}, name="fibonacci")
    assert out["name"] == "fibonacci" and out["previous_name"] == "fib" and out["journal_id"] >= 1
    assert prog.name_at(fib) == "fibonacci" and prog.user_names[fib] == "fibonacci"
    assert prog.resolve("fibonacci", "/") == fib  # the new name resolves everywhere an address is accepted
    sym = call(ws, "symbol.get", selector={"name": "fibonacci"})
    assert sym["name"] == "fib" and sym["user_name"] == "fibonacci"
    listed = [s for s in call(ws, "symbol.list", name="fib")["items"] if s["kind"] == "function"]
    assert listed and all(s["user_name"] == "fibonacci" for s in listed)
    err = fails(ws, "conflict", "symbol.patch", selector={"name": "main"}, name="fibonacci")
    assert err.target == "/params/name" and err.details["address"] == hex(fib)
    fails(ws, "conflict", "symbol.patch", selector={"name": "main"}, name="classify")  # a symbol elsewhere
    fails(ws, "not_found", "symbol.patch", selector={"name": "no_such_symbol"}, name="x")
    fails(ws, "invalid_argument", "symbol.patch", selector={"name": "main"}, name="0x1234")
    out = call(ws, "symbol.patch", selector={"address": hex(fib)}, name=None)
    assert out["name"] == "fib" and out["original_name"] == "fib" and fib not in prog.user_names
    # the user name is free again
    call(ws, "symbol.patch", selector={"name": "main"}, name="fibonacci")
    assert prog.resolve("fibonacci", "/") == prog.resolve("main", "/")


def test_names_load_on_open(home, sample):
    ws1 = Workspace(Config(home=home))
    ws1.open(sample, check_roots=False)
    call(ws1, "symbol.patch", selector={"name": "checksum"}, name="djb2_hash")
    ws2 = Workspace(Config(home=home))
    prog2 = ws2.open(sample, check_roots=False)
    assert "djb2_hash" in prog2.user_names.values()
    assert prog2.name_at(prog2.resolve("djb2_hash", "/")) == "djb2_hash"


# --- comments and bookmarks --------------------------------------------------------------------------
def test_comment_crud(ws):
    for kind in ("eol", "pre", "plate"):
        out = call(ws, "comment.create", selector={"name": "main"}, kind=kind, text=f"{kind} text")
        assert out["comment"]["kind"] == kind and out["comment"]["name"] == "main"
    fails(ws, "conflict", "comment.create", selector={"name": "main"}, kind="eol", text="again")
    assert call(ws, "comment.get", selector={"name": "main"}, kind="pre")["text"] == "pre text"
    fails(ws, "not_found", "comment.get", selector={"name": "fib"}, kind="pre")
    fails(ws, "not_found", "comment.patch", selector={"name": "fib"}, text="x")
    assert call(ws, "comment.patch", selector={"name": "main"}, text="changed")["comment"]["text"] == "changed"
    call(ws, "comment.upsert", selector={"name": "fib"}, text="recursive")
    call(ws, "comment.upsert", selector={"name": "fib"}, text="recursive, exponential")
    listed = call(ws, "comment.list")["items"]
    assert [c["kind"] for c in listed if c["name"] == "main"] == ["eol", "plate", "pre"]
    assert call(ws, "comment.list", kind="plate")["items"][0]["text"] == "plate text"
    assert call(ws, "comment.list", text="recursive*")["items"][0]["name"] == "fib"
    page = call(ws, "comment.list", page={"limit": 2})
    assert len(page["items"]) == 2 and page["next_cursor"]
    rest = call(ws, "comment.list", page={"limit": 2, "cursor": page["next_cursor"]})
    assert len(page["items"]) + len(rest["items"]) == 4
    call(ws, "comment.delete", selector={"name": "main"}, kind="plate")
    fails(ws, "not_found", "comment.delete", selector={"name": "main"}, kind="plate")
    fails(ws, "invalid_argument", "comment.create", selector={"name": "main"}, kind="side", text="x")


def test_bookmark_crud(ws):
    call(ws, "bookmark.create", selector={"name": "die"}, category="todo", note="check exit code")
    call(ws, "bookmark.create", selector={"name": "die"}, category="noreturn")
    fails(ws, "conflict", "bookmark.create", selector={"name": "die"}, category="todo")
    items = call(ws, "bookmark.list")["items"]
    assert {(b["category"], b["note"]) for b in items} == {("todo", "check exit code"), ("noreturn", "")}
    assert len(call(ws, "bookmark.list", category="todo")["items"]) == 1
    call(ws, "bookmark.delete", selector={"name": "die"}, category="todo")
    fails(ws, "not_found", "bookmark.delete", selector={"name": "die"}, category="todo")


# --- data types -------------------------------------------------------------------------------------
def test_data_type_create_get_patch_delete(ws):
    out = call(
        ws,
        "data_type.create",
        declaration="typedef struct packet { unsigned char kind; unsigned int len : 12, flags : 4; "
        "struct packet *next; char body[]; } packet_t;",
        category="/net",
    )
    names = [i["name"] for i in out["items"]]
    assert names == ["struct packet", "packet_t"]
    s = call(ws, "data_type.get", name="struct packet")
    assert s["size"] == 16 and s["alignment"] == 8
    fields = {f["name"]: f for f in s["fields"]}
    assert fields["len"]["offset"] == 0 and fields["len"]["bit_offset"] == 8 and fields["len"]["bit_size"] == 12
    assert fields["flags"]["bit_offset"] == 20 and fields["next"]["offset"] == 8 and fields["body"]["offset"] == 16
    assert fields["next"]["type"] == "struct packet *"
    assert call(ws, "data_type.get", name="packet_t")["target"] == "struct packet"
    assert [c["path"] for c in call(ws, "data_type_category.list")["items"]] == ["/builtin", "/libc", "/net", "/win32"]
    fails(ws, "conflict", "data_type.create", declaration="struct packet { int x; };")
    fails(ws, "conflict", "data_type.create", declaration="typedef int size_t;")  # built-in
    fails(ws, "not_found", "data_type.get", name="struct nope")
    fails(ws, "not_found", "data_type.patch", name="struct nope", declaration="struct nope { int a; };")
    out = call(ws, "data_type.patch", name="struct packet", declaration="struct packet { int a; long b; };")
    assert out["items"][0]["size"] == 16 and out["items"][0]["category"] == "/net"
    err = fails(ws, "conflict", "data_type.delete", name="struct packet")  # packet_t uses it
    assert "packet_t" in err.message
    call(ws, "data_type.delete", name="packet_t")
    call(ws, "data_type.delete", name="struct packet")
    fails(ws, "not_found", "data_type.delete", name="struct packet")


def test_bad_declaration_points_at_the_field_with_the_parser_message(ws):
    err = fails(ws, "invalid_argument", "data_type.create", declaration="struct s {\n  int a;\n  int b int c;\n};")
    assert err.target == "/params/declaration"
    assert err.details["line"] == 3 and "before: int" in err.message  # pycparser's own words
    err = fails(ws, "invalid_argument", "data_type.create", declaration="struct s {\n  int a;\n  mystery_t b;\n};")
    assert "unknown type name 'mystery_t'" in err.message and err.details["line"] == 3
    err = fails(ws, "invalid_argument", "data_type.create", declaration="struct s { int a; struct undefined u; };")
    assert err.details["field"] == "u" and "incomplete" in err.message
    err = fails(ws, "invalid_argument", "data_type.create", declaration="struct s { int a; int a; };")
    assert err.details["field"] == "a"
    fails(ws, "invalid_argument", "data_type.create", declaration="int x;")
    fails(ws, "invalid_argument", "data_type.create", declaration="int f(void) { return 1; }")
    # in a batch the error points into the item
    err = fails(
        ws,
        "invalid_argument",
        "batch.execute",
        items=[{"method": "data_type.create", "params": {"declaration": "struct q { int x int y; };"}}],
    )
    assert err.target == "/params/items/0/params/declaration"


def test_builtin_libc_and_win32_types(ws):
    assert call(ws, "data_type.get", name="size_t")["size"] == 8
    assert call(ws, "data_type.get", name="DWORD")["size"] == 4
    assert call(ws, "data_type.get", name="GUID")["size"] == 16
    assert call(ws, "data_type.get", name="struct timespec")["size"] == 16
    assert call(ws, "data_type.get", name="long double")["size"] == 16
    listed = call(ws, "data_type.list", category="/win32", name="H*", page={"limit": 1000})["items"]
    assert {"HANDLE", "HMODULE", "HRESULT"} <= {t["name"] for t in listed}
    proto = call(ws, "data_type.create", declaration="int __cdecl_like(const char *fmt, ...);")["items"][0]
    assert proto["kind"] == "function" and proto["variadic"] and proto["parameters"][0]["type"] == "const char *"


# --- globals ----------------------------------------------------------------------------------------
def test_global_variables_decode_values(ws):
    out = call(ws, "global_variable.create", selector={"name": "table"}, type="int [16]", name="fib_table")
    g = out["global_variable"]
    assert g["value"] == [1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987]
    assert g["name"] == "fib_table" and g["size"] == 64
    assert call(ws, "global_variable.get", selector={"name": "fib_table"})["type"] == "int [16]"
    fails(ws, "conflict", "global_variable.create", selector={"name": "fib_table"}, type="int")
    fails(ws, "conflict", "global_variable.create", selector={"name": "fib_table+0x8"}, type="int")  # overlap
    call(ws, "global_variable.create", selector={"name": "counter"}, type="int")
    assert call(ws, "global_variable.get", selector={"name": "counter"})["value"] == 7
    call(ws, "data_type.create", declaration="struct pair { short lo; short hi; };")
    out = call(ws, "global_variable.patch", selector={"name": "counter"}, type="struct pair")
    assert out["global_variable"]["value"] == {"lo": 7, "hi": 0}
    err = fails(ws, "invalid_argument", "global_variable.patch", selector={"name": "counter"}, type="strct pair")
    assert err.target == "/params/type"
    fails(ws, "invalid_argument", "global_variable.create", selector={"name": "ops"}, type="void")
    fails(ws, "not_found", "global_variable.get", selector={"name": "ops"})
    fails(ws, "not_found", "global_variable.patch", selector={"name": "ops"}, type="int")
    call(ws, "global_variable.upsert", selector={"name": "ops"}, type="int (*[2])(int)")
    ops = call(ws, "global_variable.get", selector={"name": "ops"})
    prog = next(iter(ws.programs.values()))
    assert ops["value"] == [hex(prog.resolve("twice", "/")), hex(prog.resolve("thrice", "/"))]
    assert [g["name"] for g in call(ws, "global_variable.list")["items"]] == sorted(
        ["counter", "fib_table", "ops"], key=lambda n: prog.resolve(n, "/")
    )
    call(ws, "global_variable.delete", selector={"name": "counter"})
    fails(ws, "not_found", "global_variable.delete", selector={"name": "counter"})


# --- patches ----------------------------------------------------------------------------------------
def test_memory_write_and_export(ws, sample, tmp_path):
    file_sha = hashlib.sha256(sample.read_bytes()).hexdigest()
    before = call(ws, "memory.read", address="counter", length=4)
    assert before == {**before, "data": "07000000", "patched": False}
    out = call(ws, "memory.write", address="counter", data="2a000000")
    assert out["patched_bytes"] == 1
    after = call(ws, "memory.read", address="counter", length=4)
    assert after["data"] == "2a000000" and after["patched"] is True
    assert hashlib.sha256(sample.read_bytes()).hexdigest() == file_sha  # the file itself is never touched
    call(ws, "global_variable.create", selector={"name": "counter"}, type="int")
    assert call(ws, "global_variable.get", selector={"name": "counter"})["value"] == 42
    fails(ws, "invalid_argument", "memory.write", address="counter", data="zz")
    fails(ws, "invalid_argument", "memory.write", address="0x10", data="00", encoding="base64")
    target = tmp_path / "patched"
    res = call(ws, "program.export", path=str(target))
    data = target.read_bytes()
    assert res["sha256"] == hashlib.sha256(data).hexdigest() and res["patched_bytes"] == 1
    original = sample.read_bytes()
    diff = [i for i in range(len(data)) if data[i] != original[i]]
    prog = next(iter(ws.programs.values()))
    assert diff == [prog.image.va_to_offset(prog.resolve("counter", "/"))]
    assert data[diff[0]] == 0x2A
    assert not list(tmp_path.glob(".patched.*"))  # no temporary file left behind
    fails(ws, "conflict", "program.export", path=str(target))
    call(ws, "program.export", path=str(target), overwrite=True)
    fails(ws, "conflict", "program.export", path=str(sample))
    fails(ws, "not_found", "program.export", path=str(tmp_path / "no" / "dir" / "x"))
    # writing the original bytes back removes the patch
    call(ws, "memory.write", address="counter", data="07000000")
    assert call(ws, "memory.read", address="counter", length=4)["patched"] is False


def test_export_refuses_paths_outside_roots(home, sample, tmp_path):
    ws = Workspace(Config(home=home, roots=[sample.parent]))
    ws.open(sample)
    err = fails(ws, "invalid_argument", "program.export", path=str(tmp_path / "elsewhere"))
    assert err.target == "/params/path"


# --- prototypes -------------------------------------------------------------------------------------
def test_function_patch_and_parameters(ws):
    out = call(ws, "function.patch", selector={"name": "add_numbers"}, prototype="int add(int a, int b)")
    assert out["name"] == "add" and out["prototype"]["declaration"] == "int add(int a, int b)"
    call(ws, "function.patch", selector={"name": "add"}, calling_convention="sysv", return_type="long")
    p = call(ws, "function_prototype.get", selector={"name": "add"})["prototype"]
    assert p["return_type"] == "long" and p["calling_convention"] == "sysv"
    out = call(ws, "function_parameter.create", function={"name": "add"}, name="bias", type="const char *", ordinal=0)
    assert [q["name"] for q in out["prototype"]["parameters"]] == ["bias", "a", "b"]
    fails(ws, "conflict", "function_parameter.create", function={"name": "add"}, name="a", type="int")
    fails(ws, "conflict", "function_parameter.patch", function={"name": "add"}, ordinal=0, name="b")
    out = call(ws, "function_parameter.patch", function={"name": "add"}, ordinal=0, type="size_t")
    assert out["prototype"]["parameters"][0]["type"] == "size_t"
    fails(ws, "not_found", "function_parameter.patch", function={"name": "add"}, ordinal=7, name="z")
    out = call(ws, "function_parameter.delete", function={"name": "add"}, ordinal=0)
    assert [q["name"] for q in out["prototype"]["parameters"]] == ["a", "b"]
    fails(ws, "not_found", "function_parameter.delete", function={"name": "add"}, ordinal=2)
    fails(ws, "not_found", "function.patch", selector={"name": "counter"}, name="x")  # data, not a function
    fails(ws, "conflict", "function.patch", selector={"name": "fib"}, name="main")
    err = fails(ws, "invalid_argument", "function.patch", selector={"name": "fib"}, prototype="int fib(badtype n)")
    assert err.target == "/params/prototype" and "badtype" in err.message
    fails(ws, "invalid_argument", "function.patch", selector={"name": "fib"}, calling_convention="stdcall")
    fails(ws, "invalid_argument", "function_parameter.create", function={"name": "fib"}, name="v", type="void")


def test_function_create_delete_through_the_engine(ws):
    # the analysis engine is attached: create/delete re-analyse locally and journal the user's choice
    main = int(call(ws, "function.get", selector={"name": "main"})["address"], 16)
    inner = hex(main + 4)
    call(ws, "function.create", selector={"address": inner})
    assert call(ws, "function.get", selector={"address": inner})["address"] == inner
    fails(ws, "conflict", "function.create", selector={"address": inner})
    call(ws, "function.delete", selector={"address": inner})
    assert call(ws, "function.get", selector={"address": inner})["address"] == hex(main)


# --- undo / redo ------------------------------------------------------------------------------------
EDITS: list[tuple[str, dict[str, Any]]] = [
    ("symbol.patch", {"selector": {"name": "fib"}, "name": "fibo"}),
    ("comment.create", {"selector": {"name": "main"}, "kind": "pre", "text": "hello"}),
    ("comment.upsert", {"selector": {"name": "main"}, "kind": "eol", "text": "x"}),
    ("bookmark.create", {"selector": {"name": "main"}, "category": "c", "note": "n"}),
    ("data_type.create", {"declaration": "typedef struct s { int a; } s_t;"}),
    ("global_variable.create", {"selector": {"name": "counter"}, "type": "unsigned int", "name": "cnt"}),
    ("memory.write", {"address": "counter", "data": "ffff"}),
    ("function.patch", {"selector": {"name": "classify"}, "prototype": "int classify(int value)"}),
    ("function_parameter.create", {"function": {"name": "apply"}, "name": "w", "type": "int"}),
]
SETUP: list[tuple[str, dict[str, Any]]] = [
    ("comment.create", {"selector": {"name": "fib"}, "text": "old"}),
    ("bookmark.create", {"selector": {"name": "fib"}}),
    ("data_type.create", {"declaration": "struct old { int a; };"}),
    ("global_variable.create", {"selector": {"name": "greeting"}, "type": "const char *"}),
    ("function.patch", {"selector": {"name": "die"}, "prototype": "void die(const char *why)"}),
    ("memory.write", {"address": "counter", "data": "01"}),
]
MORE_EDITS: list[tuple[str, dict[str, Any]]] = [
    ("comment.patch", {"selector": {"name": "fib"}, "text": "new"}),
    ("comment.delete", {"selector": {"name": "fib"}}),
    ("bookmark.delete", {"selector": {"name": "fib"}}),
    ("data_type.upsert", {"declaration": "struct old { long a; char b; };"}),
    ("data_type.patch", {"name": "struct old", "category": "/moved"}),
    ("data_type.delete", {"name": "struct old"}),
    ("global_variable.patch", {"selector": {"name": "greeting"}, "type": "unsigned long"}),
    ("global_variable.delete", {"selector": {"name": "greeting"}}),
    ("function_parameter.patch", {"function": {"name": "die"}, "ordinal": 0, "name": "reason"}),
    ("function_parameter.delete", {"function": {"name": "die"}, "ordinal": 0}),
    ("memory.write", {"address": "counter", "data": "07"}),
    ("symbol.patch", {"selector": {"name": "die"}, "name": None}),
]


@pytest.mark.parametrize("method,params", EDITS + MORE_EDITS, ids=[m for m, _ in EDITS + MORE_EDITS])
def test_undo_redo_round_trip(ws, method, params):
    for m, p in SETUP:
        call(ws, m, **p)
    if method == "symbol.patch" and params["name"] is None:
        call(ws, "symbol.patch", selector={"name": "die"}, name="fatal")
        params = {**params, "selector": {"name": "fatal"}}
    s0 = snapshot(ws)
    result = call(ws, method, **params)
    assert result["journal_id"] is not None
    s1 = snapshot(ws)
    assert s1 != s0
    undone = call(ws, "journal.undo")["entries"]
    assert [e["id"] for e in undone] == [result["journal_id"]] and undone[0]["state"] == "undone"
    assert snapshot(ws) == s0
    call(ws, "journal.redo")
    assert snapshot(ws) == s1
    fails(ws, "not_found", "journal.redo")


def test_undo_everything_and_journal_shape(ws):
    s0 = snapshot(ws)
    ids = [call(ws, m, **p)["journal_id"] for m, p in EDITS]
    entries = call(ws, "journal.list")["items"]
    assert [e["id"] for e in entries] == ids
    e = entries[0]
    assert e["method"] == "symbol.patch" and e["client"].startswith("local/") and e["time"].endswith("Z")
    assert e["changes"] == [
        {"kind": "name", "key": [e["changes"][0]["key"][0]], "before": None, "after": {"name": "fibo"}}
    ]
    full = snapshot(ws)
    call(ws, "journal.undo", count=len(ids))
    assert snapshot(ws) == s0
    fails(ws, "not_found", "journal.undo")
    call(ws, "journal.redo", count=3)
    call(ws, "comment.create", selector={"name": "fib"}, text="new branch")  # abandons the rest of the redo stack
    fails(ws, "not_found", "journal.redo")
    states = [x["state"] for x in call(ws, "journal.list", page={"limit": 1000})["items"]]
    assert states.count("abandoned") == len(ids) - 3 and states.count("done") == 4
    assert snapshot(ws) != full
    newest = call(ws, "journal.list", newest_first=True, page={"limit": 2})
    assert newest["items"][0]["method"] == "comment.create" and newest["next_cursor"]


# --- batches ----------------------------------------------------------------------------------------
def test_all_or_none_batch_with_one_bad_item_changes_nothing(ws):
    call(ws, "comment.create", selector={"name": "fib"}, text="existing")
    s0 = snapshot(ws)
    j0 = call(ws, "journal.list", page={"limit": 1000})["items"]
    items = [
        {"method": "symbol.patch", "params": {"selector": {"name": "main"}, "name": "entry_main"}},
        {"method": "data_type.create", "params": {"declaration": "struct t { int a; };"}},
        {"method": "memory.write", "params": {"address": "counter", "data": "aa"}},
        {"method": "comment.create", "params": {"selector": {"name": "fib"}, "text": "dup"}},  # conflict
        {"method": "bookmark.create", "params": {"selector": {"name": "main"}}},
    ]
    err = fails(ws, "conflict", "batch.execute", items=items)
    assert err.target == "/params/items/3/params/selector" and err.details["rolled_back"] is True
    assert snapshot(ws) == s0
    assert call(ws, "journal.list", page={"limit": 1000})["items"] == j0
    prog = next(iter(ws.programs.values()))
    assert "entry_main" not in prog.user_names.values()  # the in-memory names were rolled back too
    items[3] = {"method": "comment.create", "params": {"selector": {"name": "fib"}, "kind": "pre", "text": "ok"}}
    out = call(ws, "batch.execute", items=items)
    assert out["succeeded"] == 5 and out["failed"] == 0
    entries = call(ws, "journal.list", page={"limit": 1000})["items"][len(j0) :]
    assert len(entries) == 5 and {e["batch"] for e in entries} == {out["batch_id"]}
    assert prog.name_at(prog.resolve("entry_main", "/")) == "entry_main"


def test_per_item_batch_and_refusals(ws):
    items = [
        {"method": "comment.create", "params": {"selector": {"name": "fib"}, "text": "a"}},
        {"method": "comment.create", "params": {"selector": {"name": "fib"}, "text": "b"}},
        {"method": "comment.get", "params": {"selector": {"name": "fib"}}},
    ]
    out = call(ws, "batch.execute", mode="per_item", items=items)
    assert [i["ok"] for i in out["items"]] == [True, False, True]
    assert out["items"][1]["error"]["code"] == "conflict"
    assert out["items"][1]["error"]["target"] == "/params/items/1/params/selector"
    assert out["items"][2]["result"]["text"] == "a"
    err = fails(ws, "invalid_argument", "batch.execute", items=[{"method": "batch.execute", "params": {}}])
    assert err.target == "/params/items/0/method"
    fails(ws, "invalid_argument", "batch.execute", items=[])
    fails(ws, "invalid_argument", "batch.execute", items=[{"method": "program.close", "params": {}}])
    err = fails(ws, "not_found", "batch.execute", items=[{"method": "nope.nope", "params": {}}])
    assert err.target == "/params/items/0/method"
    many = [{"method": "comment.get", "params": {"selector": {"name": "fib"}}}] * 1001
    fails(ws, "invalid_argument", "batch.execute", items=many)


# --- export / import --------------------------------------------------------------------------------
def test_export_import_round_trip(ws, home, sample):
    for m, p in EDITS:
        call(ws, m, **p)
    doc = call(ws, "annotations.export")
    assert doc["format"] == "binlens.annotations" and doc["names"] and doc["patches"] and doc["data_types"]
    journal = call(ws, "journal.list", page={"limit": 1000})["items"]
    out = call(ws, "annotations.import", document=doc)
    assert out == {"journal_id": None, "changes": 0}
    assert call(ws, "annotations.export") == doc
    assert call(ws, "journal.list", page={"limit": 1000})["items"] == journal
    # into a fresh database: the same document comes back out, as one undoable journal entry
    other = Workspace(Config(home=home / "other"))
    other.open(sample, check_roots=False)
    out = call(other, "annotations.import", document=doc)
    assert out["journal_id"] == 1 and out["changes"] > 0
    assert call(other, "annotations.export") == doc
    assert call(other, "memory.read", address="counter", length=2)["data"] == "ffff"
    call(other, "journal.undo")
    assert call(other, "annotations.export")["names"] == []
    # replace removes what the document lacks
    call(ws, "comment.create", selector={"name": "fib"}, text="extra")
    out = call(ws, "annotations.import", document=doc, mode="replace")
    assert out["changes"] == 1 and call(ws, "annotations.export") == doc
    # a merged type may use types already in the database; a replace must bring them along
    partial = {**doc, "data_types": [], "names": [], "patches": [], "global_variables": [], "function_prototypes": []}
    partial["data_types"] = [
        {
            "name": "struct uses_s",
            "kind": "struct",
            "category": "/user",
            "declaration": "struct uses_s { s_t a; };",
            "position": 99,
        }
    ]
    assert call(ws, "annotations.import", document=partial)["changes"] == 1
    err = fails(ws, "invalid_argument", "annotations.import", document=partial, mode="replace")
    assert err.target == "/params/document/data_types"
    bad = {**doc, "program": {**doc["program"], "sha256": "0" * 64}}
    fails(ws, "conflict", "annotations.import", document=bad)
    bad = {**doc, "names": [{"address": "0x1", "name": "dup"}, {"address": "0x2", "name": "dup"}]}
    err = fails(ws, "conflict", "annotations.import", document=bad)
    assert err.target == "/params/document/names/1/name"


# --- read-only --------------------------------------------------------------------------------------
ANNOTATION_MODULES = {
    "binlens.api.symbol_edit",
    "binlens.api.comment",
    "binlens.api.bookmark",
    "binlens.api.data_type",
    "binlens.api.global_variable",
    "binlens.api.patch",
    "binlens.api.journal",
    "binlens.api.batch",
    "binlens.api.function_edit",
    "binlens.api.annotations",
}


def test_read_only_refuses_every_mutation(home, sample, tmp_path):
    ws = Workspace(Config(home=home, read_only=True))
    ws.open(sample, check_roots=False)
    mutating = sorted(
        name for name, spec in REGISTRY.items() if spec.func.__module__ in ANNOTATION_MODULES and spec.mutates
    )
    expected = {
        "symbol.patch", "function.patch", "function.create", "function.delete", "function_parameter.create",
        "function_parameter.patch", "function_parameter.delete", "comment.create", "comment.patch", "comment.upsert",
        "comment.delete", "bookmark.create", "bookmark.delete", "data_type.create", "data_type.patch",
        "data_type.upsert", "data_type.delete", "global_variable.create", "global_variable.patch",
        "global_variable.upsert", "global_variable.delete", "memory.write", "program.export", "batch.execute",
        "journal.undo", "journal.redo", "annotations.import",
    }  # fmt: skip
    assert set(mutating) == expected
    for name in mutating:
        err = fails(ws, "unavailable", name, selector={"name": "main"})
        assert name in err.message
    assert not (tmp_path / "x").exists()
    # reads still work
    assert call(ws, "comment.list")["items"] == []
    assert call(ws, "journal.list")["items"] == []
    assert REGISTRY["comment.delete"].effect == "destructive mutation"
    assert REGISTRY["comment.create"].effect == "mutation"


def test_a_writer_holding_the_database_makes_edits_busy_not_internal(ws):
    import sqlite3

    prog = next(iter(ws.programs.values()))
    other = sqlite3.connect(prog.db.path, timeout=0.1, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process in the middle of a long write
    try:
        err = fails(ws, "busy", "comment.create", selector={"name": "main"}, text="x")
        assert "retry" in err.message
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert call(ws, "comment.create", selector={"name": "main"}, text="x")["journal_id"] == 1


def test_remaining_failure_paths(ws):
    fails(ws, "not_found", "function_prototype.get", selector={"name": "counter"})
    assert call(ws, "function_prototype.get", selector={"name": "fib"})["prototype"] is None
    err = fails(ws, "invalid_argument", "comment.list", page={"cursor": "bogus"})
    assert err.target == "/params/page/cursor"
    fails(ws, "invalid_argument", "journal.list", page={"cursor": "bogus"})
    fails(ws, "invalid_argument", "bookmark.list", page={"limit": 0})
    fails(ws, "conflict", "data_type.upsert", declaration="typedef unsigned int DWORD;")
    err = fails(ws, "invalid_argument", "data_type.upsert", declaration="struct z { int a[-1]; };")
    assert "negative" in err.message
    fails(ws, "conflict", "data_type.patch", name="size_t", category="/x")
    fails(ws, "invalid_argument", "global_variable.upsert", selector={"name": "counter"}, type="struct never_defined")
    fails(ws, "invalid_argument", "global_variable.create", selector={"address": "0x7fffffffffff0000"}, type="int")
    call(ws, "symbol.patch", selector={"address": "0xffffffffffff0000"}, name="high")  # (above 2**63 too)
    assert call(ws, "address.resolve", address="high")["address"] == "0xffffffffffff0000"
    fails(ws, "invalid_argument", "memory.write", address="counter", data="00" * 65537)
    fails(ws, "invalid_argument", "function.patch", selector={"name": "fib"})
    err = fails(ws, "invalid_argument", "comment.create", selector={"name": "fib"}, text="x", color="red")
    assert err.target == "/params/color"


PATHOLOGICAL = {
    "deep pointers": ("typedef int " + "*" * 20000 + "p;", "nests more than"),
    "deep parentheses": ("typedef int " + "(" * 5000 + "x" + ")" * 5000 + ";", "cannot parse"),
    "deep arrays": ("typedef int x" + "[2]" * 3000 + ";", "nests more than"),
    "deep structs": ("struct s { " + "struct { " * 500 + "int a;" + " } f;" * 500 + " };", "cannot parse"),
    "contains itself": ("struct me { struct me m; };", "incomplete type struct me"),
    "mutual containment": ("struct ma; struct mb { struct ma a; }; struct ma { struct mb b; };", "incomplete type"),
    "enumerator too big": ("enum big { A = 1 << 70 };", "does not fit in 64 bits"),
    "division by zero": ("typedef int z[1/0];", "division by zero"),
    "array too large": ("typedef char huge[1ULL << 62];", "too large"),
    "control bytes": ("struct \x00 { int a; };", "Illegal character"),
}


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_pathological_declarations_are_clear_errors(ws, name):
    text, words = PATHOLOGICAL[name]
    err = fails(ws, "invalid_argument", "data_type.create", declaration=text)
    assert words in err.message and err.target == "/params/declaration"
    assert call(ws, "journal.list")["items"] == []


def test_annotations_at_and_above_2_63(workspace, compile_c, home) -> None:  # noqa: ANN001
    """Code linked as a kernel is (0xffffffff80001000): names, comments, bookmarks, globals, byte
    patches and their journal work there as anywhere (SQLite keys them as negative integers:
    they were refused, and a listing or memory read there was an internal error); an export
    imports into a fresh database unchanged."""
    path = compile_c(
        "high_address.c",
        "-O2",
        False,
        extra=("-mcmodel=kernel", "-nostdlib", "-static", "-Wl,-Ttext=0xffffffff80001000", "-Wl,--build-id=none"),
    )
    workspace.open(path, check_roots=False)
    ws = workspace
    leaf = call(ws, "function.get", selector={"name": "leaf"})
    assert leaf["address"] == "0xffffffff80001000"
    data = call(ws, "memory.read", address="leaf", length=16)
    offset = data["file_offset"]
    original = path.read_bytes()[offset : offset + 16]
    assert bytes.fromhex(data["data"]) == original and not data["patched"]

    call(ws, "symbol.patch", selector={"name": "leaf"}, name="triple_plus_one")
    assert call(ws, "function.get", selector={"name": "triple_plus_one"})["address"] == "0xffffffff80001000"
    err = fails(ws, "conflict", "symbol.patch", selector={"name": "middle"}, name="triple_plus_one")
    assert err.details == {"address": "0xffffffff80001000"}
    call(ws, "comment.create", selector={"address": "0xffffffff80001004"}, kind="eol", text="returns 3x+1")
    call(ws, "comment.create", selector={"address": "0xffffffff80001000"}, kind="pre", text="leaf")
    listed = call(ws, "comment.list")["items"]
    assert [c["address"] for c in listed] == ["0xffffffff80001000", "0xffffffff80001004"]
    lines = call(ws, "listing.get", selector={"name": "triple_plus_one"}, format="lines")["lines"]
    assert any(line["comment"] == "returns 3x+1" for line in lines), lines
    call(ws, "bookmark.create", selector={"name": "middle"}, category="todo", note="why xor?")
    assert [b["address"] for b in call(ws, "bookmark.list")["items"]] == [
        call(ws, "function.get", selector={"name": "middle"})["address"]
    ]
    call(ws, "global_variable.create", selector={"address": "0xffffffff80001008"}, type="int")
    fails(ws, "conflict", "global_variable.create", selector={"address": "0xffffffff80001006"}, type="int")  # overlap
    call(ws, "memory.write", address="0xffffffff80001004", data="90")
    patched = call(ws, "memory.read", address="leaf", length=16)
    assert patched["patched"] and bytes.fromhex(patched["data"]) == original[:4] + b"\x90" + original[5:]
    call(ws, "journal.undo")
    assert bytes.fromhex(call(ws, "memory.read", address="leaf", length=16)["data"]) == original
    call(ws, "journal.redo")
    doc = call(ws, "annotations.export")
    assert doc["names"] and doc["patches"][0]["address"] == "0xffffffff80001004", doc

    other = Workspace(Config(home=home / "other"))
    other.open(path, check_roots=False)
    call(other, "annotations.import", document=doc)
    assert call(other, "annotations.export") == doc
    assert call(other, "comment.list")["items"] == listed


def test_the_annotation_store_orders_addresses_across_2_63(workspace, compile_c) -> None:  # noqa: ANN001
    """Stored as signed integers, addresses at and above 2**63 sort below the others in SQLite: the
    store gives rows and ranges in address order (a range across 2**63 is two queries)."""
    from binlens.store.annotations import db_spans

    prog = workspace.open(compile_c("sample.c", "-O0"), check_roots=False)
    from binlens.api.edits import store

    st = store(prog)
    addresses = [0, 0x401000, (1 << 63) - 1, 1 << 63, 0xFFFFFFFF80001000, (1 << 64) - 1]
    with st.db.transaction() as conn:
        for va in reversed(addresses):
            st.put(conn, "comment", (va, "eol"), {"text": hex(va)})
        st.put(conn, "patch", ((1 << 63) - 2, 4), {"runs": [[(1 << 63) - 2, "01020304"]]})
    assert [k[0] for k, _v in st.rows("comment")] == addresses
    assert st.get(st.db.connect(), "comment", (1 << 63, "eol")) == {"text": hex(1 << 63)}
    assert st.rows("patch") == [(((1 << 63) - 2, 4), {"runs": [[(1 << 63) - 2, "01020304"]]})]
    assert st.patched_bytes((1 << 63) - 1, 2) == [((1 << 63) - 1, 2), (1 << 63, 3)]
    assert db_spans(5, 5) == [] and db_spans(0, 1 << 64) == [(0, (1 << 63) - 1), (-(1 << 63), -1)]
    assert db_spans(1 << 63, (1 << 63) + 2) == [(-(1 << 63), -(1 << 63) + 1)]


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "in_an_atomic_batch"])
def test_function_create_as_the_first_command_on_a_new_database(compile_c, tmp_path, batched: bool) -> None:  # noqa: ANN001
    """The one-shot CLI starts the analysis while it opens the program; `function.create` waited
    for it inside its edit's write transaction, so the analysis process could not save ("database
    is locked") and both failed. The edit now lets the analysis finish first, alone or in a batch."""
    import json

    from conftest import run_cli

    path = compile_c("sample.c", "-O2", True)
    blocks = {"method": "function.blocks", "params": {"selector": {"name": "main"}}}
    probe = run_cli("query", "-b", str(path), json.dumps(blocks), home=tmp_path / "probe")
    inside = json.loads(probe.stdout)["result"]["items"][1]["start"]  # (a block of main, not a function)
    call_ = {"method": "function.create", "params": {"selector": {"address": inside}}}
    if batched:
        call_ = {"method": "batch.execute", "params": {"mode": "all_or_none", "items": [call_]}}
    r = run_cli("query", "-b", str(path), json.dumps(call_), home=tmp_path / "fresh")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and "error" not in out, out
    listed = run_cli("functions", str(path), "--json", home=tmp_path / "fresh")
    starts = {f["address"]: f["sources"] for f in json.loads(listed.stdout)["functions"]}
    assert starts.get(inside) == ["user"], starts
