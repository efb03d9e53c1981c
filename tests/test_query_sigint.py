"""SIGINT on a real `binlens query`: the call is cancelled through its CallContext, the processes
it started are killed, and the usual envelope carries a `cancelled` error (exit status 1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serve_support import env_for

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def start_query(home: Path, binary: Path, request: dict[str, object]) -> subprocess.Popen[str]:
    """`python -m binlens query -b BINARY REQUEST`, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "binlens", "query", "-b", str(binary), json.dumps(request)],
        env=env_for(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def child_running(parent: int, marker: str, timeout: float = 120) -> int | None:
    """The pid of a child of `parent` whose command line holds `marker`, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and marker in cmdline:
                return int(entry.name)
        time.sleep(0.05)
    return None


def database_open(pid: int, home: Path, timeout: float = 120) -> bool:
    """Wait until process `pid` holds a program database under `home` open."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            targets = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            targets = []  # (a descriptor closed while listed)
        if any(t.startswith(str(home)) and t.endswith(".sqlite") for t in targets):
            return True
        time.sleep(0.02)
    return False


def gone(group: int) -> bool:
    """No live process (zombies aside) is left in this process group."""
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return False
    return True


def interrupted(proc: subprocess.Popen[str]) -> dict[str, object]:
    """SIGINT, then the one JSON object the query printed."""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the call finished before the signal arrived")
    assert proc.returncode == 1, err[-2000:]
    return json.loads(out)  # type: ignore[no-any-return]


def test_sigint_cancels_a_long_memory_search(tmp_path: Path, compile_c) -> None:  # noqa: ANN001
    bomb = compile_c("regex_bomb.c")
    request = {"method": "memory.search", "params": {"regex": "(a|a)+$", "scan": {"timeout_ms": 60000}}}
    proc = start_query(tmp_path / "home", bomb, request)
    try:
        child = child_running(proc.pid, "_regex_child.py")
        assert child is not None, "the search never started its regex process"
        t0 = time.monotonic()
        doc = interrupted(proc)
        assert time.monotonic() - t0 < 20, "SIGINT did not stop the search"
    finally:
        proc.kill()
    assert doc["method"] == "memory.search"
    assert doc["error"]["code"] == "cancelled"  # type: ignore[index]
    assert "result" not in doc
    assert gone(child), "the regex process outlived the query"


def test_sigint_cancels_the_first_analysis(tmp_path: Path) -> None:
    if not LIBC.is_file():
        pytest.skip(f"{LIBC} is not on this machine")
    proc = start_query(tmp_path / "home", LIBC, {"method": "function.list", "params": {"page": {"limit": 1}}})
    try:
        worker = child_running(proc.pid, "binlens.jobs.child")
        assert worker is not None, "the query never started its analysis process"
        # that process starts before the query's own imports; the program database opens once the
        # query's SIGINT handler is in place
        assert database_open(proc.pid, tmp_path / "home"), "the query never opened the program"
        doc = interrupted(proc)
    finally:
        proc.kill()
    assert doc["error"]["code"] == "cancelled"  # type: ignore[index]
    assert doc["program"] is not None
    assert gone(worker), "the analysis process outlived the query"
