"""The analysis methods through the registry: shapes, selectors, waiting, the database cache."""

from __future__ import annotations

import time

import pytest

from binlens.api import CallContext, invoke
from binlens.errors import BinlensError


@pytest.fixture()
def sample(compile_c):
    return compile_c("sample.c", "-O2", True, strip=True)


@pytest.fixture()
def names(compile_c):
    from binlens.loader.parse_lief import parse_path

    img = parse_path(str(compile_c("sample.c", "-O2", True)))
    return {s.name: s.address for s in img.symbols if s.kind == "function"}


def _analysed(workspace, path):
    prog = workspace.open(path, check_roots=False)
    seen = []
    invoke(workspace, "analysis.start", {"wait": True}, CallContext(progress=lambda d, t, m: seen.append((d, t, m))))
    return prog, seen


def test_analysis_start_reports_progress_and_get_gives_counts(workspace, sample):
    prog, seen = _analysed(workspace, sample)
    assert seen and seen[-1][0] == 100
    st = invoke(workspace, "analysis.get", {})
    assert st["status"] == "done" and st["engine_version"]
    assert st["counts"]["functions"] >= 16 and st["counts"]["xrefs"] > 0 and st["counts"]["strings"] > 0
    assert 0 < st["coverage"] <= 1


def test_wait_false_gives_unavailable_with_progress(workspace, compile_c):
    workspace.open(compile_c("sample.c", "-O0", False, strip=True), check_roots=False)
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "function.list", {"wait": False})
    assert err.value.code == "unavailable"
    assert err.value.details["status"] in ("running", "done")
    assert "progress" in err.value.details
    # waiting (bounded by the call's timeout) then works
    data = invoke(workspace, "function.list", {"timeout_ms": 60000})
    assert data["items"]


def test_function_list_shape_filters_and_cursor(workspace, sample, names):
    _analysed(workspace, sample)
    first = invoke(workspace, "function.list", {"page": {"limit": 3}})
    assert len(first["items"]) == 3 and first["next_cursor"]
    item = first["items"][0]
    assert set(item) >= {"address", "name", "size", "sources"}
    second = invoke(workspace, "function.list", {"page": {"limit": 3, "cursor": first["next_cursor"]}})
    assert int(second["items"][0]["address"], 16) > int(first["items"][-1]["address"], 16)
    thunks = invoke(workspace, "function.list", {"source": "thunk"})["items"]
    assert {"puts", "printf", "exit"} <= {f["name"] for f in thunks}
    big = invoke(workspace, "function.list", {"min_size": 100})["items"]
    assert big and all(f["size"] >= 100 for f in big)
    globbed = invoke(workspace, "function.list", {"name": "pu*"})["items"]
    assert [f["name"] for f in globbed] == ["puts"]
    ranged = invoke(
        workspace,
        "function.list",
        {"scan": {"range": {"start": hex(names["classify"]), "end": hex(names["classify"] + 1)}}},
    )
    assert [f["address"] for f in ranged["items"]] == [hex(names["classify"])]
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "function.list", {"source": "guess"})
    assert err.value.target == "/params/source"


def test_selectors_and_their_errors(workspace, sample, names):
    _analysed(workspace, sample)
    f = invoke(workspace, "function.get", {"selector": {"address": hex(names["classify"] + 5)}})
    assert f["address"] == hex(names["classify"]) and f["callers"] == 1
    by_name = invoke(workspace, "function.get", {"selector": {"name": f["name"]}})
    assert by_name["address"] == f["address"]
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "function.get", {"selector": {"name": "no_such_function"}})
    assert err.value.code == "not_found" and err.value.target == "/params/selector/name"
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "function.get", {"selector": {"address": "0x1"}})
    assert err.value.code == "not_found" and err.value.target == "/params/selector/address"
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "function.get", {"selector": {}})
    assert err.value.target.startswith("/params/selector")


def test_cfg_blocks_listing_and_calls(workspace, sample, names):
    _analysed(workspace, sample)
    sel = {"address": hex(names["classify"])}
    cfg = invoke(workspace, "function.cfg", {"selector": sel})
    assert len({e["dst"] for e in cfg["edges"] if e["kind"] == "jump_table"}) == 12
    assert sum(n["entry"] for n in cfg["nodes"]) == 1
    dot = invoke(workspace, "function.cfg", {"selector": sel, "format": "dot"})["text"]
    assert dot.startswith("digraph") and dot.count("->") == len(cfg["edges"])
    mer = invoke(workspace, "function.cfg", {"selector": sel, "format": "mermaid"})["text"]
    assert mer.startswith("flowchart TD") and mer.count("-->") == len(cfg["edges"])
    blocks = invoke(workspace, "function.blocks", {"selector": sel})["items"]
    assert len(blocks) == len(cfg["nodes"])
    main = hex(names["main"])
    listing = invoke(workspace, "listing.get", {"selector": {"address": main}, "format": "both"})
    assert '"unique marker string for xrefs"' in listing["text"]
    assert "<puts>" in listing["text"] and listing["lines"][0]["kind"] == "label"
    callees = invoke(workspace, "function_call.list", {"selector": {"address": main}})["items"]
    assert hex(names["classify"]) in {c["callee"] for c in callees}
    callers = invoke(workspace, "function_call.list", {"selector": sel, "direction": "callers"})["items"]
    assert [c["caller"] for c in callers] == [main]
    graph = invoke(workspace, "callgraph.get", {"selector": {"address": main}, "depth": 2})
    assert {"caller": main, "callee": hex(names["fib"]), "sites": 1} in graph["edges"]
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "callgraph.get", {"selector": {"address": main}, "depth": 4})
    assert err.value.target == "/params/depth"


def test_references_strings_and_instructions(workspace, sample, names):
    _analysed(workspace, sample)
    strings = invoke(workspace, "string.list", {"text": "unique marker"})["items"]
    assert len(strings) == 1 and strings[0]["references"] == 1
    refs = invoke(workspace, "reference.list", {"address": strings[0]["address"]})["items"]
    assert [r["kind"] for r in refs] == ["string"] and refs[0]["function"] == hex(names["main"])
    calls = invoke(workspace, "reference.list", {"address": hex(names["fib"]), "kind": ["call"]})["items"]
    assert hex(names["main"]) in {r["function"] for r in calls}
    from_main = invoke(
        workspace, "reference.list", {"address": hex(names["main"]), "direction": "from", "scope": "function"}
    )["items"]
    assert {"call", "string"} <= {r["kind"] for r in from_main}
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "string.list", {"regex": "("})
    assert err.value.target == "/params/regex"
    assert invoke(workspace, "string.list", {"regex": "^fatal"})["items"]
    ins = invoke(workspace, "instruction.get", {"selector": {"address": hex(names["main"])}})
    assert ins["address"] == hex(names["main"]) and ins["function"] == hex(names["main"])
    page = invoke(
        workspace,
        "instruction.list",
        {
            "page": {"limit": 5},
            "scan": {"range": {"start": hex(names["classify"]), "end": hex(names["classify"] + 0x100)}},
        },
    )
    assert len(page["items"]) == 5 and page["next_cursor"] and page["scan"]["stop_reason"] == "limit"
    nxt = invoke(
        workspace,
        "instruction.list",
        {
            "page": {"limit": 5, "cursor": page["next_cursor"]},
            "scan": {"range": {"start": hex(names["classify"]), "end": hex(names["classify"] + 0x100)}},
        },
    )
    assert int(nxt["items"][0]["address"], 16) > int(page["items"][-1]["address"], 16)


def test_reopened_program_loads_the_analysis_from_the_database(home, sample):
    from binlens.workspace import Config, Workspace

    ws1 = Workspace(Config(home=home))
    _analysed(ws1, sample)
    expected = invoke(ws1, "function.list", {"page": {"limit": 1000}})
    ws1.close(next(iter(ws1.programs)))
    ws2 = Workspace(Config(home=home))
    ws2.open(sample, check_roots=False)
    assert invoke(ws2, "analysis.get", {})["status"] == "done"
    again = invoke(ws2, "function.list", {"page": {"limit": 1000}, "wait": False})
    assert again == expected
    assert invoke(ws2, "analysis.get", {})["status"] == "done"  # served from the database, no new run


def test_define_and_undefine_function(workspace, sample, names):
    prog, _ = _analysed(workspace, sample)
    st = prog.extensions["analysis"]
    classify = hex(names["classify"])
    before = invoke(workspace, "function.get", {"selector": {"address": classify}})
    count = invoke(workspace, "analysis.get", {})["counts"]["functions"]
    inner = names["classify"] + 9  # a block inside classify (the jump-table dispatch)
    assert st.function_at(inner) is None and st.function_containing(inner).address == names["classify"]
    st.define_function(inner)
    assert st.function_at(inner).address == inner and st.function_at(inner).sources == ("user",)
    assert invoke(workspace, "analysis.get", {})["counts"]["functions"] == count + 1
    shrunk = invoke(workspace, "function.get", {"selector": {"address": classify}})
    assert shrunk["blocks"] < before["blocks"] and shrunk["sources"] == before["sources"]
    cases = invoke(workspace, "function.cfg", {"selector": {"address": hex(inner)}})
    assert len({e["dst"] for e in cases["edges"] if e["kind"] == "jump_table"}) == 12
    # the database has it: a fresh view of the same program sees the user's function
    from binlens.store.analysis import AnalysisView, user_functions

    assert inner in AnalysisView(prog.db).by_address and user_functions(prog.db) == {inner: True}
    st.undefine_function(inner)
    assert st.function_at(inner) is None and st.function_containing(inner).address == names["classify"]
    assert invoke(workspace, "function.get", {"selector": {"address": classify}}) == before
    assert invoke(workspace, "analysis.get", {})["counts"]["functions"] == count
    assert [f.address for f in st.functions] == sorted(f.address for f in st.functions)


def test_cancelling_the_only_waiting_call_stops_the_analysis(workspace):
    from pathlib import Path

    libc = next(
        (p for p in (Path("/lib/x86_64-linux-gnu/libc.so.6"), Path("/usr/lib64/libc.so.6")) if p.exists()), None
    )
    if libc is None:
        pytest.skip("no system libc to analyse")
    workspace.open(libc, check_roots=False)
    ctx = CallContext(progress=lambda done, total, message: ctx.cancel())
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "function.list", {}, ctx)
    assert err.value.code == "cancelled"
    deadline = time.monotonic() + 30
    while invoke(workspace, "analysis.get", {})["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert invoke(workspace, "analysis.get", {})["status"] == "cancelled"
    # the next call that needs the analysis starts it again
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "function.list", {"wait": False})
    assert err.value.code == "unavailable" and err.value.details["status"] == "running"
    state = next(iter(workspace.programs.values())).extensions["analysis"]
    state.cancel()
    assert state._done.wait(30)


def test_user_renames_show_everywhere(workspace, sample, names):
    workspace.open(sample, check_roots=False)
    classify = hex(names["classify"])
    invoke(workspace, "symbol.patch", {"selector": {"address": classify}, "name": "sorter"})
    assert invoke(workspace, "function.get", {"selector": {"name": "sorter"}})["address"] == classify
    listing = invoke(workspace, "listing.get", {"selector": {"address": hex(names["main"])}})["text"]
    assert "<sorter>" in listing
    callees = invoke(workspace, "function_call.list", {"selector": {"address": hex(names["main"])}})["items"]
    assert "sorter" in {c["callee_name"] for c in callees}
    assert [f["name"] for f in invoke(workspace, "function.list", {"name": "sort*"})["items"]] == ["sorter"]
