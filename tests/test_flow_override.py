"""flow_override.list/patch on a program built here: each override changes the CFG and the call
graph through the engine's local re-analysis, and undo (and redo) restore them exactly."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.api import invoke
from binlens.errors import BinlensError
from binlens.loader.parse_lief import parse_path


@pytest.fixture()
def fo(workspace, compile_c):
    path = compile_c("flow_override.c", "-O2")
    prog = workspace.open(path, check_roots=False)
    return workspace, prog, path


def _site(ws, fn: str, mnemonic: str, n: int = 0) -> str:
    """The address of the n-th `mnemonic` instruction of function `fn`."""
    f = invoke(ws, "function.get", {"selector": {"name": fn}})
    rng = {"start": f["address"], "end": hex(int(f["address"], 16) + f["size"])}
    units = invoke(ws, "code_unit.list", {"scan": {"range": rng}})["items"]
    return [u["address"] for u in units if u["mnemonic"] == mnemonic][n]


def _state(ws, *names: str) -> dict:
    """Each function's CFG (blocks, edges), callees and callers."""
    out = {}
    for name in names:
        sel = {"name": name}
        cfg = invoke(ws, "function.cfg", {"selector": sel})
        out[name] = {
            "blocks": [(n["start"], n["end"], n["terminator"]) for n in cfg["nodes"]],
            "edges": [(e["src"], e["dst"], e["kind"]) for e in cfg["edges"]],
            "callees": [
                (c["site"], c["callee_name"]) for c in invoke(ws, "function_call.list", {"selector": sel})["items"]
            ],
            "callers": [
                (c["site"], c["caller_name"])
                for c in invoke(ws, "function_call.list", {"selector": sel, "direction": "callers"})["items"]
            ],
        }
    return out


def test_call_as_branch_cuts_the_cfg_and_the_call_graph_and_undo_restores(fo):
    ws, _prog, _path = fo
    site = _site(ws, "outer", "call", 0)  # call helper, followed by the rest of outer
    before = _state(ws, "outer", "helper", "other")
    assert (site, "helper") in before["outer"]["callees"] and len(before["outer"]["blocks"]) == 3

    out = invoke(ws, "flow_override.patch", {"selector": {"address": site}, "type": "branch"})
    assert out["override"]["type"] == "branch" and out["override"]["flow"] == "call"
    assert out["override"]["function_name"] == "outer" and out["reanalysed"] == [out["override"]["function"]]
    after = _state(ws, "outer", "helper", "other")
    assert after["outer"]["callees"] == [] and after["helper"]["callers"] == []
    assert after["other"]["callers"] == []  # the guarded call to other is no longer reached
    assert len(after["outer"]["blocks"]) == 1 and after["outer"]["blocks"][0][2] == "jump"
    assert after["outer"]["edges"] == []
    refs = invoke(ws, "reference.list", {"selector": {"address": site}, "direction": "from"})["items"]
    assert [r["kind"] for r in refs] == ["tail_call"]

    undone = invoke(ws, "journal.undo", {})
    assert undone["entries"][0]["method"] == "flow_override.patch"
    assert _state(ws, "outer", "helper", "other") == before
    invoke(ws, "journal.redo", {})
    assert _state(ws, "outer", "helper", "other") == after
    invoke(ws, "journal.undo", {})
    assert _state(ws, "outer", "helper", "other") == before


def test_call_that_does_not_return_keeps_the_call_and_drops_the_fall_through(fo):
    ws, _prog, _path = fo
    site = _site(ws, "outer", "call", 0)
    before = _state(ws, "outer", "helper")
    invoke(ws, "flow_override.patch", {"selector": {"address": site}, "type": "call_return"})
    after = _state(ws, "outer", "helper")
    assert after["outer"]["callees"] == [(site, "helper")] and after["helper"]["callers"] == [(site, "outer")]
    assert after["outer"]["edges"] == [] and [b[2] for b in after["outer"]["blocks"]] == ["call"]
    cu = invoke(ws, "code_unit.list", {"scan": {"range": {"start": site, "end": hex(int(site, 16) + 1)}}})
    assert cu["items"][0]["flow_override"] == "call_return"

    removed = invoke(ws, "flow_override.patch", {"selector": {"address": site}, "type": "none"})
    assert removed["override"] is None and removed["journal_id"] is not None
    assert _state(ws, "outer", "helper") == before
    assert invoke(ws, "flow_override.list", {})["items"] == []
    again = invoke(ws, "flow_override.patch", {"selector": {"address": site}, "type": "none"})
    assert again["journal_id"] is None and again["reanalysed"] == []


def test_jump_as_call_and_jump_as_return(fo):
    ws, _prog, _path = fo
    site = _site(ws, "tail", "jmp", 0)  # tail's `jmp other` (a tail call at -O2)
    before = _state(ws, "tail", "other")
    assert before["tail"]["callees"] == [] and all(name != "tail" for _s, name in before["other"]["callers"])

    invoke(ws, "flow_override.patch", {"selector": {"address": site}, "type": "call"})
    called = _state(ws, "tail", "other")
    assert called["tail"]["callees"] == [(site, "other")]
    assert (site, "tail") in called["other"]["callers"]
    assert called["tail"]["blocks"][-1][2] == "call"

    invoke(ws, "flow_override.patch", {"selector": {"address": site}, "type": "return"})
    returned = _state(ws, "tail", "other")
    assert returned["tail"]["callees"] == [] and returned["tail"]["blocks"][-1][2] == "return"
    listed = invoke(ws, "flow_override.list", {})["items"]
    assert [(i["address"], i["type"], i["flow"], i["function_name"]) for i in listed] == [
        (site, "return", "jump", "tail")
    ]
    invoke(ws, "journal.undo", {"count": 2})
    assert _state(ws, "tail", "other") == before
    assert invoke(ws, "flow_override.list", {})["items"] == []


def test_wrong_instruction_kind_and_bad_selectors_are_clear_errors(fo):
    ws, prog, _path = fo
    ret = _site(ws, "helper", "ret", 0)
    with pytest.raises(BinlensError) as err:
        invoke(ws, "flow_override.patch", {"selector": {"address": ret}, "type": "branch"})
    assert (err.value.code, err.value.target, err.value.details["flow"]) == (
        "invalid_argument",
        "/params/type",
        "return",
    )
    call = _site(ws, "outer", "call", 0)
    with pytest.raises(BinlensError) as err:
        invoke(ws, "flow_override.patch", {"selector": {"address": call}, "type": "return"})
    assert err.value.target == "/params/type"
    with pytest.raises(BinlensError) as err:
        invoke(ws, "flow_override.patch", {"selector": {"name": "nope"}, "type": "call"})
    assert (err.value.code, err.value.target) == ("not_found", "/params/selector/name")
    with pytest.raises(BinlensError) as err:
        invoke(ws, "flow_override.patch", {"selector": {"address": call}, "type": "jump"})
    assert err.value.code == "invalid_argument" and err.value.target.startswith("/params/type")
    assert invoke(ws, "journal.list", {})["items"] == []


def test_a_full_analysis_honours_the_overrides(fo):
    """The analysis process gets the overrides too (a new engine version re-runs it): its result
    for the overridden function is the local re-analysis's."""
    ws, prog, path = fo
    site = int(_site(ws, "outer", "call", 0), 16)
    outer = prog.resolve("outer", "/")
    plain = {f.address: f for f in analyze(parse_path(str(path))).functions}[outer]
    over = {f.address: f for f in analyze(parse_path(str(path)), flow_overrides={site: "call_return"}).functions}
    assert over[outer].call_pairs() == plain.call_pairs()[:1] == [(site, prog.resolve("helper", "/"))]
    assert plain.edges and not over[outer].edges
    assert max(over) < 1 << 62  # no function at the walks' stop address
    invoke(ws, "flow_override.patch", {"selector": {"address": hex(site)}, "type": "call_return"})
    local = invoke(ws, "function.cfg", {"selector": {"name": "outer"}})
    assert [(int(n["start"], 16), int(n["end"], 16)) for n in local["nodes"]] == [
        (b.start, b.end) for b in over[outer].blocks
    ]
    request = prog.extensions["analysis"]._request()
    assert request.flow_overrides == {site: "call_return"}


def test_an_all_or_none_batch_that_fails_takes_the_re_analysis_back(fo):
    ws, _prog, _path = fo
    site = _site(ws, "outer", "call", 0)
    before = (invoke(ws, "function.get", {"selector": {"name": "outer"}}), _state(ws, "outer", "helper"))
    items = [
        {"method": "flow_override.patch", "params": {"selector": {"address": site}, "type": "branch"}},
        {"method": "comment.create", "params": {"selector": {"name": "no_such_name"}, "text": "x"}},
    ]
    with pytest.raises(BinlensError) as err:
        invoke(ws, "batch.execute", {"mode": "all_or_none", "items": items})
    assert err.value.details["rolled_back"] is True
    after = (invoke(ws, "function.get", {"selector": {"name": "outer"}}), _state(ws, "outer", "helper"))
    assert after == before and invoke(ws, "flow_override.list", {})["items"] == []
    done = invoke(ws, "batch.execute", {"mode": "all_or_none", "items": items[:1]})
    assert done["succeeded"] == 1 and _state(ws, "outer", "helper")["outer"]["callees"] == []


def test_export_and_import_carry_the_overrides_and_re_analyse(fo):
    ws, _prog, _path = fo
    site = _site(ws, "outer", "call", 0)
    before = _state(ws, "outer", "helper")
    invoke(ws, "flow_override.patch", {"selector": {"address": site}, "type": "branch"})
    overridden = _state(ws, "outer", "helper")
    doc = invoke(ws, "annotations.export", {})
    assert doc["flow_overrides"] == [{"address": site, "type": "branch"}]
    invoke(ws, "journal.undo", {})
    assert _state(ws, "outer", "helper") == before
    invoke(ws, "annotations.import", {"document": doc})
    assert _state(ws, "outer", "helper") == overridden
    invoke(ws, "annotations.import", {"document": {**doc, "flow_overrides": []}, "mode": "replace"})
    assert _state(ws, "outer", "helper") == before and invoke(ws, "flow_override.list", {})["items"] == []


@pytest.mark.parametrize(
    ("compiler", "flags"),
    [("aarch64-linux-gnu-gcc", ()), ("arm-linux-gnueabihf-gcc", ("-mthumb",)), ("arm-linux-gnueabihf-gcc", ("-marm",))],
    ids=["aarch64", "thumb", "arm"],
)
def test_overrides_on_other_architectures(workspace, tmp_path, compiler, flags):
    """The same overrides on AArch64, Thumb-2 and ARM builds (a Thumb function is re-analysed in
    Thumb state)."""
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    out = tmp_path / "fo"
    src = Path(__file__).parent / "fixtures" / "src" / "flow_override.c"
    built = subprocess.run([compiler, "-O2", *flags, "-o", str(out), str(src)], capture_output=True, text=True)
    if built.returncode:
        pytest.skip(f"{compiler} cannot link here: {built.stderr[-200:]}")
    workspace.open(out, check_roots=False)
    ws = workspace
    f = invoke(ws, "function.get", {"selector": {"name": "outer"}})
    rng = {"start": f["address"], "end": hex(int(f["address"], 16) + f["size"])}
    site = next(
        u["address"] for u in invoke(ws, "code_unit.list", {"scan": {"range": rng}})["items"] if u["flow"] == "call"
    )
    before = _state(ws, "outer")
    assert len(before["outer"]["callees"]) == 2 and before["outer"]["edges"]
    invoke(ws, "flow_override.patch", {"selector": {"address": site}, "type": "call_return"})
    after = _state(ws, "outer")["outer"]
    assert [s for s, _n in after["callees"]] == [site] and after["edges"] == []
    assert invoke(ws, "function.get", {"selector": {"name": "outer"}})["address"] == f["address"]
    invoke(ws, "journal.undo", {})
    assert _state(ws, "outer") == before
