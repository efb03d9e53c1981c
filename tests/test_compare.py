"""compare.*: fingerprints, matching two builds, function diffs, ported annotations (docs/COMPARE.md).

Two releases of one program (tests/fixtures/src/cmp_v1.c, cmp_v2.c): `checksum` changed,
`legacy_dump` removed, `report_stats` added; the newer build stripped. The truth is the unstripped
newer build's symbols (stripping moves no code)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError


def _symbols(path: Path) -> dict[int, str]:
    out = {}
    for line in subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "Tt":
            out[int(parts[0], 16)] = parts[2]
    return out


@pytest.fixture(scope="module")
def builds(compile_c) -> dict[str, Path]:
    return {
        "v1": compile_c("cmp_v1.c"),
        "v2": compile_c("cmp_v2.c"),
        "v2s": compile_c("cmp_v2.c", strip=True),
    }


def test_fingerprints_are_stored_and_identical_functions_agree(workspace, builds):
    from binlens.api.fingerprints import fingerprints
    from binlens.jobs.state import analysis_of
    from binlens.store.fingerprints import load_fingerprints, stored_key

    progs = [workspace.open(builds[k]) for k in ("v1", "v2s")]
    fps = []
    for prog in progs:
        view = analysis_of(prog).require(None, timeout_s=120)
        got = fingerprints(prog, view)
        assert len(got) == len(view.functions)
        assert stored_key(prog.db) is not None
        assert load_fingerprints(prog.db) == got  # what was stored reads back the same
        fps.append({f.address: f for f in got})
    v1, v2 = _symbols(builds["v1"]), _symbols(builds["v2"])
    by_name1 = {n: fps[0][a] for a, n in v1.items() if a in fps[0]}
    by_name2 = {n: fps[1][a] for a, n in v2.items() if a in fps[1]}
    for name in ("parse_header", "add_record", "find_record", "total_weight", "classify"):
        assert by_name1[name].exact == by_name2[name].exact, name
        assert len(by_name1[name].minhash) == 32
    assert by_name1["checksum"].exact != by_name2["checksum"].exact
    assert by_name1["classify"].loops == by_name2["classify"].loops
    assert "bad header: %s\n" in by_name1["parse_header"].strings


def test_compare_programs_classifies_changed_added_removed(workspace, builds):
    r = invoke(
        workspace,
        "compare.programs",
        {"left": {"path": str(builds["v1"])}, "right": {"path": str(builds["v2s"])}, "page": {"limit": 1000}},
    )
    truth = _symbols(builds["v2"])
    kinds = {}
    for m in r["matched"]:
        name = m["left"]["name"]
        right = truth.get(int(m["right"]["address"], 16))
        if right is not None:  # (PLT thunks have no symbol: they match by their import's name)
            assert right == name, m
        kinds[name] = (m["kind"], m["similarity"])
    assert kinds["checksum"][0] == "changed" and kinds["checksum"][1] < 1.0
    for name in ("parse_header", "add_record", "find_record", "total_weight", "classify"):
        assert kinds[name] == ("identical", 1.0), name
    assert [a["name"] for a in r["removed"]] == ["legacy_dump"]
    assert [truth[int(a["address"], 16)] for a in r["added"]] == ["report_stats"]
    assert r["counts"]["added"] == 1 and r["counts"]["removed"] == 1 and r["counts"]["changed"] == 1
    # paging: two at a time walks every pair once
    seen, cursor = [], None
    while True:
        page = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        p = invoke(
            workspace, "compare.programs", {"left": r["left"]["program"], "right": r["right"]["program"], "page": page}
        )
        seen += [m["left"]["address"] for m in p["matched"]]
        cursor = p["next_cursor"]
        if cursor is None:
            break
    assert seen == [m["left"]["address"] for m in r["matched"]]


def test_compare_functions_diffs_the_changed_blocks(workspace, builds):
    left, right = workspace.open(builds["v1"]), workspace.open(builds["v2"])
    r = invoke(
        workspace,
        "compare.functions",
        {
            "left": {"program": left.handle, "selector": {"name": "checksum"}},
            "right": {"program": right.handle, "selector": {"name": "checksum"}},
        },
    )
    assert r["kind"] == "changed"
    statuses = {b["status"] for b in r["blocks"]}
    assert "changed" in statuses or "added" in statuses
    changed_lines = [ln for b in r["blocks"] for ln in b["lines"] if ln["op"] != "equal"]
    assert changed_lines, r["blocks"]
    same = invoke(
        workspace,
        "compare.functions",
        {
            "left": {"program": left.handle, "selector": {"name": "classify"}},
            "right": {"program": right.handle, "selector": {"name": "classify"}},
        },
    )
    assert same["similarity"] == 1.0 and {b["status"] for b in same["blocks"]} == {"identical"}


def test_compare_bad_sides_are_clear_errors(workspace, builds, tmp_path):
    with pytest.raises(BinlensError) as err:
        invoke(
            workspace,
            "compare.programs",
            {"left": {"path": str(tmp_path / "absent")}, "right": {"path": str(builds["v1"])}},
        )
    assert err.value.target == "/params/left/path"
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "compare.programs", {"left": {"path": str(builds["v1"])}, "right": "p00000000"})
    assert err.value.code == "not_found" and err.value.target == "/params/right"


def _data_symbol(path: Path, name: str) -> int:
    for line in subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise AssertionError(name)


def test_port_annotations_lands_on_the_right_functions_and_undoes_in_one_step(workspace, builds):
    old, new = workspace.open(builds["v1"]), workspace.open(builds["v2s"])
    truth = {n: a for a, n in _symbols(builds["v2"]).items()}

    def call(method, params):
        return invoke(workspace, method, params)

    call("function.patch", {"program": old.handle, "selector": {"name": "parse_header"}, "name": "parse_hdr_user"})
    call(
        "function.patch",
        {
            "program": old.handle,
            "selector": {"name": "add_record"},
            "prototype": "int add_record(int id, int w, char *s)",
        },
    )
    call("comment.create", {"program": old.handle, "selector": {"name": "checksum"}, "kind": "plate", "text": "FNV-1a"})
    call(
        "global_variable.create", {"program": old.handle, "selector": {"name": "count"}, "type": "int", "name": "nrec"}
    )
    mine = hex(truth["total_weight"])
    call("function.patch", {"program": new.handle, "selector": {"address": mine}, "name": "my_total"})

    r = call("compare.port_annotations", {"from": old.handle, "to": new.handle})
    assert r["journal_id"] is not None

    def name_at(va: int) -> str:
        return call("function.get", {"program": new.handle, "selector": {"address": hex(va)}})["name"]

    assert name_at(truth["parse_header"]) == "parse_hdr_user"
    assert name_at(truth["find_record"]) == "find_record"  # the old build's symbols come along
    assert name_at(truth["add_record"]) == "add_record"
    assert name_at(truth["total_weight"]) == "my_total"  # the user's own name stays
    assert any(s["kind"] == "name" and s["target"] == mine for s in r["skipped"])
    assert name_at(truth["report_stats"]).startswith("sub_")  # added: nothing to port
    proto = call("function_prototype.get", {"program": new.handle, "selector": {"address": hex(truth["add_record"])}})
    assert proto["prototype"] is not None and proto["prototype"]["declaration"].startswith("int add_record(int id")
    plate = call(
        "comment.get", {"program": new.handle, "selector": {"address": hex(truth["checksum"])}, "kind": "plate"}
    )
    assert plate["text"] == "FNV-1a"
    count = _data_symbol(builds["v2"], "count")
    g = call("global_variable.get", {"program": new.handle, "selector": {"address": hex(count)}})
    assert g["type"] == "int" and g["name"] == "nrec"

    undone = call("journal.undo", {"program": new.handle, "count": 1})
    assert [e["id"] for e in undone["entries"]] == [r["journal_id"]]
    assert name_at(truth["parse_header"]).startswith("sub_")
    assert name_at(truth["total_weight"]) == "my_total"
    with pytest.raises(BinlensError):
        call("global_variable.get", {"program": new.handle, "selector": {"address": hex(count)}})


def test_signature_apply_names_static_libc_functions_and_main(workspace, compile_c):
    try:
        target = compile_c("cmp_v2.c", pie=False, strip=True, extra=("-static",))
        truth_build = compile_c("cmp_v2.c", pie=False, extra=("-static",))
        reference = compile_c("cmp_v1.c", pie=False, extra=("-static",))
    except subprocess.CalledProcessError:
        pytest.skip("no static C library (libc.a) to link against")
    truth: dict[int, set[str]] = {}
    for line in subprocess.run(
        ["nm", str(truth_build)], capture_output=True, text=True, check=True
    ).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWi":
            truth.setdefault(int(parts[0], 16), set()).add(parts[2])
    prog = workspace.open(target)
    r = invoke(workspace, "signature.apply", {"program": prog.handle, "references": [{"path": str(reference)}]})
    named = {int(n["address"], 16): n["name"] for n in r["named"]}
    wrong = {hex(a): (n, sorted(truth.get(a, ()))) for a, n in named.items() if n not in truth.get(a, ())}
    assert not wrong
    assert len(named) >= 0.5 * len(truth)
    main = next(a for a, names in truth.items() if "main" in names)
    assert named[main] == "main"
    libc = next(a for a, n in named.items() if n != "main")
    detail = invoke(workspace, "function.get", {"program": prog.handle, "selector": {"address": hex(libc)}})
    assert "signature" in detail["sources"] and detail["signature"]["score"] > 0.9
    listed = invoke(
        workspace, "function.list", {"program": prog.handle, "source": "signature", "page": {"limit": 1000}}
    )
    assert len(listed["items"]) == min(1000, len(named))
    invoke(workspace, "journal.undo", {"program": prog.handle, "count": 1})
    detail = invoke(workspace, "function.get", {"program": prog.handle, "selector": {"address": hex(main)}})
    assert detail["name"].startswith("sub_") and detail["signature"] is None


def test_cli_diff_and_port(home, builds):
    import json

    from conftest import run_cli

    out = run_cli("diff", str(builds["v1"]), str(builds["v2s"]), "--json", home=home)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["counts"]["changed"] == 1 and data["counts"]["added"] == 1 and data["counts"]["removed"] == 1
    table = run_cli("diff", str(builds["v1"]), str(builds["v2s"]), home=home)
    assert table.returncode == 0 and "checksum" in table.stdout and "legacy_dump" in table.stdout
    assert "1 changed, 1 added, 1 removed" in table.stdout
    port = run_cli("port", str(builds["v1"]), str(builds["v2s"]), home=home)
    assert port.returncode == 0, port.stderr
    assert "copied" in port.stdout and "parse_header" in port.stdout
    missing = run_cli("diff", str(builds["v1"]), str(home / "absent"), home=home)
    assert missing.returncode != 0 and "Traceback" not in missing.stderr


def test_compare_programs_on_aarch64(workspace, build_dir):
    """The fingerprints of other ISAs mask address parts too (adrp pages, the page offsets added to
    them): functions that only moved are identical."""
    import shutil

    from conftest import FIXTURE_SRC

    cc = shutil.which("aarch64-linux-gnu-gcc")
    if cc is None:
        pytest.skip("no aarch64-linux-gnu-gcc (Debian: gcc-aarch64-linux-gnu)")
    out = {}
    for v in ("v1", "v2"):
        out[v] = build_dir / f"a64_cmp_{v}"
        if not out[v].exists():
            subprocess.run([cc, "-O2", "-o", str(out[v]), str(FIXTURE_SRC / f"cmp_{v}.c")], check=True)
    r = invoke(workspace, "compare.programs", {"left": {"path": str(out["v1"])}, "right": {"path": str(out["v2"])}})
    kinds = {m["left"]["name"]: (m["right"]["name"], m["kind"], m["similarity"]) for m in r["matched"]}
    for name in ("main", "parse_header", "add_record", "find_record", "total_weight", "classify"):
        assert kinds[name] == (name, "identical", 1.0), (name, kinds[name])
    assert kinds["checksum"][:2] == ("checksum", "changed")
    assert [f["name"] for f in r["removed"]] == ["legacy_dump"]
    assert [f["name"] for f in r["added"]] == ["report_stats"]
