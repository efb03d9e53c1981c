"""The pure-Python ELF reader gives the very Image LIEF gives; the worker imports LIEF only when needed."""

from __future__ import annotations

import struct
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest

from binlens.errors import BinlensError
from binlens.loader.image import decode_image, encode_image
from binlens.loader.isolate import ParserWorker
from binlens.loader.parse_elf import NeedsLief, parse_elf
from conftest import CORPUS

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def lief_image(data: bytes, name: str):  # noqa: ANN201 - an Image
    from binlens.loader.parse_lief import parse_image

    return parse_image(data, name)


def assert_same_image(path: Path) -> bool:
    """True when the fast reader took the file (and its Image equals LIEF's), False when it declined."""
    data = path.read_bytes()
    try:
        fast = parse_elf(data, path.name)
    except NeedsLief:
        return False
    slow = lief_image(data, path.name)
    for f in fields(fast):
        assert getattr(fast, f.name) == getattr(slow, f.name), f"{path}: {f.name} differs"
    return True


@pytest.mark.parametrize("strip", [False, True])
@pytest.mark.parametrize("pie", [True, False])
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_fast_reader_matches_lief_on_compiled_programs(compile_c, opt, pie, strip):
    for src in ("sample.c", "strings.c"):
        assert assert_same_image(compile_c(src, opt, pie=pie, strip=strip)), src


def test_fast_reader_matches_lief_on_relr_and_32_bit(compile_c):
    built = 0
    for extra in (("-Wl,-z,pack-relative-relocs",), ("-m32",)):
        try:
            path = compile_c("sample.c", "-O2", extra=extra)
        except subprocess.CalledProcessError:
            continue  # this toolchain cannot build it
        built += 1
        assert assert_same_image(path), extra
    if not built:
        pytest.skip("the C toolchain builds neither RELR nor 32-bit x86 programs")


def test_fast_reader_matches_lief_on_system_and_corpus_files():
    candidates = [LIBC, Path("/bin/true"), Path("/bin/ls")]
    if (CORPUS / "elf").is_dir():
        candidates += sorted(p for p in (CORPUS / "elf").rglob("*") if p.is_file())
    taken = 0
    for path in candidates:
        if path.is_file() and path.read_bytes()[:4] == b"\x7fELF":
            taken += assert_same_image(path)
    assert taken >= 3


def _patched(path: Path, tmp: Path, offset: int, value: bytes) -> Path:
    data = bytearray(path.read_bytes())
    data[offset : offset + len(value)] = value
    out = tmp / f"{path.name}-{offset}"
    out.write_bytes(bytes(data))
    return out


def test_fast_reader_declines_what_it_does_not_know(compile_c, tmp_path):
    good = compile_c("sample.c", "-O2")
    data = good.read_bytes()
    with pytest.raises(NeedsLief):
        parse_elf(_patched(good, tmp_path, 18, b"\xb7\x00").read_bytes(), "aarch64")  # e_machine
    with pytest.raises(NeedsLief):
        parse_elf(_patched(good, tmp_path, 16, b"\x01\x00").read_bytes(), "rel")  # e_type ET_REL
    with pytest.raises(NeedsLief):
        parse_elf(data[: len(data) // 2], "truncated")  # section table past the end
    with pytest.raises(NeedsLief):
        parse_elf(_patched(good, tmp_path, 0x28, b"\xff" * 8).read_bytes(), "shoff")
    # A second symbol table (the string table's header retyped SHT_SYMTAB): not a plain file.
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    types = [struct.unpack_from("<I", data, shoff + i * shentsize + 4)[0] for i in range(shnum)]
    assert types.count(2) == 1  # the unstripped build has one .symtab
    strtab = types.index(3)
    with pytest.raises(NeedsLief):
        parse_elf(_patched(good, tmp_path, shoff + strtab * shentsize + 4, b"\x02\x00\x00\x00").read_bytes(), "2")


def test_worker_imports_lief_only_for_files_that_need_it(compile_c, tmp_path):
    worker = ParserWorker()
    try:
        elf = compile_c("sample.c", "-O2").read_bytes()
        img = worker.parse(elf, "sample", None, 8.0)
        assert img.identity.format == "ELF" and img.data is elf and img.symbols
        pid = worker._proc.pid  # noqa: SLF001 - the test inspects the worker process
        assert "_lief" not in Path(f"/proc/{pid}/maps").read_text()
        # An ELF file the fast reader declines still opens, through LIEF, in the same worker.
        odd = bytearray(elf)
        odd[0x28:0x30] = (len(elf) + 4096).to_bytes(8, "little")  # section table past the end
        try:
            worker.parse(bytes(odd), "odd", None, 8.0)
        except BinlensError as err:
            assert err.code == "invalid_argument"
        assert worker._proc.pid == pid and "_lief" in Path(f"/proc/{pid}/maps").read_text()  # noqa: SLF001
    finally:
        worker.close()


def test_encoded_image_round_trips(compile_c):
    data = compile_c("sample.c", "-O0").read_bytes()
    img = parse_elf(data, "sample")
    back = decode_image(encode_image(img), data)
    assert back == img and back.region_at(img.identity.entry) == img.region_at(img.identity.entry)
