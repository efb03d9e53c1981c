"""xref's live operations over one verified process (`--allow-live-pid PID`): the verification before
any protocol frame, live.maps, live.resolve, live.memscan, one call at a time, identity checks.
The process is the looping debuggee (tests/fixtures/src/debuggee.c with argument 0)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from binlens.api import invoke
from binlens.api.live import LIVE_KEY, pin_live
from binlens.errors import BinlensError
from binlens.workspace import Config, Workspace
from conftest import ROOT
from serve_support import env_for

pytestmark = pytest.mark.timeout(120)


def nm(path: Path) -> dict[str, int]:
    out = subprocess.run(["nm", str(path)], check=True, capture_output=True, text=True).stdout
    return {p[2]: int(p[0], 16) for p in (line.split() for line in out.splitlines()) if len(p) == 3}


@pytest.fixture()
def running(compile_c: Any) -> Any:
    """The stripped debuggee looping (argument 0), its path, and its unstripped twin's symbols."""
    path = compile_c("debuggee.c", opt="-O1", strip=True)
    syms = nm(compile_c("debuggee.c", opt="-O1"))
    proc = subprocess.Popen([str(path), "0"], stdout=subprocess.DEVNULL)
    yield proc, path, syms
    proc.kill()
    proc.wait(30)


def fails(code: str, ws: Workspace, method: str, params: dict[str, Any]) -> BinlensError:
    with pytest.raises(BinlensError) as info:
        invoke(ws, method, params)
    assert info.value.code == code, info.value.to_dict()
    return info.value


def test_a_pid_running_another_file_is_refused_before_any_frame(running: Any, compile_c: Any, tmp_path: Path) -> None:
    proc, path, _ = running
    other = compile_c("sample.c")
    init = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    init += b'"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n'
    done = subprocess.run(
        [sys.executable, "-m", "binlens", "mcp", str(other), "--allow-live-pid", str(proc.pid)],
        input=init,
        capture_output=True,
        env=env_for(tmp_path),
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == b""
    assert f"--allow-live-pid {proc.pid}" in done.stderr.decode() and "not" in done.stderr.decode()


def test_live_maps_resolve_memscan_and_identity(running: Any, tmp_path: Path) -> None:
    proc, path, syms = running
    ws = Workspace(Config(home=tmp_path, permissions=frozenset({"live"})))
    prog = ws.open(path)
    err = fails("unavailable", ws, "live.maps", {})  # permitted, but no process pinned
    assert "--allow-live-pid" in err.details["remediation"]
    pin_live(ws, prog, proc.pid)

    maps = invoke(ws, "live.maps", {"page": {"limit": 1000}})["items"]
    ours = [m for m in maps if m["program"]]
    slide = int(ours[0]["slide"], 16)
    assert slide and all(m["slide"] == ours[0]["slide"] for m in ours)

    work = syms["work"]
    (hit,) = invoke(ws, "live.resolve", {"addresses": [hex(work + slide)]})["items"]
    assert hit["program"] and hit["static_address"] == hex(work)

    # a string of the program, found where the file has it (read-only data: writable_only off)
    scan = invoke(ws, "live.memscan", {"values": [{"text": "total %ld"}], "writable_only": False, "max_hits": 10})
    found = [h for h in scan["items"] if h["static_address"] is not None]
    assert found and scan["complete"] and scan["stop_reason"] == "range_end"
    assert prog.image.read(int(found[0]["static_address"], 16), 9) == b"total %ld"
    limited = invoke(ws, "live.memscan", {"values": [{"integer": 0, "size": 1}], "max_hits": 3})
    assert len(limited["items"]) == 3 and limited["stop_reason"] == "limit" and not limited["complete"]

    # the loop adds to `counter` every 20 ms: a watch sees it change, by the program's static address
    counter = hex(syms["counter"])
    watched = invoke(ws, "live.watch", {"targets": [{"selector": {"address": counter}}], "duration_ms": 300})
    assert watched["places"][0]["static_address"] == counter and watched["stop_reason"] == "duration"
    changes = watched["items"]
    assert changes and all(
        int.from_bytes(bytes.fromhex(c["new"]), "little") > int.from_bytes(bytes.fromhex(c["old"]), "little")
        for c in changes
    )

    # a probe on `work` (gdb attached for the duration, then detached): hits with rdi counting up
    # and the caller in the program; the process runs on
    probe = invoke(
        ws,
        "live.probe",
        {"addresses": [{"selector": {"address": hex(work)}}], "regs": ["rdi"], "duration_ms": 300, "max_hits": 5},
    )
    assert probe["counts"][0] == len(probe["items"]) >= 1, probe
    values = [int(h["regs"]["rdi"], 16) for h in probe["items"]]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert all(h["caller_static"] and h["caller_function"].startswith("sub_") for h in probe["items"])
    time.sleep(0.1)
    assert proc.poll() is None and "TracerPid:\t0" in Path(f"/proc/{proc.pid}/status").read_text()

    # a profile: the loop sleeps most of the time, in the C library; every sample is accounted for
    prof = invoke(ws, "live.profile", {"duration_ms": 300, "interval_ms": 5})
    assert prof["samples"] >= 1 and prof["stop_reason"] == "duration"
    assert sum(e["samples"] for e in prof["items"]) == prof["samples"]
    assert any("libc" in (e["module"] or "") for e in prof["items"]), prof
    time.sleep(0.1)
    assert proc.poll() is None and "TracerPid:\t0" in Path(f"/proc/{proc.pid}/status").read_text()

    target = ws.extensions[LIVE_KEY]
    with target.lock:  # another live call is running
        fails("busy", ws, "live.maps", {})
    proc.kill()
    proc.wait(30)
    fails("process_exited", ws, "live.resolve", {"addresses": ["0x1000"]})


def test_live_methods_are_unavailable_without_allow_live_pid(running: Any, tmp_path: Path) -> None:
    _, path, _ = running
    ws = Workspace(Config(home=tmp_path))
    ws.open(path)
    for name in ("live.maps", "live.resolve", "live.memscan"):
        err = fails("unavailable", ws, name, {})
        assert err.details["requirement"] == "permission:live"
