"""Identity fields hold addresses, never a parser's sentinel: an ELF file without a loadable
segment has no image base (null), in the loader, `program.get` and the query envelope."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from binlens.errors import BinlensError
from binlens.loader.isolate import load_image
from conftest import corpus_dir, run_cli

PT_LOAD, PT_NULL = 1, 0
SENTINELS = {0xFFFFFFFFFFFFFFFF, 0xFFFFFFFF}


def without_load_segments(src: Path, out: Path) -> Path:
    """A copy of a 64-bit little-endian ELF file whose PT_LOAD entries are PT_NULL."""
    data = bytearray(src.read_bytes())
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 0x20)[0], *struct.unpack_from("<HH", data, 0x36)
    loads = 0
    for i in range(phnum):
        at = phoff + i * phentsize
        if struct.unpack_from("<I", data, at)[0] == PT_LOAD:
            struct.pack_into("<I", data, at, PT_NULL)
            loads += 1
    assert loads, "the fixture had no PT_LOAD to rewrite"
    out.write_bytes(bytes(data))
    return out


@pytest.fixture()
def no_loads(compile_c, tmp_path: Path) -> Path:
    return without_load_segments(compile_c("sample.c", "-O2", pie=False), tmp_path / "no-loads")


def test_elf_without_load_segments_has_a_null_image_base(workspace, no_loads):
    """Through the isolated loader (its fast reader or LIEF) and LIEF in-process alike."""
    from binlens.loader.parse_lief import parse_path

    assert load_image(str(no_loads)).identity.image_base is None
    assert parse_path(str(no_loads)).identity.image_base is None
    ident = workspace.open(no_loads, check_roots=False).identity
    assert ident["image_base"] is None
    assert int(ident["entry"], 16) not in SENTINELS


def test_relocatable_object_has_a_null_image_base(compile_c):
    """`cc -c` output: no program headers at all (read by LIEF)."""
    obj = compile_c("sample.c", "-O2", pie=False, extra=("-c",))
    img = load_image(str(obj))
    assert img.identity.image_base is None and img.identity.entry == 0
    assert any(s.name == ".text" and s.size for s in img.sections)


def test_query_envelope_and_program_get_carry_null(no_loads, home):
    """The one-shot CLI: the envelope's `program` and `program.get`'s identity."""
    request = json.dumps({"method": "program.get", "params": {}})
    proc = run_cli("query", "-b", str(no_loads), request, home=home)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["program"]["image_base"] is None
    assert doc["result"]["identity"]["image_base"] is None


def test_loaded_elf_keeps_its_image_base(workspace, compile_c):
    """A file with PT_LOAD segments reports the lowest one, as before."""
    ident = workspace.open(compile_c("sample.c", "-O2", pie=False), check_roots=False).identity
    assert ident["image_base"] == "0x400000"


@pytest.mark.parametrize("sub", ["fuzzed", "elf"])
def test_no_corpus_file_reports_a_sentinel(sub):
    """No file of the corpus that opens reports an all-ones image base or entry point (LIEF's
    image base of an ELF file without PT_LOAD is 2**64 - 1)."""
    opened, null_base = 0, 0
    for path in sorted(p for p in corpus_dir(sub).rglob("*") if p.is_file()):
        try:
            ident = load_image(str(path)).identity
        except BinlensError:
            continue
        opened += 1
        null_base += ident.image_base is None
        assert ident.image_base not in SENTINELS and ident.entry not in SENTINELS, path
    assert opened >= 50 and null_base, (opened, null_base)
