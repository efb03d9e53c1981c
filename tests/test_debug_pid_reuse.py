"""A pinned target whose pid is reused for real: the process exits, and another process (running the
same file, so only the start time tells them apart) is made to get its pid number by writing
/proc/sys/kernel/ns_last_pid (root, CAP_SYS_ADMIN) just before it is forked. Every later call must
answer process_changed or process_exited, never act on the new process, and ending the session
must leave the new process alone. Timeouts here are hang bounds only."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from binlens.api import invoke
from binlens.api.live import pin_live
from binlens.errors import BinlensError
from binlens.providers.target import TargetIdentity, process_start_time
from binlens.workspace import Config, Workspace
from test_debug import call, close_all, make_ws

pytestmark = pytest.mark.timeout(180)

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
TRIES = 200  # another process of the machine may take the pid between the write and the fork


def spawn_with_pid(pid: int, argv: list[str]) -> subprocess.Popen[bytes]:
    """Start `argv` as process `pid` (a pid number that is free again), or skip the test where the
    kernel does not let this process choose the next pid."""
    for _ in range(TRIES):
        try:
            NS_LAST_PID.write_text(str(pid - 1))
        except OSError as err:
            pytest.skip(f"cannot choose the next pid here (writing {NS_LAST_PID}: {err.strerror}; needs CAP_SYS_ADMIN)")
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait(30)
    pytest.skip(f"pid {pid} was taken by other processes {TRIES} times in a row")


def kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill a child of the test and reap it, so its pid number is free."""
    proc.kill()
    proc.wait(60)
    assert process_start_time(proc.pid) is None


@pytest.fixture()
def looping(compile_c: Any) -> tuple[Path, list[subprocess.Popen[bytes]]]:
    """The stripped debuggee (its argument 0 loops until killed) and a list of the processes a test
    starts (killed at the end)."""
    procs: list[subprocess.Popen[bytes]] = []
    yield compile_c("debuggee.c", opt="-O1", strip=True), procs
    for proc in procs:
        proc.kill()
        proc.wait(30)


def test_a_reused_pid_of_a_live_pinned_process_answers_process_changed(looping: Any, tmp_path: Path) -> None:
    path, procs = looping
    first = subprocess.Popen([str(path), "0"], stdout=subprocess.DEVNULL)
    procs.append(first)
    ws = Workspace(Config(home=tmp_path / "home", permissions=frozenset({"live"})))
    pin_live(ws, ws.open(path), first.pid)
    pinned = TargetIdentity.pin(first.pid)
    assert invoke(ws, "live.maps", {})["items"]
    time.sleep(0.05)  # (start times count clock ticks: the second process starts in a later one)

    kill_and_reap(first)
    second = spawn_with_pid(first.pid, [str(path), "0"])
    procs.append(second)
    now = TargetIdentity.pin(second.pid)
    assert (now.pid, now.exe_inode, now.sha256) == (pinned.pid, pinned.exe_inode, pinned.sha256)
    assert now.start_time != pinned.start_time  # the same pid, the same file: another process

    for method, params in (
        ("live.maps", {}),
        ("live.resolve", {"addresses": ["0x1000"]}),
        ("live.memscan", {"values": [{"text": "total"}], "timeout_ms": 1000}),
    ):
        with pytest.raises(BinlensError) as info:
            invoke(ws, method, params)
        assert info.value.code == "process_changed", (method, info.value.to_dict())
        assert info.value.details["start_time"] == now.start_time
    with pytest.raises(BinlensError) as info:
        pinned.check()
    assert info.value.code == "process_changed"
    for handle in list(ws.programs):
        ws.close(handle)
    assert second.poll() is None


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (apt-get install gdb)")
@pytest.mark.parametrize("how", ["attach", "start"])
def test_a_reused_pid_of_a_debug_target_is_never_acted_on(how: str, looping: Any, home: Path) -> None:
    """The target exits behind the session's back (SIGKILL from outside); a new process of the same
    file gets its pid. Calls answer process_exited (gdb saw the exit) or process_changed (the pid
    check saw the new start time first), and closing the session leaves the new process running."""
    pytest.importorskip("pygdbmi", reason="pip install 'binlens[debug]'")
    path, procs = looping
    ws = make_ws(home)
    ws.open(path)
    first: subprocess.Popen[bytes] | None = None
    if how == "attach":
        first = subprocess.Popen([str(path), "0"], stdout=subprocess.DEVNULL)
        procs.append(first)
        info = call(ws, "debug.attach", pid=first.pid, timeout_ms=60000)
    else:
        info = call(ws, "debug.start", args=["0"], timeout_ms=60000)
    d, pid = info["debug_id"], info["pid"]
    call(ws, "debug.continue", debug_id=d, wait_ms=200)  # running, a while: a later clock tick
    os.kill(pid, 9)
    if first is not None:
        first.wait(60)  # (the test is its parent: it reaps it once gdb, its tracer, lets go)
    deadline = time.monotonic() + 60
    while process_start_time(pid) is not None or os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, "the killed target was never reaped"
        time.sleep(0.02)

    second = spawn_with_pid(pid, [str(path), "0"])
    procs.append(second)
    assert TargetIdentity.pin(pid).start_time != info["identity"]["start_time"]
    for method, params in (
        ("register.get", {}),
        ("thread.list", {}),
        ("memory_map.list", {}),
        ("debug_memory.read", {"selector": {"address": "0x1000"}, "size": 4}),
        ("debug.interrupt", {}),
        ("debug.continue", {}),
    ):
        with pytest.raises(BinlensError) as caught:
            invoke(ws, method, {"debug_id": d, **params})
        assert caught.value.code in ("process_exited", "process_changed"), (method, caught.value.to_dict())
    # gdb reports the exit (it may reap the pid before it says so: the pid check covers that window)
    deadline = time.monotonic() + 60
    while call(ws, "debug.get", debug_id=d)["state"] != "exited":
        assert time.monotonic() < deadline, "gdb never reported the exit"
        call(ws, "debug.wait", debug_id=d, timeout_ms=1000)
    close_all(ws)
    time.sleep(0.2)
    assert second.poll() is None  # not killed as if it were the session's target
    assert TargetIdentity.pin(pid).start_time == process_start_time(second.pid)
