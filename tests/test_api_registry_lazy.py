"""The registry imports API domains as they are first needed, in a fresh interpreter each test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

_PROBE = """
import json, sys
from binlens.api import REGISTRY, invoke
from binlens.errors import BinlensError

def domains():
    names = (m for m in sys.modules if m.startswith("binlens.api.") and m != "binlens.api.registry")
    return sorted(m.rsplit(".", 1)[1] for m in names)

out = {"at_import": domains()}
out["function.list"] = "function.list" in REGISTRY
out["after_lookup"] = domains()
out["callgraph.get"] = REGISTRY.get("callgraph.get") is not None  # lives in function_call.py
out["after_other_module"] = "patch" in domains()
try:
    invoke(None, "nosuch.method", {})
except BinlensError as err:
    out["unknown"] = [err.code, err.target]
out["listed"] = len(list(REGISTRY.items()))
print(json.dumps(out))
"""


def _run(code: str, home: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BINLENS_HOME": home}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_domains_load_when_first_needed(tmp_path):
    out = _run(_PROBE, str(tmp_path))
    # no domain loads with the package
    assert not {"patch", "comment", "edits"} & set(out["at_import"])
    assert out["function.list"] is True and "function" in out["after_lookup"]
    assert not {"patch", "comment", "data_type", "memory"} & set(out["after_lookup"])
    assert out["callgraph.get"] is True and out["after_other_module"] is True  # not found by name: all loaded
    assert out["unknown"] == ["not_found", "/method"]
    assert out["listed"] >= 60


def test_a_program_opened_before_any_annotation_method_has_their_tables(tmp_path, compile_c):
    """A method whose domain is imported after the program's database was opened finds its tables:
    the annotation store brings a database opened before it registered its schema up to date."""
    path = compile_c("sample.c", "-O2", True)
    code = f"""
import json, sys
from binlens.api import invoke
from pathlib import Path
from binlens.workspace import Config, Workspace
ws = Workspace(Config(home=Path({str(tmp_path)!r})))
prog = ws.open({str(path)!r}, None, check_roots=False)
before = "binlens.api.comment" in sys.modules
params = {{"program": prog.handle, "selector": {{"name": "main"}}, "kind": "eol", "text": "hi"}}
made = invoke(ws, "comment.create", params)
print(json.dumps({{"before": before, "text": made["comment"]["text"]}}))
"""
    out = _run(code, str(tmp_path))
    assert out == {"before": False, "text": "hi"}
