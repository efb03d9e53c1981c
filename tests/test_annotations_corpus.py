"""Annotations on third-party binaries (PE, Mach-O, 32-bit ELF): the ABI chosen, patch and export."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError
from conftest import corpus_dir

CASES = [
    ("pe/rarg_detection.dll", "LLP64", 4, 8, 2),  # x86-64 PE: long 4, pointer 8, wchar_t 2
    ("pe/ConsoleApplication1.exe", "Win32", 4, 4, 2),
    ("mach0/BatteryLife", "ILP32 ARM", 4, 4, 4),
    ("elf/754392adc-radare2-issue", "i386", 4, 4, 4),
]


@pytest.mark.parametrize("rel,label,long_size,ptr_size,wchar", CASES, ids=[c[1] for c in CASES])
def test_abi_patch_and_export(workspace, tmp_path: Path, rel, label, long_size, ptr_size, wchar):
    path = corpus_dir() / rel
    if not path.is_file():
        pytest.skip(f"{rel} is not in the corpus")
    prog = workspace.open(path, check_roots=False)
    h = prog.handle

    def call(method: str, **params):
        return invoke(workspace, method, {"program": h, **params})

    assert call("data_type.get", name="long")["size"] == long_size
    assert call("data_type.get", name="uintptr_t")["size"] == ptr_size
    assert call("data_type.get", name="wchar_t")["size"] == wchar
    entry = prog.image.identity.entry
    original = call("memory.read", address=hex(entry), length=4)["data"]
    flipped = bytes(b ^ 0xFF for b in bytes.fromhex(original)).hex()
    try:
        call("memory.write", address=hex(entry), data=flipped)
    except BinlensError as err:  # an entry point without file bytes cannot be patched
        assert err.code == "invalid_argument"
        pytest.skip(f"{rel}: entry has no file bytes")
    read = call("memory.read", address=hex(entry), length=4)
    assert read["data"] == flipped and read["patched"] is True
    out = tmp_path / "patched"
    res = call("program.export", path=str(out))
    data, before = out.read_bytes(), path.read_bytes()
    assert res["sha256"] == hashlib.sha256(data).hexdigest() and len(data) == len(before)
    off = prog.image.va_to_offset(entry)
    assert data[off : off + 4].hex() == flipped
    assert data[:off] == before[:off] and data[off + 4 :] == before[off + 4 :]
    call("journal.undo")
    assert call("memory.read", address=hex(entry), length=4) == {**read, "data": original, "patched": False}
