"""batch.execute and the response budget: an all_or_none batch whose response cannot fit commits nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError
from binlens.workspace import Config, Limits, Workspace

BUDGET = 64 * 1024


@pytest.fixture()
def sample(compile_c) -> Path:  # noqa: ANN001
    return compile_c("sample.c", "-O0")


def open_ws(home: Path, sample: Path, budget: int = BUDGET) -> Workspace:
    ws = Workspace(Config(home=home, limits=Limits(max_response_bytes=budget)))
    ws.open(sample, check_roots=False)
    return ws


def comments(home: Path, sample: Path) -> list[dict[str, Any]]:
    """Every comment, read through the API by a fresh workspace (its own database connection)."""
    ws = open_ws(home, sample)
    return invoke(ws, "comment.list", {})["items"]


def items(ws: Workspace) -> list[dict[str, Any]]:
    """comment.create, then enough memory.reads of .text that their results overflow BUDGET twice over
    (each one alone fits)."""
    prog = next(iter(ws.programs.values()))
    text = next(s for s in prog.image.sections if s.name == ".text")
    length = min(8 * 1024, text.size)
    read = {"method": "memory.read", "params": {"address": hex(text.va), "length": length}}
    create = {"method": "comment.create", "params": {"selector": {"name": "main"}, "text": "batched"}}
    return [create] + [read] * (2 * BUDGET // (2 * length) + 1)


def test_all_or_none_batch_too_large_for_the_budget_commits_nothing(home, sample):
    ws = open_ws(home, sample)
    batch = items(ws)
    with pytest.raises(BinlensError) as info:
        invoke(ws, "batch.execute", {"mode": "all_or_none", "items": batch})
    err = info.value
    assert err.code == "response_too_large", err.to_dict()
    assert comments(home, sample) == []
    assert err.details["limit"] == BUDGET and err.details["rolled_back"] is True
    # the journal has no entry of the batch either
    assert invoke(ws, "journal.list", {"page": {"limit": 1000}})["items"] == []
    # the same batch fits once its results are left out, and then commits
    out = invoke(ws, "batch.execute", {"mode": "all_or_none", "items": batch, "include_results": False})
    assert out["succeeded"] == len(batch)
    assert [c["text"] for c in comments(home, sample)] == ["batched"]


def test_per_item_batch_too_large_for_the_budget_keeps_its_commits_and_says_so(home, sample):
    ws = open_ws(home, sample)
    batch = items(ws)
    with pytest.raises(BinlensError) as info:
        invoke(ws, "batch.execute", {"mode": "per_item", "items": batch})
    err = info.value
    assert err.code == "response_too_large", err.to_dict()
    assert err.details["limit"] == BUDGET
    # per_item commits each item as it runs: the error says so, and names the batch to look it up
    assert err.details["committed"] is True and err.details["succeeded"] == len(batch)
    assert err.details["failed"] == 0
    batch_id = err.details["batch_id"]
    entries = invoke(ws, "journal.list", {"batch": batch_id, "page": {"limit": 100}})["items"]
    assert [e["method"] for e in entries] == ["comment.create"]
    assert [c["text"] for c in comments(home, sample)] == ["batched"]
