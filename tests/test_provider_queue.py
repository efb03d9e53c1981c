"""Provider sessions take turns (SPEC §6): a call that finds a program's provider process serving
another waits in a short queue, first come first served, within its own timeout and cancellation.

The calls drive real child processes of the test-only provider in test_providers.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from binlens.errors import BinlensError
from binlens.providers.process import ProcessSession
from conftest import ROOT
from test_providers import HANDLER, HANG_BOUND_S, fails

pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def session(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A session of the test-only provider (the child imports test_providers.py from tests/)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = ProcessSession("edge", HANDLER, open_blob=b"x" * 1000, memory_limit=512 << 20, start_timeout=60)
    yield s
    s.close()


class Waiter:
    """A call's context that records its progress reports and can be cancelled."""

    def __init__(self) -> None:
        self.cancelled = False
        self.reports: list[str] = []

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self.reports.append(message or "")


def test_calls_take_turns_in_arrival_order_and_say_they_wait(session: ProcessSession) -> None:
    """A call that finds the child serving another waits for its turn (reporting how many calls are
    ahead) and then runs in the same process; waiting calls run first come first served."""
    first = session.call("echo", {}, timeout=60)[0]["pid"]
    done: list[str] = []
    waiters = [Waiter(), Waiter()]

    def run(name: str, op: str, args: dict[str, Any], ctx: Any = None) -> None:
        session.call(op, args, timeout=HANG_BOUND_S, ctx=ctx)
        done.append(name)

    running = threading.Thread(target=run, args=("running", "count", {"to": 20, "pause": 0.1}))
    running.start()
    time.sleep(0.5)
    queued = []
    for i, w in enumerate(waiters):
        queued.append(threading.Thread(target=run, args=(f"queued{i}", "echo", {}, w)))
        queued[-1].start()
        time.sleep(0.3)
    for t in (running, *queued):
        t.join(HANG_BOUND_S)
    assert done == ["running", "queued0", "queued1"]
    assert waiters[0].reports[0] == "waiting for the edge session: 1 call ahead"
    assert waiters[1].reports[0] == "waiting for the edge session: 2 calls ahead"
    assert "waiting for the edge session: 1 call ahead" in waiters[1].reports
    assert session.pid == first and session.starts == 1


def test_a_full_queue_is_busy_and_a_queued_timeout_leaves_the_running_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `max_waiting` queued calls one more answers `busy` at once; a queued call whose timeout
    passes answers `timeout` (reason `queued`) and the running call goes on in its process."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = ProcessSession("edge", HANDLER, memory_limit=512 << 20, start_timeout=60, max_waiting=1)
    try:
        pid = s.call("echo", {}, timeout=60)[0]["pid"]
        answers: list[Any] = []
        running = threading.Thread(
            target=lambda: answers.append(s.call("count", {"to": 30, "pause": 0.1}, timeout=HANG_BOUND_S)[0])
        )
        running.start()
        time.sleep(0.5)
        t = time.monotonic()
        err = fails("timeout", s.call, "echo", {}, timeout=1.0)
        assert time.monotonic() - t < HANG_BOUND_S
        assert err.details["reason"] == "queued" and err.details["timeout_ms"] == 1000
        queued = threading.Thread(target=lambda: answers.append(s.call("echo", {}, timeout=HANG_BOUND_S)[0]))
        queued.start()
        time.sleep(0.3)
        err = fails("busy", s.call, "echo", {}, timeout=10)
        assert err.details == {"provider": "edge", "waiting": 1}
        running.join(HANG_BOUND_S)
        queued.join(HANG_BOUND_S)
        assert answers[0] == {"counted": 30} and answers[1]["pid"] == pid and s.starts == 1
    finally:
        s.close()


def test_a_queued_call_cancelled_or_closed_stops_waiting(session: ProcessSession, tmp_path: Path) -> None:
    """A queued call that is cancelled answers `cancelled` without touching the running call; closing
    the session answers the calls still waiting `unavailable`."""
    pid = session.call("echo", {}, timeout=60)[0]["pid"]
    answers: list[Any] = []
    running = threading.Thread(
        target=lambda: answers.append(session.call("count", {"to": 20, "pause": 0.1}, timeout=HANG_BOUND_S)[0])
    )
    running.start()
    time.sleep(0.5)
    w = Waiter()
    threading.Timer(0.5, lambda: setattr(w, "cancelled", True)).start()
    fails("cancelled", session.call, "echo", {}, timeout=HANG_BOUND_S, ctx=w)
    running.join(HANG_BOUND_S)
    assert answers == [{"counted": 20}] and session.pid == pid
    errors: list[BinlensError] = []

    def queued() -> None:
        try:
            session.call("echo", {}, timeout=HANG_BOUND_S)
        except BinlensError as err:
            errors.append(err)

    waiting = threading.Thread(target=queued)
    blocker = threading.Thread(
        target=lambda: errors.append(
            fails("unavailable", session.call, "hang", {"pidfile": str(tmp_path / "p")}, timeout=HANG_BOUND_S)
        )
    )
    blocker.start()
    time.sleep(0.5)
    waiting.start()
    time.sleep(0.3)
    session.close()
    blocker.join(HANG_BOUND_S)
    waiting.join(HANG_BOUND_S)
    assert [e.code for e in errors] == ["unavailable", "unavailable"]
    assert {e.details["reason"] for e in errors} == {"closed"}
