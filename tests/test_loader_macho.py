"""Mach-O loading checked against LIEF's own parse: every slice of every universal file of the
corpus (sections, symbols, section bytes), and imports from `LC_DYLD_INFO` bind opcodes."""

from __future__ import annotations

import struct
from pathlib import Path

import lief
import pytest

from binlens.loader.image import Image
from binlens.loader.isolate import load_image
from conftest import corpus_dir

lief.logging.disable()
pytestmark = pytest.mark.filterwarnings("ignore:.* is not a valid:RuntimeWarning")  # LIEF: vendor enum values
FAT_MAGICS = (b"\xca\xfe\xba\xbe", b"\xca\xfe\xba\xbf")
# Mach-O cputype -> binlens arch
CPU_ARCH = {0x01000007: "x86-64", 7: "x86", 0x0100000C: "aarch64", 12: "arm", 18: "ppc", 0x01000012: "ppc"}
ZEROFILL = {1, 0xC, 0x12}  # S_ZEROFILL, S_GB_ZEROFILL, S_THREAD_LOCAL_ZEROFILL


def fat_files() -> list[Path]:
    """Every universal Mach-O of the corpus, found by its magic (a slice count under 45 tells
    it from a Java class file, which shares the magic)."""
    out = []
    for path in sorted(corpus_dir().rglob("*")):
        if not path.is_file():
            continue
        with path.open("rb") as fh:
            head = fh.read(8)
        if len(head) == 8 and head[:4] in FAT_MAGICS and 0 < struct.unpack(">I", head[4:])[0] < 45:
            out.append(path)
    return out


def lief_sections(b: lief.MachO.Binary) -> list[tuple[str, int, int]]:
    return [(f"{s.segment_name},{s.name}", s.virtual_address, s.size) for s in b.sections]


def lief_defined_symbols(b: lief.MachO.Binary) -> set[tuple[str, int]]:
    """Names defined in a section (N_SECT, not a stab) at a non-zero address."""
    out = set()
    for s in b.symbols:
        name = s.name if isinstance(s.name, str) else s.name.decode("utf-8", "backslashreplace")
        if name and s.value and not s.raw_type & 0xE0 and s.raw_type & 0x0E == 0x0E:
            out.add((name, s.value))
    return out


def check_slice(img: Image, b: lief.MachO.Binary, where: str) -> int:
    """Compare one opened slice with LIEF's parse of it; the number of section bytes compared."""
    assert img.identity.arch == CPU_ARCH.get(int(b.header.cpu_type), img.identity.arch), where
    mine = [(s.name, s.va, s.size) for s in img.sections]
    assert mine == lief_sections(b), where
    assert {(s.raw_name, s.address) for s in img.symbols} == lief_defined_symbols(b), where
    compared = 0
    for s in b.sections:
        content = bytes(s.content)
        if int(s.type) in ZEROFILL or not content:
            continue
        assert img.read(s.virtual_address, len(content)) == content, f"{where} {s.segment_name},{s.name}"
        compared += len(content)
    return compared


def test_every_slice_of_every_fat_file_matches_lief():
    """Each slice opens by its own name through the isolated loader, and reads the same sections,
    symbols and section bytes as LIEF's parse of that slice."""
    files = fat_files()
    assert files, "the corpus has no universal Mach-O file"
    checked, total_bytes = [], 0
    for path in files:
        fat = lief.MachO.parse(str(path))
        if fat is None or fat.size == 0:
            continue  # nothing to compare with (the loader's clean error is test_loader's subject)
        slices = load_image(str(path)).slices
        assert len(slices) == fat.size and len(set(slices)) == len(slices), (path, slices)
        for i, name in enumerate(slices):
            img = load_image(str(path), name)
            assert img.identity.slice == (name if fat.size > 1 else None)
            total_bytes += check_slice(img, fat.at(i), f"{path.name}[{name}]")
            checked.append((path.name, name))
    assert len(checked) >= 30, checked
    assert total_bytes > 1_000_000


def test_fat_intel_main_reads_its_code():
    """`main` of both slices of fat-intel starts with a frame set-up, not zero bytes."""
    path = corpus_dir("mach0") / "fat-intel"
    if not path.exists():
        pytest.skip("fat-intel is not in the corpus")
    prologues = {"x86": b"\x55\x89\xe5", "x86-64": b"\x55\x48\x89\xe5"}
    for arch, prologue in prologues.items():
        img = load_image(str(path), arch)
        main = next(s for s in img.symbols if s.name == "main")
        assert img.read(main.address, len(prologue)) == prologue, arch
