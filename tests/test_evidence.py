"""Evidence (SPEC §9): records with RFC 8785 content-derived ids, persistent named ledgers under
$BINLENS_HOME, bundles exported atomically and imported only when every id checks out."""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

import pytest
import rfc8785

from binlens.api import invoke
from binlens.errors import BinlensError
from binlens.workspace import Config, Workspace
from conftest import run_cli

pytestmark = pytest.mark.timeout(180)


# --- RFC 8785's own examples ------------------------------------------------------------------------
def test_canonical_form_matches_rfc8785_section_3_2_2():
    """The RFC's worked example (§3.2.2 and §3.2.3): numbers, string escapes, literals."""
    doc = json.loads(
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        ' "literals": [null, true, false]}'
    )
    want = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert rfc8785.dumps(doc) == want.encode()


def test_canonical_key_order_matches_rfc8785_section_3_2_3():
    """Properties sort by their UTF-16 code units (the RFC's example, a surrogate pair included)."""
    doc = json.loads(
        '{"\\u20ac": "Euro Sign", "\\r": "Carriage Return", "\\ufb33": "Hebrew Letter Dalet With Dagesh",'
        ' "1": "One", "\\ud83d\\ude00": "Emoji: Grinning Face", "\\u0080": "Control",'
        ' "\\u00f6": "Latin Small Letter O With Diaeresis"}'
    )
    keys = [k for k, _ in json.loads(rfc8785.dumps(doc)).items()]
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


@pytest.mark.parametrize(
    ("bits", "text"),
    [
        ("0000000000000000", "0"),
        ("8000000000000000", "0"),
        ("0000000000000001", "5e-324"),
        ("7fefffffffffffff", "1.7976931348623157e+308"),
        ("4340000000000000", "9007199254740992"),
        ("c340000000000000", "-9007199254740992"),
        ("4430000000000000", "295147905179352830000"),
        ("44b52d02c7e14af5", "9.999999999999997e+22"),
        ("44b52d02c7e14af6", "1e+23"),
        ("444b1ae4d6e2ef50", "1e+21"),
        ("444b1ae4d6e2ef4f", "999999999999999900000"),
        ("3eb0c6f7a0b5ed8d", "0.000001"),
        ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ],
)
def test_canonical_numbers_match_rfc8785_appendix_b(bits, text):
    """IEEE 754 doubles serialise as the RFC's Appendix B says."""
    (value,) = struct.unpack(">d", bytes.fromhex(bits))
    assert rfc8785.dumps(value) == text.encode()


# --- helpers ----------------------------------------------------------------------------------------
def _workspace(home: Path, **kw) -> Workspace:
    return Workspace(Config(home=home, **kw))


def _error(ws: Workspace, name: str, params: dict) -> BinlensError:
    with pytest.raises(BinlensError) as info:
        invoke(ws, name, params)
    return info.value


def _record(ws: Workspace, method: str, params: dict | None = None, ledger: str = "default") -> dict:
    return invoke(ws, "evidence.record", {"method": method, "params": params or {}, "ledger": ledger})


@pytest.fixture()
def opened(tmp_path, compile_c):
    """A workspace (home under tmp_path) with the sample program open."""
    path = compile_c("sample.c", "-O2", True)
    ws = _workspace(tmp_path / "home")
    invoke(ws, "program.open", {"path": str(path)})
    return ws, path


# --- ids --------------------------------------------------------------------------------------------
def test_the_same_record_gets_the_same_id_from_two_homes_and_survives_a_restart(tmp_path, compile_c):
    """Two `binlens query` processes with different $BINLENS_HOME give one evidence_id for the same
    question on the same bytes; a third process in the first home still finds the record."""
    path = compile_c("sample.c", "-O2", True)
    request = json.dumps(
        {"method": "evidence.record", "params": {"method": "function.list", "params": {"page": {"limit": 5}}}}
    )
    ids = []
    for name in ("one", "two"):
        done = run_cli("query", "-b", str(path), request, home=tmp_path / name)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)["result"]
        ids.append(out["evidence_id"])
        assert out["added"] is True
        assert out["result"]["items"]
    assert ids[0] == ids[1]
    assert ids[0].startswith("ev_") and len(ids[0]) == 67
    get = json.dumps({"method": "evidence.get", "params": {"evidence_id": ids[0]}})
    done = run_cli("query", get, home=tmp_path / "one")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)["result"]
    assert got["record"]["method"] == "function.list"
    assert len(got["record"]["result"]["items"]) == 5
    # the id is sha256 of the canonical record, which holds no created_at
    import hashlib

    assert "created_at" not in got["record"]
    assert "ev_" + hashlib.sha256(rfc8785.dumps(got["record"])).hexdigest() == ids[0]


def test_a_record_names_the_bytes_engine_and_normalised_params(opened):
    """The record carries the program's identity (not its file name), the engine versions, and the
    params as validated (defaults filled, the handle left to the identity): spelling the defaults
    or the handle out gives the same id."""
    ws, _ = opened
    a = _record(ws, "function.list", {"page": {"limit": 3}})
    handle = next(iter(ws.programs))
    b = _record(ws, "function.list", {"program": handle, "page": {"limit": 3, "cursor": None}, "wait": True})
    assert a["evidence_id"] == b["evidence_id"] and b["added"] is False
    assert a["evidence"]["created_at"] == b["evidence"]["created_at"]
    ev = a["evidence"]
    assert ev["program"]["sha256"] == ws.programs[handle].image.identity.sha256
    assert "file_name" not in ev["program"]
    assert set(ev["engine"]) == {"binlens", "analysis"}
    assert "program" not in ev["params"] and ev["params"]["page"]["limit"] == 3
    other = _record(ws, "function.list", {"page": {"limit": 4}})
    assert other["evidence_id"] != a["evidence_id"]


def test_record_refuses_what_is_not_a_read_only_call(opened):
    """A mutation, an unknown method, and the recorded call's own errors point into the request."""
    ws, _ = opened
    err = _error(ws, "evidence.record", {"method": "comment.set", "params": {}})
    assert err.target == "/params/method"
    err = _error(ws, "evidence.record", {"method": "comment.create", "params": {}})
    assert (err.code, err.target) == ("invalid_argument", "/params/method")
    err = _error(ws, "evidence.record", {"method": "evidence.list", "params": {}})
    assert err.target == "/params/method"
    err = _error(ws, "evidence.record", {"method": "function.get", "params": {"selector": {"address": "0x1"}}})
    assert (err.code, err.target) == ("not_found", "/params/params/selector/address")
    err = _error(ws, "evidence.record", {"method": "function.list", "params": {"bogus": 1}})
    assert (err.code, err.target) == ("invalid_argument", "/params/params/bogus")
    err = _error(ws, "evidence.record", {"method": "function.list", "params": {}, "ledger": "../x"})
    assert err.target == "/params/ledger"
    assert invoke(ws, "evidence.list", {})["total"] == 0


# --- ledgers ----------------------------------------------------------------------------------------
def test_ledgers_are_named_listed_paged_and_deleted(opened):
    """Records go to the named ledger; list pages them oldest first; delete reports what it removed."""
    ws, _ = opened
    ids = [_record(ws, "function.list", {"page": {"limit": n}})["evidence_id"] for n in (1, 2, 3)]
    other = _record(ws, "program.get", ledger="case-7")["evidence_id"]
    first = invoke(ws, "evidence.list", {"limit": 2})
    assert [i["evidence_id"] for i in first["items"]] == ids[:2] and first["total"] == 3
    assert first["ledgers"] == {"case-7": 1, "default": 3}
    rest = invoke(ws, "evidence.list", {"limit": 2, "cursor": first["next_cursor"]})
    assert [i["evidence_id"] for i in rest["items"]] == ids[2:] and rest["next_cursor"] is None
    only = invoke(ws, "evidence.list", {"ledger": "case-7", "method": "program.get"})
    assert [i["evidence_id"] for i in only["items"]] == [other]
    gone = invoke(ws, "evidence.delete", {"evidence_ids": [ids[0], other]})
    assert gone == {"deleted": [ids[0]], "missing": [other]}
    err = _error(ws, "evidence.get", {"evidence_id": ids[0]})
    assert (err.code, err.target, err.details["reason"]) == ("not_found", "/params/evidence_id", "missing")
    assert invoke(ws, "evidence.get", {"evidence_id": other, "ledger": "case-7"})["record"]["method"] == "program.get"


# --- bundles ----------------------------------------------------------------------------------------
def test_a_bundle_is_canonical_json_and_imports_into_another_home(opened, tmp_path):
    """export writes one RFC 8785 document; import into a fresh home checks and keeps every record."""
    ws, _ = opened
    ids = [_record(ws, "function.list", {"page": {"limit": n}})["evidence_id"] for n in (1, 2)]
    out = invoke(ws, "evidence.export", {"path": str(tmp_path / "bundle.json")})
    raw = (tmp_path / "bundle.json").read_bytes()
    assert out["count"] == 2 and out["bytes"] == len(raw)
    assert rfc8785.dumps(json.loads(raw)) == raw
    doc = json.loads(raw)
    assert [i["evidence_id"] for i in doc["items"]] == ids and doc["ledger"] == "default"
    ws2 = _workspace(tmp_path / "home2")
    got = invoke(ws2, "evidence.import", {"path": str(tmp_path / "bundle.json"), "ledger": "imported"})
    assert got["added"] == 2 and got["evidence_ids"] == ids
    again = invoke(ws2, "evidence.import", {"path": str(tmp_path / "bundle.json"), "ledger": "imported"})
    assert again["added"] == 0
    assert (
        invoke(ws2, "evidence.get", {"evidence_id": ids[1], "ledger": "imported"})["created_at"]
        == (doc["items"][1]["created_at"])
    )


def test_a_changed_byte_in_a_bundle_refuses_the_whole_bundle(opened, tmp_path):
    """One changed byte inside the second record: import answers digest_mismatch pointing at that
    item, and the ledger gets none of the bundle's records (not even the intact first one)."""
    ws, _ = opened
    _record(ws, "function.list", {"page": {"limit": 1}})
    second = _record(ws, "function.list", {"page": {"limit": 2}})
    path = tmp_path / "bundle.json"
    invoke(ws, "evidence.export", {"path": str(path)})
    raw = path.read_bytes()
    name = second["result"]["items"][1]["name"].encode()
    at = raw.rindex(b'"name":"' + name)  # (in the second item, the last one)
    tampered = bytearray(raw)
    tampered[at + 8] ^= 0x01
    path.write_bytes(bytes(tampered))
    ws2 = _workspace(tmp_path / "home2")
    err = _error(ws2, "evidence.import", {"path": str(path)})
    assert err.code == "invalid_argument" and err.target == "/params/path"
    assert err.details["reason"] == "digest_mismatch" and err.details["pointer"] == "/items/1"
    assert err.details["evidence_id"] == second["evidence_id"]
    assert invoke(ws2, "evidence.list", {})["total"] == 0


def test_a_malformed_bundle_is_refused_with_a_pointer(opened, tmp_path):
    """Not JSON, a wrong format, an item without its id: each refused, pointing into the bundle."""
    ws, _ = opened
    cases = [
        (b"{not json", ""),
        (b'{"format":"other","items":[],"ledger":"x"}', "/format"),
        (b'{"format":"binlens.evidence-bundle/1","items":[{"record":{}}],"ledger":"x"}', "/items/0"),
    ]
    for raw, where in cases:
        (tmp_path / "b.json").write_bytes(raw)
        err = _error(ws, "evidence.import", {"path": str(tmp_path / "b.json")})
        assert (err.code, err.target, err.details["pointer"]) == ("invalid_argument", "/params/path", where)
    err = _error(ws, "evidence.import", {"path": str(tmp_path / "absent.json")})
    assert (err.code, err.target) == ("not_found", "/params/path")


def test_a_failed_export_leaves_no_file_and_keeps_the_old_one(opened, tmp_path):
    """A ledger row changed behind binlens's back stops the export mid-stream: no bundle appears,
    no temporary file stays, and a bundle already at the path is left whole."""
    ws, _ = opened
    _record(ws, "function.list", {"page": {"limit": 1}})
    bad = _record(ws, "function.list", {"page": {"limit": 2}})["evidence_id"]
    _record(ws, "function.list", {"page": {"limit": 3}})
    old = tmp_path / "old.json"
    invoke(ws, "evidence.export", {"path": str(old)})
    kept = old.read_bytes()
    conn = sqlite3.connect(tmp_path / "home" / "evidence.sqlite")
    conn.execute(
        "UPDATE evidence SET record = CAST(replace(CAST(record AS TEXT), '\"limit\":2', '\"limit\":9') AS BLOB)"
        " WHERE id=?",
        (bad,),
    )
    conn.commit()
    conn.close()
    err = _error(ws, "evidence.export", {"path": str(tmp_path / "new.json")})
    assert (err.code, err.details["reason"], err.details["pointer"]) == ("conflict", "digest_mismatch", "/items/1")
    err = _error(ws, "evidence.export", {"path": str(old), "overwrite": True})
    assert err.details["reason"] == "digest_mismatch"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["old.json"]
    assert old.read_bytes() == kept
    err = _error(ws, "evidence.export", {"path": str(old)})
    assert (err.code, err.target) == ("conflict", "/params/path")


def test_a_server_confined_to_its_files_keeps_bundles_in_the_home(tmp_path, compile_c):
    """Started on files without --root, export writes only under $BINLENS_HOME/exports."""
    path = compile_c("sample.c", "-O2", True)
    ws = _workspace(tmp_path / "home", files=[path])
    invoke(ws, "program.open", {"path": str(path)})
    _record(ws, "program.get")
    err = _error(ws, "evidence.export", {"path": str(tmp_path / "out.json")})
    assert (err.code, err.target) == ("invalid_argument", "/params/path")
    out = invoke(ws, "evidence.export", {"path": "case.json"})
    assert Path(out["path"]) == (tmp_path / "home" / "exports" / "case.json").resolve()
    assert invoke(ws, "evidence.import", {"path": "case.json", "ledger": "copy"})["added"] == 1


def test_the_ledger_database_has_only_the_ledger_schema(tmp_path):
    """`$BINLENS_HOME/evidence.sqlite` migrates `components.LEDGER_MIGRATIONS`, not a program's schema."""
    from binlens.store.evidence import EvidenceStore

    store = EvidenceStore(tmp_path)
    versions = store.db.schema_versions()
    store.close()
    assert versions == {"evidence": 1}
