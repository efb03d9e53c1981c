"""Smoke tests of the foundation: open, identity, query envelope."""

from __future__ import annotations

import hashlib
import json

from conftest import run_cli


def test_identity_matches_sha256(workspace, compile_c):
    path = compile_c("sample.c", "-O2")
    prog = workspace.open(path, check_roots=False)
    assert prog.identity["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert prog.identity["format"] == "ELF"
    assert prog.identity["arch"] == "x86-64"


def test_query_envelope_and_limit_error(home, compile_c):
    path = compile_c("sample.c", "-O0")
    proc = run_cli("query", "-b", str(path), '{"method":"symbol.list","params":{"page":{"limit":5000}}}', home=home)
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["schema_version"] == 1
    assert out["error"]["target"] == "/params/page/limit"
    assert out["program"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
