"""program.close drains the program's work (issue 26 item 5): a running analysis is stopped and
its process waited for; what cannot be stopped in time is reported as `cleanup_incomplete` with
the resources that remain."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from binlens.api import invoke
from binlens.jobs import state as job_state
from binlens.jobs.state import analysis_of
from binlens.workspace import Config, Workspace

pytestmark = pytest.mark.timeout(180)
HANG_BOUND_S = 60


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:  # (gone while being read)
        return False


def _running_analysis(home: Path, path: Path) -> tuple[Workspace, str, int]:
    """A workspace whose program's analysis process is running (mcp_big.c takes seconds)."""
    ws = Workspace(Config(home=home))
    handle = invoke(ws, "program.open", {"path": str(path)})["identity"]["program"]
    invoke(ws, "analysis.start", {})
    st = analysis_of(ws.programs[handle])
    deadline = time.monotonic() + HANG_BOUND_S
    while st.worker is None and st.status == "running" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert st.worker is not None and st.status == "running", st.snapshot()
    return ws, handle, st.worker.pid


def test_close_stops_a_running_analysis_and_waits_for_its_process(tmp_path: Path, compile_c) -> None:  # noqa: ANN001
    ws, handle, pid = _running_analysis(tmp_path / "home", compile_c("mcp_big.c"))
    out = invoke(ws, "program.close", {"program": handle})
    assert out == {"closed": handle, "cleanup_incomplete": False, "remaining": []}
    assert not _alive(pid)


def test_what_cannot_be_stopped_in_time_is_reported(tmp_path: Path, compile_c, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(job_state, "CLOSE_DRAIN_S", 0.0)  # no time to wait: the process is still there
    ws, handle, pid = _running_analysis(tmp_path / "home", compile_c("mcp_big.c"))
    run_id = analysis_of(ws.programs[handle]).run_id
    out = invoke(ws, "program.close", {"program": handle})
    assert out["cleanup_incomplete"] is True
    assert out["remaining"] == [f"analysis run {run_id} (process {pid})"]
    deadline = time.monotonic() + HANG_BOUND_S  # it was told to stop: it goes soon after
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


SLOW_REGEX = r"\x00{0,20}[^\x00]\x00{3}z"  # (test_mcp_clients: ~10 s over mcp_big's 32 MiB)


def test_close_cancels_the_calls_running_on_the_program(tmp_path: Path, compile_c) -> None:  # noqa: ANN001
    """A long memory.search on the program is cancelled by program.close, which answers once the
    call has ended; the call answers `cancelled`."""
    import threading

    from binlens.api.registry import CallContext
    from binlens.errors import BinlensError

    ws = Workspace(Config(home=tmp_path / "home"))
    handle = invoke(ws, "program.open", {"path": str(compile_c("mcp_big.c"))})["identity"]["program"]
    started = threading.Event()
    ctx = CallContext(progress=lambda *_: started.set())
    outcome: list[str] = []

    def search() -> None:
        try:
            invoke(ws, "memory.search", {"regex": SLOW_REGEX, "scan": {"timeout_ms": 60000}}, ctx)
            outcome.append("finished")
        except BinlensError as err:
            outcome.append(err.code)

    worker = threading.Thread(target=search)
    worker.start()
    assert started.wait(HANG_BOUND_S)
    out = invoke(ws, "program.close", {"program": handle})
    assert out == {"closed": handle, "cleanup_incomplete": False, "remaining": []}
    assert outcome == ["cancelled"]  # (ended before close answered)
    worker.join(HANG_BOUND_S)
