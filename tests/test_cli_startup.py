"""The CLI's fixed costs: what a command imports, the worker it prestarts, its JSON listing output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT, run_cli

# Runs one human command in-process and reports which heavy modules it imported and whether the
# parser worker was started before the API was imported.
PROBE = r"""
import json, sys, io
import binlens.loader.isolate as iso
seen = {}
real_start = iso.ParserWorker._start
def spy(self):
    seen.setdefault("api_loaded_at_worker_start", "binlens.api" in sys.modules)
    return real_start(self)
iso.ParserWorker._start = spy
from binlens.cli.main import main
out, sys.stdout = sys.stdout, io.StringIO()
code = main(sys.argv[1:])
text, sys.stdout = sys.stdout.getvalue(), out
mods = ("asyncio", "rich", "lief", "uvicorn", "starlette")
print(json.dumps({"code": code, "text": text, "loaded": [m for m in mods if m in sys.modules], **seen}))
"""


def probe(*args: str, home) -> dict:  # noqa: ANN001
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), BINLENS_HOME=str(home))
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    return json.loads(proc.stdout.splitlines()[-1])


def test_functions_json_imports_no_server_table_or_lief_code(home, compile_c):
    sample = compile_c("sample.c", "-O2")
    got = probe("functions", str(sample), "--json", home=home)
    assert got["code"] == 0
    assert got["loaded"] == []  # no asyncio/uvicorn (servers), no rich (tables), no LIEF (plain ELF)
    assert got["api_loaded_at_worker_start"] is False  # the worker starts first, then the API imports


def test_json_listing_is_one_item_per_line_and_equals_the_api(home, compile_c):
    sample = compile_c("sample.c", "-O2")
    r = run_cli("functions", str(sample), "--json", home=home)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    data = json.loads(r.stdout)
    assert len(lines) == len(data["functions"]) + 2  # header line, one line per function, closing line
    assert json.loads(lines[1].rstrip(",")) == data["functions"][0]
    q = run_cli("query", "-b", str(sample), '{"method":"function.list","params":{"page":{"limit":1000}}}', home=home)
    assert json.loads(q.stdout)["result"]["items"] == data["functions"]
    empty = run_cli("functions", str(sample), "--json", "--name", "no_such_*", home=home)
    assert json.loads(empty.stdout)["functions"] == []


def test_table_output_renders_without_rich(home, compile_c):
    sample = compile_c("sample.c", "-O2")
    got = probe("functions", str(sample), home=home)
    assert got["code"] == 0 and got["loaded"] == []  # the tables are drawn without rich
    lines = got["text"].splitlines()
    assert lines[0].split("┃")[0].strip() == "address" and set(lines[1]) <= {"━", "╇"}
    rows = [[c.strip() for c in line.split("│")] for line in lines[2:]]
    assert "main" in [r[2] for r in rows] and all(len(r) == 4 and r[0].startswith("0x") for r in rows)
    # every column but the last padded to one width: the last column starts at one place
    assert len({line.rindex("│") for line in lines[2:]}) == 1
    assert all(line == line.rstrip() for line in lines)  # no padding after the last column


def test_tables_are_never_cut_to_the_terminal_width():
    from binlens.cli.render import table_lines

    long = "/a/" + "x" * 300 + ".sqlite"
    lines = table_lines(["field", "value"], [["database", long], ["size", "12"]], title="identity")
    assert lines[0].strip() == "identity"
    assert [c.strip() for c in lines[3].split("│")] == ["database", long]
    assert lines[4] == " size     │ 12"  # piped, a long cell widens only its own line
    assert len(lines[2]) <= len(" database ") + 3 + 40 + 1


def test_analysis_target_is_read_before_the_parser_is_built(tmp_path):
    from binlens.cli.main import _early_target

    f = tmp_path / "prog"
    f.write_bytes(b"\x7fELF")
    assert _early_target(["functions", str(f), "--json"]) == (str(f), None, None)
    assert _early_target(["-v", "disasm", "--max", "10", str(f), "main"]) == (str(f), None, None)
    assert _early_target(["xrefs", f"--home={tmp_path}", str(f), "0x10"]) == (str(f), None, str(tmp_path))
    assert _early_target(["cfg", "--slice", "arm64", str(f), "main", "--home", "h"]) == (str(f), "arm64", "h")
    assert _early_target(["functions", str(tmp_path / "missing")]) is None  # the parser gives that error
    assert _early_target(["info", str(f)]) is None  # needs no analysis
    assert _early_target([]) is None


def test_console_exit_closes_the_database_and_survives_a_closed_pipe(home, compile_c):
    sample = compile_c("sample.c", "-O2")
    r = run_cli("functions", str(sample), "--json", home=home)
    assert r.returncode == 0 and json.loads(r.stdout)["functions"], r.stderr
    # the analysis process checkpoints after it reported "done"; the command waits for it to end
    dbs = list((home / "db").iterdir())
    assert [p.suffix for p in dbs] == [".sqlite"]  # all closed: no -wal/-shm file left behind
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), BINLENS_HOME=str(home))
    for args in ("--json", ""):  # the reader is gone before the listing is written
        cmd = f"{sys.executable} -m binlens functions {sample} {args} | true; echo $" + "{PIPESTATUS[0]}"
        piped = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)
        assert piped.stdout == "1\n" and "Traceback" not in piped.stderr and "Error" not in piped.stderr


SPAWN_PROBE = r"""
import json, sys, io
import binlens.jobs.spawn as sp
seen = {}
real = sp.spawn_analysis_process
def spy():
    heavy = ("argparse", "logging", "binlens.api", "binlens.jobs.client")
    seen["heavy_at_spawn"] = [m for m in heavy if m in sys.modules]
    return real()
sp.spawn_analysis_process = spy
from binlens.cli.main import main
out, sys.stdout = sys.stdout, io.StringIO()
code = main(sys.argv[1:])
sys.stdout = out
print(json.dumps({"code": code, **seen}))
"""


def test_the_analysis_process_starts_before_the_cli_imports_its_parser(home, compile_c):
    sample = compile_c("sample.c", "-O2")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), BINLENS_HOME=str(home))
    proc = subprocess.run(
        [sys.executable, "-c", SPAWN_PROBE, "functions", str(sample), "--json"],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got == {"code": 0, "heavy_at_spawn": []}
