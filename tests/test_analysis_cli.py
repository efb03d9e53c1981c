"""The human analysis commands in a real child process."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import run_cli


@pytest.fixture()
def sample(compile_c):
    return compile_c("sample.c", "-O2", True)


def test_functions_json_and_table(home, sample):
    r = run_cli("functions", str(sample), "--json", home=home)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    names = {f["name"] for f in data["functions"]}
    assert {"main", "classify", "fib", "puts"} <= names
    assert data["program"]["format"] == "ELF"
    assert "analysed" in r.stderr  # the progress report goes to stderr, never stdout
    again = run_cli("functions", str(sample), "--name", "cl*", home=home)
    assert again.returncode == 0 and "classify" in again.stdout and "main" not in again.stdout


def test_disasm_strings_xrefs(home, sample):
    r = run_cli("disasm", str(sample), "main", home=home)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("main:") and "<classify>" in r.stdout and '"unique marker string for xrefs"' in r.stdout
    s = run_cli("strings", str(sample), "--text", "marker", "--json", home=home)
    item = json.loads(s.stdout)["strings"][0]
    assert item["references"] == 1
    x = run_cli("xrefs", str(sample), item["address"], "--json", home=home)
    refs = json.loads(x.stdout)["references"]
    assert [r["function_name"] for r in refs] == ["main"]
    bad = run_cli("disasm", str(sample), "no_such_function", home=home)
    assert bad.returncode == 1 and "no_such_function" in bad.stderr and not bad.stdout


def test_cfg_formats(home, sample, tmp_path):
    dot = run_cli("cfg", str(sample), "classify", "--format", "dot", home=home)
    assert dot.returncode == 0 and dot.stdout.startswith('digraph "classify"')
    mer = run_cli("cfg", str(sample), "classify", "--format", "mermaid", home=home)
    assert mer.stdout.startswith("flowchart TD") and "jump_table" in mer.stdout
    svg = run_cli("cfg", str(sample), "classify", "--format", "svg", "-o", str(tmp_path / "g.svg"), home=home)
    if shutil.which("dot"):
        assert svg.returncode == 0 and (tmp_path / "g.svg").read_text().lstrip().startswith("<?xml")
    else:
        assert svg.returncode == 1 and "graphviz" in svg.stderr
