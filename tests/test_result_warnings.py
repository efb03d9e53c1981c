"""`warnings`: functions only heuristics found say so, in function results and the query envelope.

`tests/fixtures/src/noret_epilogue.S`, stripped, holds `spare` and `leaf`, which nothing calls: the
engine finds them by their prologues alone (source `prologue`), and the results say they are guesses.
"""

from __future__ import annotations

import json

import pytest

from binlens.api import CallContext, invoke
from binlens.loader.parse_lief import parse_path
from conftest import run_cli


@pytest.fixture(scope="module")
def builds(compile_c):
    unstripped = compile_c("noret_epilogue.S", "-O2", False)
    names = {s.name: s.address for s in parse_path(str(unstripped)).symbols}
    return compile_c("noret_epilogue.S", "-O2", False, strip=True), names


def test_function_results_say_which_starts_are_guesses(workspace, builds):
    exe, names = builds
    workspace.open(str(exe), check_roots=False)
    ctx = CallContext()
    items = invoke(workspace, "function.list", {"page": {"limit": 1000}}, ctx)["items"]
    by_address = {int(x["address"], 16): x for x in items}
    for name in ("spare", "leaf"):
        x = by_address[names[name]]
        assert x["sources"] == ["prologue"] and x["warnings"] == ["found by heuristics only: prologue"], x
    fatal = by_address[names["fatal"]]
    assert (
        "call" in fatal["sources"] and "warnings" not in fatal
    )  # (absent when there is nothing to say: no bytes for the common case)
    assert all(x["warnings"][0].startswith("found by heuristics only") for x in items if "warnings" in x)
    guessed = sum(1 for x in items if "warnings" in x)
    assert ctx.warnings == [f"{guessed} of these {len(items)} functions were found by heuristics only"]
    detail = invoke(workspace, "function.get", {"selector": {"address": hex(names["spare"])}})
    assert detail["warnings"] == ["found by heuristics only: prologue"]
    assert "warnings" not in invoke(workspace, "function.get", {"selector": {"address": hex(names["fatal"])}})


def test_the_query_envelope_carries_the_calls_warnings(builds, tmp_path):
    exe, names = builds
    req = {"method": "function.get", "params": {"selector": {"address": hex(names["leaf"])}}}
    run = run_cli("query", "-b", str(exe), json.dumps(req), home=tmp_path / "h")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["warnings"] == [f"function {hex(names['leaf'])}: found by heuristics only: prologue"]
    assert doc["result"]["warnings"] == ["found by heuristics only: prologue"]
    req = {"method": "function.get", "params": {"selector": {"address": hex(names["fatal"])}}}
    doc = json.loads(run_cli("query", "-b", str(exe), json.dumps(req), home=tmp_path / "h").stdout)
    assert "warnings" not in doc and "warnings" not in doc["result"]
