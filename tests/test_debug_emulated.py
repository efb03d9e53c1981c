"""An AArch64 program debugged on this x86-64 machine: the stripped PIE debuggee, built by the
cross compiler, runs under QEMU's user-mode emulator (qemu-aarch64 -g on a Unix socket) and
gdb-multiarch debugs it through the same methods: a breakpoint by the user's name with a
condition on x0, registers, memory, backtrace, step, finish, exit, and the refusals of what QEMU's
gdb stub cannot do. Timeouts here are hang bounds only."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from test_debug import _gone, call, close_all, fails, make_ws

TRIPLE = "aarch64-linux-gnu"
pytestmark = [
    pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="apt-get install qemu-user"),
    pytest.mark.skipif(shutil.which("gdb-multiarch") is None, reason="apt-get install gdb-multiarch"),
    pytest.mark.skipif(shutil.which(f"{TRIPLE}-gcc") is None, reason=f"apt-get install gcc-{TRIPLE}"),
    pytest.mark.skipif(not os.path.isdir(f"/usr/{TRIPLE}/lib"), reason="apt-get install libc6-arm64-cross"),
    pytest.mark.timeout(180),
]
pytest.importorskip("pygdbmi", reason="pip install 'binlens[debug]'")


@pytest.fixture()
def a64(tmp_path: Path) -> tuple[Path, int]:
    """The stripped AArch64 PIE debuggee and the static address of its `work` function."""
    src = Path(__file__).parent / "fixtures" / "src" / "debuggee.c"
    full, stripped = tmp_path / "a64", tmp_path / "a64-stripped"
    subprocess.run([f"{TRIPLE}-gcc", "-O1", "-fPIE", "-pie", "-o", str(full), str(src)], check=True)
    subprocess.run([f"{TRIPLE}-strip", "-s", "-o", str(stripped), str(full)], check=True)
    nm = subprocess.run([f"{TRIPLE}-nm", str(full)], check=True, capture_output=True, text=True).stdout
    return stripped, next(int(line.split()[0], 16) for line in nm.splitlines() if line.endswith(" work"))


def test_an_aarch64_pie_is_debugged_under_qemu(home: Path, a64: Any) -> None:
    path, work = a64
    ws = make_ws(home)
    prog = ws.open(path)
    assert prog.image.identity.arch == "aarch64"
    call(ws, "symbol.patch", selector={"address": hex(work)}, name="accumulate")
    started = call(ws, "debug.start", args=["3"], timeout_ms=60000)
    d, ident = started["debug_id"], started["identity"]
    assert started["state"] == "stopped" and ident["sha256"] == prog.image.identity.sha256
    assert ident["emulator"].endswith("qemu-aarch64") and os.readlink(f"/proc/{ident['pid']}/exe") == ident["emulator"]
    slide = int(started["slide"], 16)
    assert slide != 0  # a PIE: the program's place in QEMU's process, from /proc/PID/maps

    bp = call(ws, "breakpoint.create", debug_id=d, selector={"name": "accumulate"}, condition="$x0 == 2")
    assert int(bp["address"], 16) == work + slide
    event = call(ws, "debug.continue", debug_id=d, wait_ms=60000)["event"]
    assert event["kind"] == "breakpoint" and event["static_address"] == hex(work)
    assert event["function"]["name"] == "accumulate"
    regs = {r["name"]: r["value"] for r in call(ws, "register.get", debug_id=d)["registers"]}
    assert int(regs["x0"], 16) == 2 and int(regs["pc"], 16) == work + slide and "rax" not in regs
    mem = call(ws, "debug_memory.read", debug_id=d, selector={"name": "accumulate"}, size=16)
    seg = next(s for s in prog.image.segments if s.va <= work < s.va + s.fsize)
    assert bytes.fromhex(mem["bytes"]) == path.read_bytes()[seg.offset + work - seg.va :][:16]
    frames = call(ws, "backtrace.get", debug_id=d)["frames"]
    assert frames[0]["function"]["name"] == "accumulate" and frames[1]["function"]["name"].startswith("sub_")
    assert call(ws, "debug_variable.evaluate", debug_id=d, expression="$x0 * 5")["value"] == "10"

    err = fails("unsupported", ws, "breakpoint.create", debug_id=d, address=hex(work + slide), hardware=True)
    assert err.target == "/params/hardware" and err.details["reason"] == "emulated"
    fails("unsupported", ws, "watchpoint.create", debug_id=d, address=hex(work + slide), size=8)

    stepped = call(ws, "debug.step", debug_id=d)["event"]
    assert stepped["kind"] == "step" and int(stepped["static_address"], 16) == work + 4  # one A64 instruction
    finished = call(ws, "debug.finish", debug_id=d)["event"]
    assert finished["function"]["name"] != "accumulate" and finished["static_address"] is not None
    call(ws, "breakpoint.delete", debug_id=d, id=bp["id"])
    done = call(ws, "debug.continue", debug_id=d, wait_ms=60000)["event"]
    assert done["kind"] == "exited" and done["exit_code"] == (3 + 9 + 18) & 0x7F
    assert "total 30" in call(ws, "debug.get", debug_id=d)["output_tail"]
    fails("process_exited", ws, "register.get", debug_id=d)
    assert _gone(ident["pid"])

    # a running target is killed (QEMU with it) when its program closes
    running = call(ws, "debug.start", args=["0"], timeout_ms=60000)
    call(ws, "debug.continue", debug_id=running["debug_id"], wait_ms=0)
    close_all(ws)
    assert _gone(running["pid"])


def test_without_qemu_an_aarch64_start_says_what_to_install(
    home: Path, a64: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gdb").symlink_to(shutil.which("gdb") or "gdb")  # gdb alone: no qemu-aarch64, no gdb-multiarch
    monkeypatch.setenv("PATH", str(bin_dir))
    ws = make_ws(home)
    ws.open(a64[0])
    err = fails("unavailable", ws, "debug.start", timeout_ms=60000)
    assert err.details["reason"] == "emulator_missing" and "qemu-user" in err.details["remediation"]
    assert "qemu-aarch64 and gdb-multiarch" in err.message
    assert call(ws, "debug.list")["items"] == []
    close_all(ws)
