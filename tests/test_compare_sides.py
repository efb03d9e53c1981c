"""compare.* sides and pages: compare.functions paged by block, a side given as retained evidence of
compare.fingerprints, local variable names ported (docs/COMPARE.md).

The builds are those of tests/test_compare.py: two releases of tests/fixtures/src/cmp_v*.c where
`checksum` changed, `legacy_dump` was removed and `report_stats` added."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError


def _symbols(path: Path) -> dict[str, int]:
    out = {}
    for line in subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "Tt":
            out[parts[2]] = int(parts[0], 16)
    return out


@pytest.fixture(scope="module")
def builds(compile_c) -> dict[str, Path]:
    return {
        "v1": compile_c("cmp_v1.c"),
        "v2": compile_c("cmp_v2.c"),
        "v2s": compile_c("cmp_v2.c", strip=True),
    }


def _diff_params(left, right, name: str = "checksum") -> dict:
    return {
        "left": {"program": left, "selector": {"name": name}},
        "right": {"program": right, "selector": {"name": name}},
    }


def test_compare_functions_pages_join_to_the_unpaged_diff(workspace, builds):
    left, right = workspace.open(builds["v1"]), workspace.open(builds["v2"])
    whole = invoke(workspace, "compare.functions", _diff_params(left.handle, right.handle) | {"page": {"limit": 1000}})
    assert whole["next_cursor"] is None and len(whole["blocks"]) >= 3
    blocks, cursor, pages = [], None, 0
    while True:
        page = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        r = invoke(workspace, "compare.functions", _diff_params(left.handle, right.handle) | {"page": page})
        assert len(r["blocks"]) <= 2 and r["similarity"] == whole["similarity"]
        blocks += r["blocks"]
        pages += 1
        cursor = r["next_cursor"]
        if cursor is None:
            break
    assert blocks == whole["blocks"] and pages == (len(whole["blocks"]) + 1) // 2
    # a cursor belongs to its query
    first = invoke(workspace, "compare.functions", _diff_params(left.handle, right.handle) | {"page": {"limit": 1}})
    with pytest.raises(BinlensError) as err:
        params = _diff_params(left.handle, right.handle, "classify")
        invoke(workspace, "compare.functions", params | {"page": {"limit": 1, "cursor": first["next_cursor"]}})
    assert err.value.code == "invalid_argument" and err.value.target == "/params/page/cursor"


def _all(workspace, method: str, params: dict) -> dict:
    """Every page of a compare.programs call joined."""
    out: dict = {"matched": [], "added": [], "removed": []}
    cursor = None
    while True:
        page = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
        r = invoke(workspace, method, params | {"page": page})
        for k in out:
            out[k] += r[k]
        out["counts"] = r["counts"]
        cursor = r["next_cursor"]
        if cursor is None:
            return out


def test_a_side_given_as_retained_evidence_compares_like_the_live_program(workspace, builds):
    old, new = workspace.open(builds["v1"]), workspace.open(builds["v2s"])
    live = _all(workspace, "compare.programs", {"left": old.handle, "right": new.handle})
    rec = invoke(workspace, "evidence.record", {"method": "compare.fingerprints", "params": {"program": old.handle}})
    one = invoke(
        workspace,
        "evidence.record",
        {"method": "compare.fingerprints", "params": {"program": old.handle, "selector": {"name": "checksum"}}},
    )
    v2_checksum = hex(_symbols(builds["v2"])["checksum"])
    live_fn = invoke(
        workspace,
        "compare.functions",
        {
            "left": {"program": old.handle, "selector": {"name": "checksum"}},
            "right": {"program": new.handle, "selector": {"address": v2_checksum}},
        },
    )
    workspace.close(old.handle)  # the evidence stands in for a program that is no longer open

    by_id = _all(workspace, "compare.programs", {"left": {"evidence_id": rec["evidence_id"]}, "right": new.handle})
    assert by_id["matched"] == live["matched"] and by_id["counts"] == live["counts"]
    assert by_id["added"] == live["added"] and by_id["removed"] == live["removed"]
    assert [f["name"] for f in by_id["removed"]] == ["legacy_dump"]
    record = invoke(workspace, "evidence.get", {"evidence_id": rec["evidence_id"]})["record"]
    r = invoke(workspace, "compare.programs", {"left": {"record": record}, "right": new.handle, "page": {"limit": 1}})
    assert (
        r["left"]["evidence_id"] == rec["evidence_id"] and r["left"]["program"]["sha256"] == record["program"]["sha256"]
    )
    assert r["next_cursor"] is not None  # pages of an evidence side carry on too
    nxt = invoke(
        workspace,
        "compare.programs",
        {"left": {"record": record}, "right": new.handle, "page": {"limit": 1, "cursor": r["next_cursor"]}},
    )
    assert nxt["matched"] == live["matched"][1:2]
    # both sides evidence
    newrec = invoke(workspace, "evidence.record", {"method": "compare.fingerprints", "params": {"program": new.handle}})
    both = _all(
        workspace,
        "compare.programs",
        {"left": {"evidence_id": rec["evidence_id"]}, "right": {"evidence_id": newrec["evidence_id"]}},
    )
    assert both["matched"] == live["matched"]

    fn = invoke(
        workspace,
        "compare.functions",
        {
            "left": {"evidence_id": one["evidence_id"]},
            "right": {"program": new.handle, "selector": {"address": v2_checksum}},
        },
    )
    assert fn["blocks"] == live_fn["blocks"] and fn["similarity"] == live_fn["similarity"] < 1.0
    assert fn["left"]["name"] == "checksum"


def test_bad_evidence_sides_are_clear_errors(workspace, builds):
    prog = workspace.open(builds["v1"])
    rec = invoke(workspace, "evidence.record", {"method": "compare.fingerprints", "params": {"program": prog.handle}})
    other = invoke(workspace, "evidence.record", {"method": "function.list", "params": {"program": prog.handle}})

    def fails(method: str, params: dict) -> BinlensError:
        with pytest.raises(BinlensError) as err:
            invoke(workspace, method, params)
        return err.value

    err = fails("compare.programs", {"left": {"evidence_id": "ev_" + "0" * 64}, "right": prog.handle})
    assert err.code == "not_found" and err.details["reason"] == "missing" and err.target == "/params/left/evidence_id"
    err = fails("compare.programs", {"left": prog.handle, "right": {"evidence_id": other["evidence_id"]}})
    assert err.code == "invalid_argument" and err.target == "/params/right/evidence_id"
    record = invoke(workspace, "evidence.get", {"evidence_id": rec["evidence_id"]})["record"]
    record["result"]["functions"][0]["size"] += 1
    err = fails(
        "compare.programs", {"left": {"record": record, "evidence_id": rec["evidence_id"]}, "right": prog.handle}
    )
    assert err.details["reason"] == "digest_mismatch" and err.target == "/params/left/record"
    side = {"evidence_id": rec["evidence_id"]}  # every function's fingerprints: not one function
    err = fails("compare.functions", {"left": side, "right": {"program": prog.handle, "selector": {"name": "main"}}})
    assert err.code == "invalid_argument" and err.target == "/params/left/evidence_id"


def test_port_annotations_ports_local_variable_names_where_the_storage_matches(workspace, builds):
    from binlens.store.annotations import local_variable_rows

    old, new = workspace.open(builds["v1"]), workspace.open(builds["v2s"])
    truth = _symbols(builds["v2"])

    def patch(name: str, storage: str, var: str) -> None:
        invoke(
            workspace,
            "function_local_variable.patch",
            {"program": old.handle, "selector": {"name": name}, "storage": storage, "name": var},
        )

    patch("classify", "[bp-0x18]", "bucket")  # identical in both builds: the storage is the same
    patch("checksum", "[bp-0x7777]", "hash")  # changed: kept only where `to` is known to have it
    r = invoke(workspace, "compare.port_annotations", {"from": old.handle, "to": new.handle})
    rows = local_variable_rows(new.db.connect(), truth["classify"])
    assert rows == {"[bp-0x18]": {"name": "bucket", "type": None}}
    assert any(e["kind"] == "local_variable" and e["target"] == hex(truth["classify"]) for e in r["copied"])
    skipped = [e for e in r["skipped"] if e["kind"] == "local_variable"]
    assert [e["target"] for e in skipped] == [hex(truth["checksum"])]
    assert "no decompilation" in skipped[0]["reason"]
    assert local_variable_rows(new.db.connect(), truth["checksum"]) == {}
    invoke(workspace, "journal.undo", {"program": new.handle, "count": 1})
    assert local_variable_rows(new.db.connect(), truth["classify"]) == {}


@pytest.mark.timeout(300)
def test_a_changed_function_gets_the_local_names_its_decompilation_has(workspace, builds):
    if importlib.util.find_spec("angr") is None:
        pytest.skip("the angr provider needs `pip install 'binlens[decompile]'`")
    from binlens.store.annotations import local_variable_rows

    old, new = workspace.open(builds["v1"]), workspace.open(builds["v2s"])
    at = hex(_symbols(builds["v2"])["checksum"])
    found = invoke(
        workspace,
        "function_local_variable.list",
        {"program": new.handle, "selector": {"address": at}, "timeout_ms": 240000},
    )
    storages = [v["storage"] for v in found["items"]]
    assert storages, found
    for storage, var in ((storages[0], "h"), ("[bp-0x7777]", "nowhere")):
        invoke(
            workspace,
            "function_local_variable.patch",
            {"program": old.handle, "selector": {"name": "checksum"}, "storage": storage, "name": var},
        )
    r = invoke(
        workspace, "compare.port_annotations", {"from": old.handle, "to": new.handle, "kinds": ["local_variables"]}
    )
    assert local_variable_rows(new.db.connect(), int(at, 16)) == {storages[0]: {"name": "h", "type": None}}
    (skip,) = [e for e in r["skipped"] if e["kind"] == "local_variable"]
    assert skip["reason"].startswith("[bp-0x7777]") and "no such storage" in skip["reason"]
