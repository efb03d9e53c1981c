"""Live debugging through gdb (GDB/MI) on processes the tests compile (tests/fixtures/src/debuggee.c):
a stripped PIE broken on by the name a user gave a function, registers, memory, steps, backtraces,
watchpoints, the event log, exits, attach and detach, identity checks, and the permission and
read-only refusals. Timeouts here are hang bounds only."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from binlens.api import REGISTRY, invoke
from binlens.errors import BinlensError
from binlens.providers.target import TargetIdentity
from binlens.workspace import Config, Workspace

pytestmark = [
    pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (apt-get install gdb)"),
    pytest.mark.timeout(180),
]
pygdbmi = pytest.importorskip("pygdbmi", reason="pip install 'binlens[debug]'")

DEBUG_DOMAINS = (
    "debug",
    "breakpoint",
    "watchpoint",
    "register",
    "debug_memory",
    "backtrace",
    "thread",
    "memory_map",
    "debug_address",
    "debug_variable",
)


def symbols(path: Path) -> dict[str, int]:
    """Static addresses of the unstripped build's symbols (strip moves nothing)."""
    out = subprocess.run(["nm", str(path)], check=True, capture_output=True, text=True).stdout
    return {parts[2]: int(parts[0], 16) for parts in (line.split() for line in out.splitlines()) if len(parts) == 3}


@pytest.fixture()
def debuggee(compile_c: Any) -> tuple[Path, dict[str, int]]:
    """The stripped PIE and the static addresses of its unstripped twin's symbols."""
    full = compile_c("debuggee.c", opt="-O1")
    stripped = compile_c("debuggee.c", opt="-O1", strip=True)
    return stripped, symbols(full)


def make_ws(home: Path, *, debug: bool = True, read_only: bool = False) -> Workspace:
    return Workspace(Config(home=home, read_only=read_only, permissions=frozenset({"debug"} if debug else ())))


def call(ws: Workspace, method: str, **params: Any) -> Any:
    return invoke(ws, method, params)


def fails(code: str, ws: Workspace, method: str, **params: Any) -> BinlensError:
    with pytest.raises(BinlensError) as info:
        invoke(ws, method, params)
    assert info.value.code == code, info.value.to_dict()
    return info.value


def close_all(ws: Workspace) -> None:
    for handle in list(ws.programs):
        ws.close(handle)


def test_every_debug_method_is_listed_and_unavailable_without_allow_debug(home: Path, debuggee: Any) -> None:
    ws = make_ws(home, debug=False)
    ws.open(debuggee[0])
    names = [n for n in REGISTRY if n.partition(".")[0] in DEBUG_DOMAINS]
    assert {"debug.start", "debug.attach", "debug.wait", "debug.events", "breakpoint.create", "register.set"} <= set(
        names
    )
    for name in names:
        assert any(r.text == "permission:debug" for r in REGISTRY[name].requires), name
        err = fails("unavailable", ws, name, debug_id="dbg-1")  # answered before the params are read
        assert err.details["requirement"] == "permission:debug"
        assert "--allow-debug" in err.details["remediation"]
    close_all(ws)


def test_break_by_user_name_in_a_stripped_pie_step_watch_and_run_to_exit(home: Path, debuggee: Any) -> None:
    path, syms = debuggee
    ws = make_ws(home)
    prog = ws.open(path)
    work, counter = syms["work"], syms["counter"]
    call(ws, "symbol.patch", selector={"address": hex(work)}, name="accumulate")

    started = call(ws, "debug.start", args=["3"], timeout_ms=60000)
    d = started["debug_id"]
    assert started["state"] == "stopped" and started["identity"]["sha256"] == prog.image.identity.sha256
    slide = int(started["slide"], 16)
    assert slide != 0  # a PIE: the slide is reported, never folded in

    # a conditional breakpoint on the user's name: the first call (rdi == 1) does not stop
    bp = call(ws, "breakpoint.create", debug_id=d, selector={"name": "accumulate"}, condition="$rdi == 2")
    assert int(bp["address"], 16) == work + slide and bp["static_address"] == hex(work)
    stop = call(ws, "debug.continue", debug_id=d, wait_ms=30000)
    event = stop["event"]
    assert event["kind"] == "breakpoint" and event["breakpoint"] == bp["id"]
    assert int(event["address"], 16) == work + slide and event["static_address"] == hex(work)
    assert event["function"]["name"] == "accumulate"
    regs = {r["name"]: r["value"] for r in call(ws, "register.get", debug_id=d)["registers"]}
    assert int(regs["rdi"], 16) == 2 and int(regs["rip"], 16) == work + slide
    # a frame or thread the target does not have: an error at the param that named it
    assert fails("invalid_argument", ws, "register.get", debug_id=d, frame=99).target == "/params/frame"
    assert fails("invalid_argument", ws, "register.get", debug_id=d, thread=9).target == "/params/thread"

    # memory at the static selector is the file's bytes there
    mem = call(ws, "debug_memory.read", debug_id=d, selector={"name": "accumulate"}, size=16)
    seg = next(s for s in prog.image.segments if s.va <= work < s.va + s.fsize)
    assert bytes.fromhex(mem["bytes"]) == path.read_bytes()[seg.offset + work - seg.va :][:16]

    frames = call(ws, "backtrace.get", debug_id=d)["frames"]
    assert frames[0]["function"]["name"] == "accumulate"
    assert frames[1]["static_address"] is not None and frames[1]["function"]["name"].startswith("sub_")
    resolved = call(ws, "debug_address.resolve", debug_id=d, address=frames[1]["address"])
    assert resolved["program"] and resolved["static_address"] == frames[1]["static_address"]
    assert resolved["slide"] == started["slide"]

    stepped = call(ws, "debug.step", debug_id=d)["event"]
    assert stepped["kind"] == "step" and stepped["function"]["name"] == "accumulate"
    assert int(stepped["static_address"], 16) > work

    # a register write changes what the program computes: work(10) instead of work(2)
    call(ws, "register.set", debug_id=d, name="rdi", value="10")
    # a hardware watchpoint on the global fires on its write
    call(ws, "breakpoint.delete", debug_id=d, id=bp["id"])
    wp = call(ws, "watchpoint.create", debug_id=d, selector={"address": hex(counter)}, size=8)
    hit = call(ws, "debug.continue", debug_id=d, wait_ms=30000)["event"]
    assert hit["kind"] == "watchpoint" and hit["watchpoint"]["id"] == wp["id"]
    assert hit["watchpoint"]["new"] == "11" and hit["function"]["name"] == "accumulate"
    call(ws, "watchpoint.delete", debug_id=d, id=wp["id"])
    finished = call(ws, "debug.finish", debug_id=d)["event"]
    assert finished["function"]["name"] != "accumulate" and finished["static_address"] is not None

    # the rest runs to its exit, followed through debug.wait; the log holds every stop
    seen = call(ws, "debug.events", debug_id=d)["last_seq"]
    assert call(ws, "debug.continue", debug_id=d, wait_ms=0)["state"] in ("running", "exited")
    done = call(ws, "debug.wait", debug_id=d, after_seq=seen, timeout_ms=30000)
    assert not done["timed_out"] and done["event"]["kind"] == "exited"
    assert done["event"]["exit_code"] == (3 + 33 + 42) & 0x7F
    log = call(ws, "debug.events", debug_id=d, page={"limit": 2})
    assert [e["seq"] for e in log["items"]] == [1, 2] and log["next_cursor"]
    rest = call(ws, "debug.events", debug_id=d, page={"limit": 100, "cursor": log["next_cursor"]})
    kinds = [e["kind"] for e in log["items"] + rest["items"]]
    assert kinds[1:] == ["breakpoint", "step", "watchpoint", "step", "exited"], kinds
    info = call(ws, "debug.get", debug_id=d)
    assert info["state"] == "exited" and "total 78" in info["output_tail"]

    fails("process_exited", ws, "register.get", debug_id=d)
    fails("process_exited", ws, "debug.continue", debug_id=d)
    close_all(ws)


def test_read_only_refuses_register_and_memory_writes(home: Path, debuggee: Any) -> None:
    ws = make_ws(home, read_only=True)
    ws.open(debuggee[0])
    d = call(ws, "debug.start", args=["1"], timeout_ms=60000)["debug_id"]
    assert call(ws, "register.get", debug_id=d, names=["rsp"])["registers"]
    err = fails("unavailable", ws, "register.set", debug_id=d, name="rax", value="0x1")
    assert err.details["requirement"] == "writable"
    fails("unavailable", ws, "debug_memory.write", debug_id=d, address="0x1000", bytes="90")
    # breakpoints stay allowed (a hardware one here), and register reads
    work = debuggee[1]["work"]
    bp = call(ws, "breakpoint.create", debug_id=d, selector={"address": hex(work)}, hardware=True)
    assert bp["kind"] == "hardware"
    hit = call(ws, "debug.continue", debug_id=d, wait_ms=30000)["event"]
    assert hit["kind"] == "breakpoint" and hit["static_address"] == hex(work)
    listed = call(ws, "breakpoint.list", debug_id=d)["items"]
    assert [(b["id"], b["kind"], b["hits"]) for b in listed] == [(bp["id"], "hardware", 1)]
    err = fails("read_only", ws, "breakpoint.create", debug_id=d, address="0x1000", condition="$rax = 1")
    assert err.target == "/params/condition"  # a condition that assigns is a write too
    pid = call(ws, "debug.get", debug_id=d)["pid"]
    assert call(ws, "debug.kill", debug_id=d)["state"] == "exited"
    assert _gone(pid)
    close_all(ws)


def test_attach_maps_threads_detach_and_identity_checks(home: Path, debuggee: Any, compile_c: Any) -> None:
    path, syms = debuggee
    ws = make_ws(home)
    mine = ws.open(path).handle
    other = ws.open(compile_c("sample.c"))
    proc = subprocess.Popen([str(path), "0"], stdout=subprocess.DEVNULL)
    try:
        # a process running other bytes than the program is refused
        err = fails("conflict", ws, "debug.attach", program=other.handle, pid=proc.pid)
        assert err.target == "/params/pid" and err.details["reason"] == "exe_mismatch"
        assert fails("process_exited", ws, "debug.attach", program=mine, pid=(1 << 22) - 1).target == "/params/pid"

        info = call(ws, "debug.attach", program=mine, pid=proc.pid, timeout_ms=60000)
        d = info["debug_id"]
        assert info["pid"] == proc.pid and not info["started"]
        maps = call(ws, "memory_map.list", debug_id=d, page={"limit": 1000})["items"]
        ours = [m for m in maps if m["program"]]
        assert ours and all(m["slide"] == info["slide"] for m in ours)
        libc = [m for m in maps if "libc" in m["path"]]
        assert libc and libc[0]["slide"] == libc[0]["module_base"]  # a shared library linked at 0
        threads = call(ws, "thread.list", debug_id=d)["items"]
        assert len(threads) == 1 and str(proc.pid) in threads[0]["target_id"]
        runtime = hex(syms["work"] + int(info["slide"], 16))
        resolved = call(ws, "debug_address.resolve", debug_id=d, address=runtime)
        assert resolved["static_address"] == hex(syms["work"])

        # the pinned identity: another start time is another process
        ident = TargetIdentity.pin(proc.pid)
        changed = TargetIdentity(**{**ident.to_dict(), "start_time": ident.start_time + 1})
        with pytest.raises(BinlensError) as caught:
            changed.check()
        assert caught.value.code == "process_changed"

        assert call(ws, "debug.detach", debug_id=d)["state"] == "detached"
        time.sleep(0.2)
        assert proc.poll() is None  # it keeps running
        fails("conflict", ws, "thread.list", debug_id=d)

        # a target killed behind the session's back answers process_exited
        d2 = call(ws, "debug.attach", program=mine, pid=proc.pid, timeout_ms=60000)["debug_id"]
        proc.kill()  # (its parent reaps it only once gdb, its tracer, lets go of it)
        assert _gone(proc.pid)
        fails("process_exited", ws, "thread.list", debug_id=d2)
    finally:
        close_all(ws)
        proc.kill()
        proc.wait(30)


def _gone(pid: int, bound: float = 30) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_closing_the_program_kills_gdb_and_the_started_target(home: Path, debuggee: Any) -> None:
    ws = make_ws(home)
    prog = ws.open(debuggee[0])
    info = call(ws, "debug.start", args=["0"], timeout_ms=60000)
    call(ws, "debug.continue", debug_id=info["debug_id"], wait_ms=0)
    gdb_pid = ws.extensions["debug.sessions"].entries[info["debug_id"]].session._proc.pid
    ws.close(prog.handle)
    assert _gone(info["pid"]) and _gone(gdb_pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(gdb_pid, 0)


def test_allow_debug_on_the_server_commands_grants_the_permission() -> None:
    from binlens.cli.main import build_parser
    from binlens.cli.server_args import permissions

    parser = build_parser()
    for command in ("mcp", "serve"):
        assert permissions(parser.parse_args([command, "f", "--allow-debug"])) == frozenset({"debug"})
        assert permissions(parser.parse_args([command, "f"])) == frozenset()


def test_the_debug_command_reads_commands_from_stdin(debuggee: Any, tmp_path: Path) -> None:
    from conftest import run_cli

    path, syms = debuggee
    work = f"sub_{syms['work']:x}"
    script = f"b {work} if $rdi == 2\nr\nregs rdi\nbt\nx {work} 4\nlocals\np $rdi + 1\n"
    script += "finish\ndelete 1\nc\nbogus\ninfo\n"
    done = run_cli("debug", str(path), "--", "3", home=tmp_path, stdin=script, timeout=120)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert re.search(rf"\[breakpoint 1\] 0x[0-9a-f]+ \(static {hex(syms['work'])}, {work}\)", out), out
    assert "rdi 0x2" in out and re.search(rf"#0 +0x[0-9a-f]+ \(static {hex(syms['work'])}, {work}\)", out)
    assert "(no debug information for this frame)" in out and "$rdi + 1 = 3" in out
    assert "[exited with code 30]" in out and "unknown command 'bogus'" in out and "total 30" in out


def test_an_i386_static_pie_is_debugged_with_its_own_registers(tmp_path: Path) -> None:
    """gdb debugs i386 targets on x86-64: a stripped static PIE built by the i686 cross compiler."""
    cc = shutil.which("i686-linux-gnu-gcc")
    if cc is None:
        pytest.skip("no i686 cross compiler (apt-get install gcc-i686-linux-gnu libc6-dev-i386-cross)")
    full, stripped = tmp_path / "d32", tmp_path / "d32-stripped"
    src = Path(__file__).parent / "fixtures" / "src" / "debuggee.c"
    subprocess.run([cc, "-O1", "-static-pie", "-fPIE", "-o", str(full), str(src)], check=True, capture_output=True)
    subprocess.run(["i686-linux-gnu-strip", "-s", "-o", str(stripped), str(full)], check=True, capture_output=True)
    if subprocess.run([str(full), "1"], capture_output=True).returncode != 3:
        pytest.skip("this kernel does not run i386 programs")
    work = symbols(full)["work"]
    ws = make_ws(tmp_path / "home")
    ws.open(stripped)
    d = call(ws, "debug.start", args=["3"], timeout_ms=60000)["debug_id"]
    call(ws, "breakpoint.create", debug_id=d, selector={"name": f"sub_{work:x}"})
    event = call(ws, "debug.continue", debug_id=d, wait_ms=30000)["event"]
    assert event["kind"] == "breakpoint" and event["static_address"] == hex(work)
    regs = {r["name"]: r["value"] for r in call(ws, "register.get", debug_id=d)["registers"]}
    assert int(regs["eip"], 16) == int(event["address"], 16) and "rax" not in regs
    frames = call(ws, "backtrace.get", debug_id=d)["frames"]
    assert frames[1]["function"]["name"].startswith("sub_")
    assert call(ws, "debug.kill", debug_id=d)["state"] == "exited"
    close_all(ws)


FAKE_GDB = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "GNU gdb (fake) 13.1"; exit 0; fi
echo $$ > "$(dirname "$0")/gdb.pid"
exec sleep 600
"""


def test_a_gdb_that_does_not_answer_times_out_and_is_killed(
    home: Path, debuggee: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin" / "gdb"
    fake.parent.mkdir()
    fake.write_text(FAKE_GDB)
    fake.chmod(0o755)
    monkeypatch.setenv("BINLENS_GDB", str(fake))
    ws = make_ws(home)
    ws.open(debuggee[0])
    err = fails("timeout", ws, "debug.start", timeout_ms=500)
    assert err.details["reason"] == "timeout"
    assert _gone(int((fake.parent / "gdb.pid").read_text()))  # its process group was killed
    assert call(ws, "debug.list")["items"] == []
    close_all(ws)


def test_a_read_across_the_end_of_a_mapping_answers_the_readable_part(home: Path, debuggee: Any) -> None:
    ws = make_ws(home)
    ws.open(debuggee[0])
    d = call(ws, "debug.start", args=["1"], timeout_ms=60000)["debug_id"]
    maps = call(ws, "memory_map.list", debug_id=d, page={"limit": 1000})["items"]
    below, above = next(
        (a, b)
        for a, b in zip(maps, maps[1:], strict=False)
        if a["end"] != b["start"] and a["path"].startswith("/") and b["path"] == "[stack]"
    )  # (ld.so's data, then the gap below the stack)
    end, start = int(below["end"], 16), int(above["start"], 16)
    pid = call(ws, "debug.get", debug_id=d)["pid"]
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(end - 8)
        last = mem.read(8)
        mem.seek(start)
        first = mem.read(8)

    # from a mapped page into an unmapped one: the readable prefix, and the bytes past it named
    got = call(ws, "debug_memory.read", debug_id=d, address=hex(end - 8), size=24)
    assert (got["size"], bytes.fromhex(got["bytes"]), got["complete"]) == (8, last, False)
    assert got["unreadable"] == [{"address": hex(end), "size": 16}]
    assert got["segments"] == [{"address": hex(end - 8), "static_address": got["static_address"], "size": 8,
                                "bytes": last.hex()}]  # fmt: skip
    # one byte past the end (gdb alone answers a byte that is not there)
    one = call(ws, "debug_memory.read", debug_id=d, address=hex(end - 8), size=9)
    assert one["size"] == 8 and one["unreadable"] == [{"address": hex(end), "size": 1}]
    # from an unmapped page into a mapped one: no prefix, the readable run after the gap
    into = call(ws, "debug_memory.read", debug_id=d, address=hex(start - 8), size=16)
    assert (into["size"], into["bytes"], into["complete"]) == (0, "", False)
    assert into["unreadable"] == [{"address": hex(start - 8), "size": 8}]
    assert [(s["address"], s["bytes"]) for s in into["segments"]] == [(hex(start), first.hex())]
    # a range wholly unmapped is an error at the address
    err = fails("invalid_argument", ws, "debug_memory.read", debug_id=d, address=hex(end + 0x100), size=16)
    assert err.target == "/params/address" and err.details["reason"] == "unreadable"
    whole = call(ws, "debug_memory.read", debug_id=d, address=hex(end - 16), size=16)
    assert whole["complete"] and whole["unreadable"] == [] and whole["segments"] is None
    close_all(ws)
