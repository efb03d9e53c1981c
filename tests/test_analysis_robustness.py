"""Malformed and fuzzed binaries: the analysis finishes or fails with a clear error, never crashes or hangs."""

from __future__ import annotations

import time

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError
from conftest import corpus_dir


def _sample() -> list:
    try:
        folder = corpus_dir("fuzzed")
    except pytest.skip.Exception:
        return []
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return files[::20]


@pytest.mark.parametrize("path", _sample() or [None], ids=lambda p: p.name if p else "absent")
def test_fuzzed_file_is_analysed_or_refused_clearly(workspace, path):
    if path is None:
        pytest.skip("the fuzzed corpus is absent")
    try:
        workspace.open(path, check_roots=False)
    except BinlensError as err:
        assert err.code in ("invalid_argument", "unsupported", "not_found")
        return
    t = time.monotonic()
    try:
        status = invoke(workspace, "analysis.start", {"wait": True, "timeout_ms": 60000})
    except BinlensError as err:
        assert err.code in ("unavailable", "unsupported"), err.message
        status = invoke(workspace, "analysis.get", {})
        assert status["status"] == "failed" and not status["error"].startswith("internal"), status
        return
    assert time.monotonic() - t < 60
    assert status["status"] in ("done", "failed")
    if status["status"] == "done":
        listed = invoke(workspace, "function.list", {"page": {"limit": 5}})
        assert isinstance(listed["items"], list)
        for f in listed["items"]:
            invoke(workspace, "listing.get", {"selector": {"address": f["address"]}, "max_instructions": 50})
