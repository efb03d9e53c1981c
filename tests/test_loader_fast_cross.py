"""The fast ELF reader on AArch64, ARM, MIPS, PowerPC and RISC-V: the very Image LIEF gives, in both byte orders.

`tests/fixtures/src/sample.c` is cross-compiled with the Debian gcc for each target as a PIE, a
non-PIE executable and a shared object (dynamically linked against the cross libc), and each
build must be taken by the fast reader (`parse_elf` does not decline it) with an Image equal to
LIEF's, field by field. Files it cannot reproduce (MIPS64, PowerPC64 ELFv1) must be declined, and
the parser worker must still answer them through LIEF.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest

from binlens.loader.elf_machines import MACHINES
from binlens.loader.image import encode_image
from binlens.loader.isolate import ParserWorker
from binlens.loader.parse_elf import NeedsLief, parse_elf
from binlens.loader.worker import fast_candidate
from conftest import FIXTURE_SRC, corpus_dir

# triple -> (arch, bits, endian) as the Image must report them
TARGETS = {
    "aarch64-linux-gnu": ("aarch64", 64, "little"),
    "arm-linux-gnueabihf": ("arm", 32, "little"),
    "mips-linux-gnu": ("mips", 32, "big"),
    "mipsel-linux-gnu": ("mips", 32, "little"),
    "powerpc-linux-gnu": ("ppc", 32, "big"),
    "powerpc64le-linux-gnu": ("ppc", 64, "little"),
    "riscv64-linux-gnu": ("riscv", 64, "little"),
}
KINDS = {
    "pie": ("-O2", "-fPIE", "-pie"),
    "nopie": ("-O0", "-fno-pie", "-no-pie"),
    "shared": ("-O2", "-fPIC", "-shared"),
}


@pytest.fixture(scope="session")
def cross_c(tmp_path_factory: pytest.TempPathFactory):
    """cross_c(triple, kind, strip=False) -> sample.c built for `triple` (cached; skips without the toolchain)."""
    out_dir = tmp_path_factory.mktemp("fastelf")
    cache: dict[tuple[str, str, bool], Path] = {}

    def build(triple: str, kind: str, strip: bool = False) -> Path:
        key = (triple, kind, strip)
        if key in cache:
            return cache[key]
        gcc = shutil.which(f"{triple}-gcc")
        if gcc is None or not Path(f"/usr/{triple}/lib").is_dir():
            pytest.skip(f"{triple}-gcc or its libc is missing (Debian packages gcc-{triple}, libc6-dev-*-cross)")
        out = out_dir / f"sample-{triple}-{kind}{'-stripped' if strip else ''}"
        if strip:
            subprocess.run([f"{triple}-strip", "-s", "-o", out, build(triple, kind)], check=True, capture_output=True)
        else:
            subprocess.run([gcc, *KINDS[kind], "-o", out, FIXTURE_SRC / "sample.c"], check=True, capture_output=True)
        cache[key] = out
        return out

    return build


def lief_image(data: bytes, name: str):  # noqa: ANN201 - an Image
    from binlens.loader.parse_lief import parse_image

    return parse_image(data, name)


def assert_taken_and_equal(path: Path):  # noqa: ANN201 - the fast Image
    """The fast reader takes the file and its Image equals LIEF's in every field."""
    data = path.read_bytes()
    fast = parse_elf(data, path.name)  # NeedsLief here fails the test: the fast path must be taken
    slow = lief_image(data, path.name)
    for f in fields(fast):
        assert getattr(fast, f.name) == getattr(slow, f.name), f"{path.name}: {f.name} differs"
    assert encode_image(fast) == encode_image(slow)
    assert fast.code_endian == slow.code_endian
    return fast


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("triple", list(TARGETS))
def test_fast_reader_takes_cross_builds_and_matches_lief(cross_c, triple, kind):
    path = cross_c(triple, kind)
    img = assert_taken_and_equal(path)
    arch, bits, endian = TARGETS[triple]
    assert (img.identity.arch, img.identity.bits, img.identity.endian) == (arch, bits, endian)
    assert fast_candidate(path.read_bytes()[:20])
    # what the analysis reads from the loader is really there
    assert any(s.raw_name == "classify" for s in img.symbols) or kind == "shared"
    assert any(e.raw_name == "classify" for e in img.exports) or kind != "shared"
    if arch != "mips":  # MIPS (abicalls) code imports through GOT entries that have no relocations
        assert {"puts", "printf", "malloc", "strlen"} & {i.raw_name for i in img.imports}
    assert all(i.library == "libc.so.6" for i in img.imports if i.raw_name in ("puts", "malloc"))
    assert (img.relocations or arch == "mips") and "init_array" in img.function_hints


@pytest.mark.parametrize("triple", ["mips-linux-gnu", "powerpc-linux-gnu", "arm-linux-gnueabihf"])
def test_fast_reader_matches_lief_on_stripped_cross_builds(cross_c, triple):
    img = assert_taken_and_equal(cross_c(triple, "pie", strip=True))
    assert not any(s.source == "symtab" for s in img.symbols)


def _patched(src: Path, dst: Path, offset: int, value: bytes) -> Path:
    data = bytearray(src.read_bytes())
    data[offset : offset + len(value)] = value
    dst.write_bytes(bytes(data))
    return dst


def test_mips_rs3_le_names_relocations_as_lief_does(cross_c, tmp_path):
    """EM_MIPS_RS3_LE (10): LIEF has no relocation table for it and calls every type 2**32 - 1."""
    path = _patched(cross_c("mipsel-linux-gnu", "pie"), tmp_path / "rs3le", 18, struct.pack("<H", 10))
    img = assert_taken_and_equal(path)
    assert img.identity.arch == "mips" and {r.type for r in img.relocations} == {"4294967295"}


def test_fast_reader_declines_what_lief_must_read(cross_c, tmp_path):
    """MIPS64 (three types per r_info) and PowerPC64 ELFv1 (function descriptors) go to LIEF."""
    with pytest.raises(NeedsLief):
        parse_elf(cross_c("mips64-linux-gnuabi64", "pie").read_bytes(), "mips64")
    ppc64 = cross_c("powerpc64le-linux-gnu", "pie")
    (flags,) = struct.unpack_from("<I", ppc64.read_bytes(), 0x30)
    assert flags & 3 == 2  # ELFv2
    v1 = _patched(ppc64, tmp_path / "v1", 0x30, struct.pack("<I", flags & ~3 | 1))
    with pytest.raises(NeedsLief):
        parse_elf(v1.read_bytes(), "v1")
    # the worker and the CLI's early start do not even try them
    assert not fast_candidate(v1.read_bytes()[:64]) and fast_candidate(ppc64.read_bytes()[:64])
    assert not fast_candidate(cross_c("mips64-linux-gnuabi64", "pie").read_bytes()[:20])
    # 32-bit AArch64 (ILP32) and 64-bit ARM are not plain files of their machine either
    arm = bytearray(cross_c("arm-linux-gnueabihf", "pie").read_bytes())
    arm[18:20] = struct.pack("<H", 183)
    with pytest.raises(NeedsLief):
        parse_elf(bytes(arm), "ilp32")


def test_damaged_big_endian_files_are_declined_or_equal(cross_c):
    """Truncated or bit-flipped big-endian headers and tables: NeedsLief or an exact Image, nothing else."""
    data = cross_c("powerpc-linux-gnu", "pie").read_bytes()
    shoff, phoff = struct.unpack_from(">I", data, 0x20)[0], struct.unpack_from(">I", data, 0x1C)[0]
    damaged = [data[:n] for n in (52, phoff + 40, len(data) // 3, len(data) - 1)]
    for where in (*range(16, 52, 2), phoff + 4, phoff + 36, shoff + 4, shoff + 56, shoff + 60):
        for value in (b"\xff\xff", b"\x00\x00", b"\x7f\x00"):
            damaged.append(data[:where] + value + data[where + 2 :])
    taken = 0
    for blob in damaged:
        try:
            parse_elf(blob, "damaged")
        except NeedsLief:
            continue
        taken += 1
    assert taken < len(damaged)  # most damage is seen and declined


def test_relocation_names_are_lief_spellings():
    """Every relocation name in the fast reader's tables is LIEF's name for that psABI number."""
    lief = pytest.importorskip("lief")
    kinds = lief.ELF.Relocation.TYPE
    values = {int(getattr(kinds, n)) for n in dir(kinds) if not n.startswith("_")}
    checked = 0
    for machine in MACHINES.values():
        for number, name in machine.relocs.items():
            if name.isdigit():  # LIEF has no member: it reports its internal value
                assert int(name) & 0xFFFFFF == number and int(name) not in values, name
            else:
                assert int(getattr(kinds, name)) & 0xFFFFFF == number, name
            checked += 1
    assert checked > 150


def test_worker_parses_cross_builds_without_lief(cross_c):
    """The parser worker takes the fast path for big-endian PowerPC and AArch64 (LIEF is never mapped),
    then still answers a MIPS64 file through LIEF."""
    worker = ParserWorker()
    try:
        for triple in ("powerpc-linux-gnu", "aarch64-linux-gnu"):
            data = cross_c(triple, "pie").read_bytes()
            img = worker.parse(data, triple, None, 8.0)
            assert encode_image(img) == encode_image(lief_image(data, triple))
        pid = worker._proc.pid  # noqa: SLF001 - the test inspects the worker process
        assert "_lief" not in Path(f"/proc/{pid}/maps").read_text()
        img = worker.parse(cross_c("mips64-linux-gnuabi64", "pie").read_bytes(), "mips64", None, 8.0)
        assert img.identity.arch == "mips" and img.identity.bits == 64
        assert "_lief" in Path(f"/proc/{pid}/maps").read_text()
    finally:
        worker.close()


def test_fuzzed_corpus_files_are_declined_or_equal():
    """The corpus's fuzzed files (crashers of other parsers among them): the fast reader declines each
    with NeedsLief or gives LIEF's very Image; no other exception, no hang."""
    folder = corpus_dir("fuzzed")
    taken = declined = 0
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        data = path.read_bytes()
        if data[:4] != b"\x7fELF":
            continue
        try:
            fast = parse_elf(data, path.name)
        except NeedsLief:
            declined += 1
            continue
        assert encode_image(fast) == encode_image(lief_image(data, path.name)), path.name
        taken += 1
    assert declined and taken  # both paths are exercised
