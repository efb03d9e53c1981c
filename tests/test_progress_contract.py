"""Progress as REA words it (issue 26 item 5): what reaches the client is monotonic, comes at most
once per 100 ms between the first and the last update, always ends with one terminal update
(done, failed, cancelled, timeout), and carries a total only when the method gave one."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from binlens.api import invoke
from binlens.api.registry import CallContext
from binlens.errors import BinlensError
from binlens.workspace import Config, Workspace
from conftest import ROOT
from mcp_support import env_for

pytestmark = pytest.mark.timeout(240)


def _recorder() -> tuple[list[tuple[float, float, float | None, str | None]], CallContext]:
    sent: list[tuple[float, float, float | None, str | None]] = []
    ctx = CallContext(progress=lambda d, t, m: sent.append((time.monotonic(), d, t, m)))
    return sent, ctx


def test_updates_never_go_back_and_come_at_most_every_100_ms() -> None:
    sent, ctx = _recorder()
    ctx.progress(5, 10)
    for i in range(2000):  # a method reporting far too often, and going back
        ctx.progress(3 if i % 2 else 6, 10)
    time.sleep(0.12)
    ctx.progress(4, 10)  # lower than before: reported as the most so far
    ctx.progress(10, 10, "all")  # the terminal update is sent at once, and once
    ctx.progress(10, 10, "again")
    ctx.finish("done")
    values = [d for _, d, _, _ in sent]
    assert values == [5, 6, 10]
    assert sent[-1][3] == "all"


def test_a_call_that_reported_progress_ends_with_one_terminal_update(tmp_path: Path, compile_c) -> None:  # noqa: ANN001
    """A call that reported progress ends with exactly one terminal update saying how it ended
    (cancelled here, distinct from a timeout), with no total the method did not give; a call that
    reported none sends none."""
    ws = Workspace(Config(home=tmp_path))
    sent, ctx = _recorder()
    invoke(ws, "session.get", {}, ctx)
    assert sent == []

    invoke(ws, "program.open", {"path": str(compile_c("mcp_big.c"))})
    sent: list = []
    ctx = CallContext(progress=lambda d, t, m: (sent.append((d, t, m)), ctx.cancel()))
    with pytest.raises(BinlensError) as info:
        invoke(ws, "memory.search", {"pattern": "fe fd fc fb", "scan": {"timeout_ms": 60000}}, ctx)
    assert info.value.code == "cancelled"
    assert len(sent) == 2 and sent[-1][2] == "cancelled"
    assert sent[0][1] is not None and sent[-1][0] == sent[0][0] < sent[-1][1]  # no fabricated completion

    sent, ctx = _recorder()  # a batch: its items' calls do not end the batch's progress
    items = [{"method": "program.get", "params": {}}, {"method": "session.get", "params": {}}]
    invoke(ws, "batch.execute", {"items": items, "mode": "per_item"}, ctx)
    assert [m for *_, m in sent].count("done") <= 1 and sent[-1][1] == 2 and sent[-1][2] == 2


def test_over_mcp_progress_is_monotonic_paced_and_terminal(tmp_path: Path, compile_c) -> None:  # noqa: ANN001
    """The official client over stdio: a long memory.search's notifications never go back, are no
    more than one per 100 ms of the call (plus the last), and end with the search's total."""
    big = compile_c("mcp_big.c")
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "binlens", "mcp", str(big)], env=env_for(tmp_path / "home"),
        cwd=str(ROOT),
    )  # fmt: skip
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def main() -> float:
        async with Client(params, mode="legacy") as client:
            args = {"operation": "search", "params": {"pattern": "fe fd fc fb", "scan": {"timeout_ms": 60000}}}
            started = time.monotonic()
            res = await client.call_tool("binlens_memory", args, progress_callback=on_progress)
            elapsed = time.monotonic() - started
            assert res.is_error is False
            return elapsed

    elapsed = anyio.run(main)
    assert seen, "no progress arrived"
    values = [p for p, _, _ in seen]
    assert values == sorted(values)
    assert len(seen) <= elapsed / 0.1 + 2
    last = seen[-1]
    assert last[1] is not None and last[0] == last[1]  # the terminal update: all of the total done
