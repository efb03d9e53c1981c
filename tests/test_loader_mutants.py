"""Corpus files with one header field corrupted as the mutation fuzzer (bench/fuzz.py) does: the
loader reads them or refuses them with a clear error, never a wrong or internal one."""

from __future__ import annotations

import importlib.util
import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

from binlens.api import invoke
from binlens.loader.parse_lief import parse_image
from conftest import ROOT, corpus_dir


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


def _fuzz_mutant(seed: int, index: int, source: Path) -> bytes:
    """Mutant `index` of `seed` of `source`, as bench/fuzz.py makes it."""
    spec = importlib.util.spec_from_file_location("fuzz_mutate", ROOT / "bench" / "fuzz_mutate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_mutate"] = mod
    spec.loader.exec_module(mod)
    return mod.mutate(source.read_bytes(), seed, index).data


def test_elf_version_need_file_name_that_is_not_utf8_leaves_the_library_unknown() -> None:
    # LIEF's getter of a version need's file name raises UnicodeDecodeError on it
    data = bytearray((corpus_dir("elf") / "jni" / "native-methods-arm64.so").read_bytes())
    at = data.index(b"libc.so\0")  # DT_NEEDED and the version need's vn_file share this string
    data[at + 5] = 0xC9
    image = parse_image(bytes(data), "elf-verneed", None)  # the loader's LIEF path
    names = {i.name: i.library for i in image.imports}
    assert "__cxa_finalize" in names and names["__cxa_finalize"] is None


def test_fuzz_mutant_with_a_bad_version_need_name_opens(workspace, tmp_path: Path) -> None:
    # fuzz seed 2 mutant 1268 (elf/jni/native-methods-arm64.so): "the parser rejected it (UnicodeDecodeError)"
    path = tmp_path / "s2-i1268-elf"
    path.write_bytes(_fuzz_mutant(2, 1268, corpus_dir("elf") / "jni" / "native-methods-arm64.so"))
    opened = invoke(workspace, "program.open", {"path": str(path)})
    assert opened["identity"]["format"] == "ELF" and opened["counts"]["imports"] == 2


_PE_SECTIONS_CHECK = """
import sys
from binlens.loader.parse_lief import parse_image
data = open(sys.argv[1], "rb").read()
image = parse_image(data, "pe-sections", None)
bad = [s.name for s in image.sections if s.fsize and s.offset + s.fsize > len(data)]
print(len(image.sections), bad)
"""


def test_pe_sections_past_the_end_of_the_file_hold_only_its_bytes(tmp_path: Path) -> None:
    # fuzz seed 3 mutant 39: NumberOfSections 5 -> 0x1005 makes code and strings garbage sections
    # with huge raw sizes; their zero-filled "file bytes" took the loader past 2 GiB (MemoryError)
    path = tmp_path / "s3-i39-pe"
    path.write_bytes(_fuzz_mutant(3, 39, corpus_dir("jmptbl") / "test_switch_indirect.exe"))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    limit = 1 << 30

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-c", _PE_SECTIONS_CHECK, str(path)],
        capture_output=True, text=True, env=env, timeout=120, preexec_fn=cap,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    count, bad = proc.stdout.split(" ", 1)
    assert int(count) > 5 and bad.strip() == "[]"


def test_arm_exidx_section_past_the_end_of_the_file_is_read_as_far_as_the_file_goes(workspace, tmp_path: Path) -> None:
    # fuzz seed 1 mutant 4700 (elf/analysis/example.elf): `.ARM.exidx`'s sh_size 0x8 -> 0x80000 made
    # the index parser unpack 512 KiB from a 80 KiB file and the analysis end `internal`
    path = tmp_path / "s1-i4700-elf"
    path.write_bytes(_fuzz_mutant(1, 4700, corpus_dir("elf") / "analysis" / "example.elf"))
    invoke(workspace, "program.open", {"path": str(path)})
    status = invoke(workspace, "analysis.start", {"wait": True, "timeout_ms": 120000})
    assert status["status"] == "done", status
