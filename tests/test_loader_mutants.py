"""Corpus files with one header field corrupted as the mutation fuzzer (bench/fuzz.py) does: the
loader reads them or refuses them with a clear error, never a wrong or internal one."""

from __future__ import annotations

import struct
from pathlib import Path

from binlens.api import invoke
from conftest import corpus_dir


def _pe_section_table(data: bytes) -> int:
    lfanew = struct.unpack_from("<I", data, 0x3C)[0]
    return lfanew + 24 + struct.unpack_from("<H", data, lfanew + 20)[0]


def test_pe_section_name_that_is_not_utf8_is_read_as_escaped_text(workspace, tmp_path: Path) -> None:
    # fuzz seed 2 mutants 115, 127, 563, ...: `program.open` answered invalid_argument at /params/name
    data = bytearray((corpus_dir("pe") / "hello_world" / "hello_world_mdd32bit.exe").read_bytes())
    table = _pe_section_table(data)
    assert data[table : table + 8] == b".text\0\0\0"
    data[table + 1] = 0xAF
    path = tmp_path / "pe-name"
    path.write_bytes(data)
    opened = invoke(workspace, "program.open", {"path": str(path)})
    names = [s["name"] for s in opened["sections"]]
    assert ".\\xafext" in names and ".rdata" in names
    got = invoke(workspace, "program.get", {})
    assert got["sections"] == opened["sections"]


def test_macho_segment_name_that_is_not_utf8_is_read_as_escaped_text(workspace, tmp_path: Path) -> None:
    data = bytearray((corpus_dir("mach0") / "hello-osx-x86_64").read_bytes())
    at = data.index(b"__TEXT\0\0\0\0\0\0\0\0\0\0")  # LC_SEGMENT_64's segname
    data[at + 2] = 0xFF
    path = tmp_path / "macho-name"
    path.write_bytes(data)
    opened = invoke(workspace, "program.open", {"path": str(path)})
    prog = workspace.program(None)
    assert all(isinstance(s.name, str) for s in prog.image.segments)
    assert "__\\xffEXT" in [s.name for s in prog.image.segments]
    assert any(s["name"].startswith("__\\xffEXT,") for s in opened["sections"])
    status = invoke(workspace, "analysis.start", {"wait": True, "timeout_ms": 120000})
    assert status["status"] == "done", status
