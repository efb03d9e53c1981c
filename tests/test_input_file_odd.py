"""Special files and odd paths get a clear error with its code and target, never a traceback,
`internal`, or a hang: through the real CLI (`query -b`, `info`) and through program.open."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from pydantic import ValidationError
from tests.conftest import corpus_dir, run_cli

from binlens.api import invoke
from binlens.api.program import ProgramOpenParams, SectionSummary
from binlens.api.registry import _server_built
from binlens.errors import BinlensError
from binlens.workspace import Config, Workspace

LONG_NAME = "a" * 4000


@pytest.fixture()
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _query_error(path: str, home: Path) -> dict:
    proc = run_cli("query", "-b", path, '{"method":"program.list"}', home=home, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    err = json.loads(proc.stdout)["error"]
    assert err["target"] is None and err["details"]["binary"] == path
    return err


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("/dev/zero", "invalid_argument", "character device"),
        ("/proc/self/mem", "invalid_argument", "cannot read"),
        ("FIFO", "invalid_argument", "FIFO"),
        (LONG_NAME, "invalid_argument", "too long"),
        ("LOOP", "invalid_argument", "symbolic links"),
        ("TEXT", "unsupported", "not an ELF"),
        ("MISSING", "not_found", "no such file"),
    ],
)
def test_query_b_special_files(path: str, code: str, words: str, fifo: Path, tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "text").write_text("root:x:0:0:root:/root:/bin/sh\n")
    named = {"FIFO": fifo, "LOOP": tmp_path / "loop", "TEXT": tmp_path / "text", "MISSING": tmp_path / "nope"}
    err = _query_error(str(named.get(path, path)), tmp_path / "home")
    assert err["code"] == code and words in err["message"], err


def test_human_command_special_file(tmp_path: Path, fifo: Path) -> None:
    for path in ("/dev/zero", str(fifo)):
        proc = run_cli("info", path, home=tmp_path, timeout=60)
        assert proc.returncode == 1 and "not a regular file" in proc.stderr and "Traceback" not in proc.stderr


def _open_error(ws: Workspace, path: str) -> BinlensError:
    with pytest.raises(BinlensError) as err:
        invoke(ws, "program.open", {"path": path})
    return err.value


def test_program_open_special_files_and_odd_paths(home: Path, fifo: Path, tmp_path: Path) -> None:
    ws = Workspace(Config(home=home))
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "text").write_text("root:x:0:0:root:/root:/bin/sh\n")
    cases = {
        "/dev/zero": ("invalid_argument", "character device"),
        "/proc/self/mem": ("invalid_argument", "cannot read"),
        str(fifo): ("invalid_argument", "FIFO"),
        str(tmp_path): ("invalid_argument", "directory"),
        str(tmp_path / "a\0b"): ("invalid_argument", "NUL"),
        str(tmp_path / LONG_NAME): ("invalid_argument", "too long"),
        "/" + "d/" * 2047 + "f": ("invalid_argument", "too long"),  # 4096 characters: PATH_MAX
        str(tmp_path / "loop"): ("invalid_argument", "symbolic links"),
        str(tmp_path / "text"): ("unsupported", "not an ELF"),
        str(tmp_path / "nope"): ("not_found", "no such file"),
        "\ud800": ("invalid_argument", "valid string"),  # refused by the params model
    }
    for path, (code, words) in cases.items():
        err = _open_error(ws, path)
        assert (err.code, err.target) == (code, "/params/path"), (path[:40], err.message)
        assert words in err.message, err.message
        assert len(err.message) < 400


def _pe_with_sections(tmp_path: Path, count: int) -> Path:
    data = bytearray((corpus_dir("pe") / "a.exe").read_bytes())
    (lfanew,) = struct.unpack_from("<I", data, 0x3C)
    struct.pack_into("<H", data, lfanew + 6, count)  # COFF NumberOfSections
    path = tmp_path / f"sections{count}.exe"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("count", [200, 0xFFFF])
def test_pe_with_huge_number_of_sections(count: int, tmp_path: Path, home: Path) -> None:
    """Section headers read past the real ones carry names that are not UTF-8: they are text."""
    path = _pe_with_sections(tmp_path, count)
    proc = run_cli("query", "-b", str(path), '{"method":"program.get"}', home=home)
    assert proc.returncode == 0, proc.stdout
    sections = json.loads(proc.stdout)["result"]["sections"]
    assert all(isinstance(s["name"], str) for s in sections) and len(sections) > 5
    ws = Workspace(Config(home=home))
    got = invoke(ws, "program.open", {"path": str(path)})
    assert [s["name"] for s in got["sections"]] == [s["name"] for s in sections]


def test_result_model_failure_is_internal_not_a_client_field() -> None:
    """A result model the server fills is not the client's input: no /params target for it."""
    with pytest.raises(ValidationError) as built:
        SectionSummary(name=b"\xff", start="0x0", end="0x0", size=0, perms="r--", kind="data")
    assert _server_built(built.value)
    with pytest.raises(ValidationError) as sent:
        ProgramOpenParams.model_validate({"path": 5})
    assert not _server_built(sent.value)
