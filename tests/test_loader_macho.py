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


# --- imports from LC_DYLD_INFO(_ONLY) bind opcodes, and the stubs named after them -------------
DYLD_INFO_FILES = ["hello-osx-x86_64", "TestSocket", "hellocxx-osx-i386", "WheresMyBrowser"]
SPECIAL_DYLIBS = {"this-image", "main-executable", "flat-namespace", "weak"}


def llvm_objdump(*args: str) -> str:
    import shutil
    import subprocess

    if shutil.which("llvm-objdump") is None:
        pytest.skip("llvm-objdump is not installed")
    return subprocess.run(["llvm-objdump", "--macho", *args], capture_output=True, text=True, check=True).stdout


def llvm_binds(path: Path) -> list[tuple[int, str, str | None]]:
    """(slot, symbol, dylib short name or None) of every row of the bind, lazy-bind and weak-bind
    tables as llvm-objdump prints them."""
    rows = []
    for table in ("--bind", "--lazy-bind", "--weak-bind"):
        for line in llvm_objdump(table, str(path)).splitlines():
            cols = line.split()
            if len(cols) < 4 or not cols[2].startswith("0x"):
                continue  # titles, column heads, weak-bind `strong` lines
            dylib = {"--bind": cols[5] if len(cols) > 6 else None, "--lazy-bind": cols[3]}.get(table)
            rows.append((int(cols[2], 16), cols[-1], dylib))
    return rows


def dyld_info_image(name: str) -> tuple[Path, Image]:
    path = corpus_dir("mach0") / name
    if not path.exists():
        pytest.skip(f"{name} is not in the corpus")
    return path, load_image(str(path))


@pytest.mark.parametrize("name", DYLD_INFO_FILES)
def test_dyld_info_imports_match_llvm_objdump(name):
    """Every row of the bind tables is one import, with its symbol and its library."""
    from collections import Counter

    path, img = dyld_info_image(name)
    want = llvm_binds(path)
    assert want, f"llvm-objdump printed no binds for {name}"
    assert Counter((i.slot, i.raw_name) for i in img.imports) == Counter((slot, sym) for slot, sym, _d in want)
    libraries: dict[tuple[int, str], list[str]] = {}
    for i in img.imports:  # (a slot may be bound twice: lazily from a dylib, and weakly)
        libraries.setdefault((i.slot, i.raw_name), []).append(Path(i.library or "").name)
    for slot, sym, dylib in want:
        if dylib is None or dylib in SPECIAL_DYLIBS:
            continue  # weak binds name no library; special ordinals none binlens reports
        assert any(lib.startswith(dylib) for lib in libraries[(slot, sym)]), (sym, libraries[(slot, sym)], dylib)


@pytest.mark.parametrize("name", DYLD_INFO_FILES)
def test_dyld_info_imports_match_lief_bindings(name):
    """The same imports as LIEF's full parse lists (its bind, lazy-bind and weak-bind opcodes)."""
    path, img = dyld_info_image(name)
    b = lief.MachO.parse(str(path)).at(0)
    assert b.has_dyld_info and not b.has_dyld_chained_fixups
    want = sorted((bi.address, bi.symbol.name, bi.library.name if bi.has_library else "") for bi in b.bindings)
    assert sorted((i.slot, i.raw_name, i.library or "") for i in img.imports) == want


def llvm_stubs(path: Path) -> dict[int, str]:
    """Stub address -> symbol, from llvm-objdump's indirect symbol table of the stub sections."""
    out, in_stubs = {}, False
    for line in llvm_objdump("--indirect-symbols", str(path)).splitlines():
        if line.startswith("Indirect symbols for"):
            in_stubs = "stub" in line
        cols = line.split()
        if in_stubs and len(cols) == 3 and cols[0].startswith("0x"):
            out[int(cols[0], 16)] = cols[2]
    return out


@pytest.mark.parametrize("name", ["hello-osx-x86_64", "TestSocket"])
def test_dyld_info_stubs_are_named_after_their_imports(name):
    """The engine names every symbol stub after the import it jumps to, as llvm-objdump's
    indirect symbol table names it, on x86-64 (`jmp [lazy pointer]`) and arm64 (`ldr x16, literal`)."""
    from binlens.analysis import analyze

    path, img = dyld_info_image(name)
    stubs = llvm_stubs(path)
    assert stubs
    thunks = {f.address: f.thunk_name for f in analyze(img).functions if f.thunk_name}
    assert {va: thunks.get(va) for va in stubs} == {va: sym.removeprefix("_") for va, sym in stubs.items()}


@pytest.mark.parametrize("name", ["libr_bp.dylib", "TestSocket", "SwiftUITest"])
def test_exports_match_the_export_trie(name):
    """Every entry of the export trie is an export at its address, as llvm-objdump reads the trie
    (it prints virtual addresses)."""
    path, img = dyld_info_image(name)
    want = set()
    for line in llvm_objdump("--exports-trie", str(path)).splitlines():
        cols = line.split()
        if len(cols) >= 2 and cols[0].startswith("0x"):
            want.add((int(cols[0], 16), cols[1]))
    assert want, f"llvm-objdump printed no exports for {name}"
    assert {(e.address, e.raw_name) for e in img.exports} == want


def test_a_library_path_that_is_not_utf8_keeps_its_bytes_escaped():
    """objc-crash binds from `/usr/lib/li\\xa8objc.A.dylib`: LIEF raises on that path, the
    loader reads it from the load command and escapes the byte, as it does in symbol names."""
    path = corpus_dir("mach0") / "objc-crash"
    if not path.exists():
        pytest.skip("objc-crash is not in the corpus")
    img = load_image(str(path))
    assert "/usr/lib/li\\xa8objc.A.dylib" in {i.library for i in img.imports}
