"""The input cap (`--max-file-bytes`, default 512 MiB): checked with fstat before a byte is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import ROOT, run_cli

from binlens.api import invoke
from binlens.errors import BinlensError
from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES, read_input
from binlens.workspace import Config, Limits, Workspace

FOUR_GIB = 4 << 30


@pytest.fixture()
def sparse_elf(tmp_path: Path, compile_c) -> Path:
    """A 4 GiB sparse file that starts with a real ELF header (so the early analysis start would take it)."""
    path = tmp_path / "huge.elf"
    head = compile_c("sample.c").read_bytes()[:4096]
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(FOUR_GIB)
    return path


def _peak_rss_kib(args: list[str], home: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run `python -m binlens ARGS` from a fresh wrapper process that reports its children's peak RSS."""
    wrapper = (
        "import json, resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(json.dumps([p.returncode, p.stdout, p.stderr, rss]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), BINLENS_HOME=str(home))
    out = subprocess.run(
        [sys.executable, "-c", wrapper, sys.executable, "-m", "binlens", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    code, stdout, stderr, rss = json.loads(out.stdout)
    return subprocess.CompletedProcess(args, code, stdout, stderr), rss


def test_default_cap_is_512_mib() -> None:
    assert DEFAULT_MAX_FILE_BYTES == 512 * 1024 * 1024
    assert Limits().max_file_bytes == DEFAULT_MAX_FILE_BYTES


def test_sparse_4gib_refused_by_query_with_small_rss(sparse_elf: Path, tmp_path: Path) -> None:
    proc, rss_kib = _peak_rss_kib(["query", "-b", str(sparse_elf), '{"method":"program.list"}'], tmp_path / "h")
    assert proc.returncode == 1, proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "invalid_argument"
    assert err["details"] == {"size": FOUR_GIB, "limit": DEFAULT_MAX_FILE_BYTES, "binary": str(sparse_elf)}
    assert "Traceback" not in proc.stderr
    assert rss_kib < 300 * 1024, f"peak RSS {rss_kib} KiB"


def test_sparse_4gib_refused_by_functions_with_small_rss(sparse_elf: Path, tmp_path: Path) -> None:
    proc, rss_kib = _peak_rss_kib(["functions", str(sparse_elf)], tmp_path / "h")
    assert proc.returncode == 1
    assert "over the 536870912-byte input limit" in proc.stderr and "Traceback" not in proc.stderr
    assert rss_kib < 300 * 1024, f"peak RSS {rss_kib} KiB"


def test_sparse_4gib_refused_by_mcp_and_serve(sparse_elf: Path, tmp_path: Path) -> None:
    mcp = run_cli("mcp", str(sparse_elf), home=tmp_path / "h", stdin="")
    assert mcp.returncode == 1 and "over the 536870912-byte input limit" in mcp.stderr, mcp.stderr
    serve = run_cli("serve", "--port", "0", str(sparse_elf), home=tmp_path / "h")
    assert serve.returncode == 1 and "over the 536870912-byte input limit" in serve.stderr, serve.stderr


def test_max_file_bytes_option(compile_c, tmp_path: Path) -> None:
    sample = compile_c("sample.c")
    size = sample.stat().st_size
    small = run_cli("query", "--max-file-bytes", "1K", "-b", str(sample), '{"method":"program.list"}', home=tmp_path)
    assert small.returncode == 1
    err = json.loads(small.stdout)["error"]
    assert (err["code"], err["details"]["size"], err["details"]["limit"]) == ("invalid_argument", size, 1024)
    request = '{"method":"program.list"}'
    fits = run_cli("query", "--max-file-bytes", str(size), "-b", str(sample), request, home=tmp_path)
    assert fits.returncode == 0, fits.stdout
    bad = run_cli("info", "--max-file-bytes", "lots", str(sample), home=tmp_path)
    assert bad.returncode == 2 and "is not a size" in bad.stderr
    for command in ("mcp", "serve", "functions", "disasm", "info", "symbols"):
        assert "--max-file-bytes" in run_cli(command, "--help").stdout, command


def test_program_open_cap_and_read_input(compile_c, home: Path) -> None:
    sample = compile_c("sample.c")
    size = sample.stat().st_size
    ws = Workspace(Config(home=home, limits=Limits(max_file_bytes=size - 1)))
    with pytest.raises(BinlensError) as err:
        invoke(ws, "program.open", {"path": str(sample)})
    assert (err.value.code, err.value.target) == ("invalid_argument", "/params/path")
    assert err.value.details == {"size": size, "limit": size - 1}
    assert read_input(sample, max_bytes=size).data == sample.read_bytes()
