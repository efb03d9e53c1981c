"""Analysis output is bounded per input byte (SPEC §2, budgets).

Names are cut at load (`loader.image.NAME_CAP`) and a program's database may not grow past
100x its file (at least 64 MiB): the crafted 1.1 MB ELF whose 1,500 symbols share one 1 MiB
name made a 1.5 GB database and used 1.58 GB of RSS.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from crafted_elf import shared_name_elf
from mcp_support import ROOT, env_for

# Runs in a child process (under an address-space cap, so a regression fails instead of
# swapping the machine): open the file, list, analyse, and report sizes and peaks as JSON.
SCRIPT = r"""
import json, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))
from binlens.api.registry import invoke
from binlens.errors import BinlensError
from binlens.workspace import Config, Workspace

home, path = Path(sys.argv[1]), sys.argv[2]
ws = Workspace(Config(home=home))
prog = ws.open(path, check_roots=False)
out = {"warnings": invoke(ws, "program.get", {})["warnings"], "database": str(prog.db.path)}
out["symbol"] = invoke(ws, "symbol.list", {"page": {"limit": 1}})["items"][0]
try:
    out["functions"] = invoke(ws, "function.list", {"page": {"limit": 5}})["items"]
except BinlensError as err:
    out["error"] = [err.code, err.message]
out["symbols_after"] = len(invoke(ws, "symbol.list", {"page": {"limit": 3}})["items"])
prog.db.close()
# this process's own peak since exec: VmHWM (ru_maxrss counts the peak of the test process that
# forked it too, hundreds of MB late in a full run)
out["peak_kb"] = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
out["child_peak_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps(out))
"""


def _run(home: Path, path: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(home), str(path)],
        capture_output=True,
        env=env_for(home),
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return json.loads(proc.stdout.decode().splitlines()[-1])


def _stored_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def test_shared_huge_name_is_cut_and_the_database_stays_small(tmp_path: Path) -> None:
    from binlens.loader.image import NAME_CAP

    crafted = shared_name_elf(tmp_path / "shared-name", symbols=1500, name_bytes=1 << 20)
    size = crafted.stat().st_size
    assert 1_000_000 < size < 1_200_000
    out = _run(tmp_path / "home", crafted)
    assert "error" not in out, out["error"]
    assert any(f"longer than {NAME_CAP}" in w for w in out["warnings"]), out["warnings"]
    name = out["symbol"]["name"]
    assert name.startswith("A" * NAME_CAP) and name.endswith(f"...[{(1 << 20) - NAME_CAP} more characters cut]")
    assert len(out["functions"]) == 5 and all(len(f["name"]) < NAME_CAP + 64 for f in out["functions"])
    stored = _stored_bytes(Path(out["database"]))
    assert stored < 64 << 20, f"database {stored} bytes for a {size}-byte file"  # was 1.5 GB
    assert out["peak_kb"] < 400 * 1024 and out["child_peak_kb"] < 400 * 1024, out  # were 1.58 GB


def test_database_cap_stops_the_analysis_cleanly(tmp_path: Path) -> None:
    from binlens.loader.image import NAME_CAP
    from binlens.store.database import DB_MIN_BYTES

    # Names just under the cap: 20,000 functions x 4 KiB of names is ~80 MB from a 0.5 MB file.
    crafted = shared_name_elf(tmp_path / "many-names", symbols=20_000, name_bytes=NAME_CAP)
    assert 100 * crafted.stat().st_size < DB_MIN_BYTES  # the floor applies
    out = _run(tmp_path / "home", crafted)
    code, message = out["error"]
    assert code != "internal" and "database would grow past 67108864 bytes" in message, out["error"]
    assert out["symbols_after"] == 3  # the program still answers
    db = Path(out["database"])
    assert _stored_bytes(db) < DB_MIN_BYTES + (8 << 20)
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM analysis_run").fetchone() == (0,)  # nothing half-saved
    finally:
        conn.close()
    assert os.path.getsize(db) < DB_MIN_BYTES
