"""A stopped frame's arguments and locals from the debug information (debug_variable.list,
debug_variable.evaluate), on the debuggee the tests compile with -g: a stripped PIE whose DWARF is
in a separate debug file beside it (gnu_debuglink), and the same PIE without any debug file.
Timeouts here are hang bounds only."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from test_debug import call, close_all, fails, make_ws, symbols

pytestmark = [
    pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (apt-get install gdb)"),
    pytest.mark.skipif(shutil.which("objcopy") is None, reason="objcopy is not installed (binutils)"),
    pytest.mark.timeout(180),
]
pytest.importorskip("pygdbmi", reason="pip install 'binlens[debug]'")


@pytest.fixture()
def split_debuggee(compile_c: Any, tmp_path: Path) -> tuple[Path, Path, int]:
    """(a stripped PIE with a gnu_debuglink to its DWARF beside it, the same stripped PIE with no
    debug file, the static address of `work`), built at -O0 -g."""
    full = compile_c("debuggee.c", opt="-O0")
    work = symbols(full)["work"]
    linked, bare = tmp_path / "linked" / "debuggee", tmp_path / "bare" / "debuggee"
    linked.parent.mkdir()
    bare.parent.mkdir()
    debug = linked.parent / "debuggee.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(full), str(debug)], check=True, capture_output=True)
    subprocess.run(["strip", "-s", "-o", str(bare), str(full)], check=True, capture_output=True)
    subprocess.run(
        ["objcopy", f"--add-gnu-debuglink={debug}", str(bare), str(linked)],
        check=True,
        capture_output=True,
        cwd=linked.parent,
    )
    linked.chmod(0o755)
    return linked, bare, work


def test_a_stripped_pie_reads_an_argument_and_locals_from_its_debug_file(home: Path, split_debuggee: Any) -> None:
    path, _, work = split_debuggee
    ws = make_ws(home)
    ws.open(path)
    call(ws, "symbol.patch", selector={"address": hex(work)}, name="accumulate")
    d = call(ws, "debug.start", args=["3"], timeout_ms=60000)["debug_id"]
    call(ws, "breakpoint.create", debug_id=d, selector={"name": "accumulate"})
    assert call(ws, "debug.continue", debug_id=d, wait_ms=30000)["event"]["kind"] == "breakpoint"
    entry = call(ws, "debug_variable.list", debug_id=d)
    assert entry["source"]["file"].endswith("debuggee.c") and entry["source"]["line"] == 11  # the opening line
    # (a breakpoint at a function's address stops before its prologue has stored the argument)
    call(ws, "debug.step", debug_id=d, source_line=True)

    inner = call(ws, "debug_variable.list", debug_id=d)
    assert inner["debug_info"] and inner["level"] == 0 and inner["thread"] == 1
    assert inner["function"]["name"] == "accumulate" and inner["gdb_function"] == "work"
    assert inner["source"]["line"] == 12 and inner["static_address"] != hex(work)
    assert [(v["name"], v["kind"], v["type"], v["value"]) for v in inner["items"]] == [("i", "argument", "long", "1")]

    outer = call(ws, "debug_variable.list", debug_id=d, frame=1)
    got = {v["name"]: v for v in outer["items"]}
    assert outer["level"] == 1 and outer["gdb_function"] == "main"
    assert got["argc"]["kind"] == "argument" and got["argc"]["value"] == "2"
    assert (got["n"]["kind"], got["n"]["type"], got["n"]["value"]) == ("local", "long", "3")
    assert got["total"]["value"] == "0" and got["line"]["type"] == "char [64]" and got["line"]["value"]
    cut = {v["name"]: v for v in call(ws, "debug_variable.list", debug_id=d, frame=1, max_value_chars=16)["items"]}
    assert cut["line"]["truncated"] and len(cut["line"]["value"]) == 16 and not cut["n"]["truncated"]

    # the second call: the local the first call's result went into, the argument that changed
    call(ws, "debug.continue", debug_id=d, wait_ms=30000)
    call(ws, "debug.step", debug_id=d, source_line=True)
    assert call(ws, "debug_variable.list", debug_id=d)["items"][0]["value"] == "2"
    assert call(ws, "debug_variable.evaluate", debug_id=d, frame=1, expression="total") == {
        "expression": "total",
        "type": "long",
        "value": "3",  # work(1) = counter (1) * 3
        "truncated": False,
    }
    assert call(ws, "debug_variable.evaluate", debug_id=d, expression="i * 10")["value"] == "20"

    assert fails("invalid_argument", ws, "debug_variable.list", debug_id=d, frame=99).target == "/params/frame"
    assert fails("invalid_argument", ws, "debug_variable.list", debug_id=d, thread=9).target == "/params/thread"
    err = fails("invalid_argument", ws, "debug_variable.evaluate", debug_id=d, expression="thread + frame")
    assert err.target == "/params/expression"  # gdb's "No symbol "thread" ...": the expression's fault
    err = fails("invalid_argument", ws, "debug_variable.evaluate", debug_id=d, expression="i = 5")
    assert err.target == "/params/expression" and err.details["reason"] == "assigns"
    assert fails("invalid_argument", ws, "debug_variable.evaluate", debug_id=d, expression="i <<= 1").target
    err = fails("invalid_argument", ws, "debug_variable.evaluate", debug_id=d, expression="work(1)")
    assert err.target == "/params/expression" and "may-call-functions" in err.message
    assert call(ws, "debug_variable.evaluate", debug_id=d, expression="counter")["value"] == "1"  # no call ran

    call(ws, "breakpoint.delete", debug_id=d, id=1)
    assert call(ws, "debug.continue", debug_id=d, wait_ms=30000)["event"]["kind"] == "exited"
    fails("process_exited", ws, "debug_variable.list", debug_id=d)
    close_all(ws)


def test_a_frame_without_debug_information_says_so(home: Path, split_debuggee: Any) -> None:
    _, path, work = split_debuggee
    ws = make_ws(home)
    ws.open(path)
    d = call(ws, "debug.start", args=["1"], timeout_ms=60000)["debug_id"]
    call(ws, "breakpoint.create", debug_id=d, selector={"name": f"sub_{work:x}"})
    call(ws, "debug.continue", debug_id=d, wait_ms=30000)
    got = call(ws, "debug_variable.list", debug_id=d)
    assert got["debug_info"] is False and got["items"] == [] and got["source"] is None
    assert got["static_address"] == hex(work) and got["function"]["name"] == f"sub_{work:x}"
    assert call(ws, "debug_variable.evaluate", debug_id=d, expression="$rdi")["value"] == "1"
    err = fails("invalid_argument", ws, "debug_variable.evaluate", debug_id=d, expression="total")
    assert err.target == "/params/expression"
    close_all(ws)
