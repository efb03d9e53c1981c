"""The components listed in `binlens.components` apply whatever was imported first: each probe runs
in a fresh interpreter that imports only the layer it exercises."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from binlens import components
from conftest import ROOT


def _run(code: str, home: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BINLENS_HOME": home}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_program_opened_without_the_api_gets_every_open_hook(tmp_path, compile_c):
    """`Workspace.open` alone attaches the analysis state and the annotations (user names, patch
    overlay): the open hooks do not wait for `binlens.api` to be imported."""
    path = compile_c("sample.c", "-O2", True)
    code = f"""
import json, sys
from pathlib import Path
from binlens.workspace import Config, Workspace
ws = Workspace(Config(home=Path({str(tmp_path)!r})))
prog = ws.open({str(path)!r}, None, check_roots=False)
ext = sorted(k for k in prog.extensions if k in ("analysis", "annotations", "memory.overlay"))
print(json.dumps({{"extensions": ext, "schema": prog.db.schema_versions()}}))
"""
    out = _run(code, str(tmp_path))
    assert out["extensions"] == ["analysis", "annotations", "memory.overlay"]
    assert set(out["schema"]) == {"core", "annotations", "analysis", "fingerprints", "decompilation"}


def test_a_database_opened_by_the_store_alone_has_every_schema_component(tmp_path):
    """`ProgramDatabase` migrates every component of `components.MIGRATIONS`, in its order, though
    only `binlens.store.database` was imported."""
    code = f"""
import json, sqlite3
from pathlib import Path
from binlens.store.database import ProgramDatabase
db = ProgramDatabase(Path({str(tmp_path)!r}) / "p.sqlite")
versions = db.schema_versions()
tables = [r[0] for r in db.connect().execute("SELECT name FROM sqlite_master WHERE type='table'")]
print(json.dumps({{"schema": versions, "tables": tables}}))
"""
    out = _run(code, str(tmp_path))
    listed = {name: len(components.load(ref)) for name, ref in components.MIGRATIONS}
    assert out["schema"] == listed
    assert "func" in out["tables"] and "ann_journal" in out["tables"]


def test_the_domain_list_names_every_module_that_registers_methods(tmp_path):
    """`components.DOMAINS` is the set of `binlens.api` modules that register methods: a new domain
    file left out of it fails here."""
    code = """
import importlib, json, pkgutil
import binlens.api as package
from binlens.api.registry import REGISTRY
for info in pkgutil.iter_modules(package.__path__):
    if not info.name.startswith("_"):
        importlib.import_module(f"binlens.api.{info.name}")
mods = sorted({spec.func.__module__.rsplit(".", 1)[1] for spec in dict.values(REGISTRY)})
print(json.dumps(mods))
"""
    assert _run(code, str(tmp_path)) == sorted(components.DOMAINS)
    for ref in components.OPEN_HOOKS:
        assert callable(components.load(ref))
