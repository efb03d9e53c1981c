"""Odd section and segment tables: the analysis analyses what it can read, says what it left out or
cut in `warnings` (kept in the program database), and never ends in `internal`."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from binlens.api import invoke
from binlens.workspace import Config, Workspace
from conftest import corpus_dir

TOP = (1 << 64) - 1
DUMMY = 0xDEADBEEF


class Elf64:
    """A little-endian ELF64 file's bytes, with its section and program headers patched by name."""

    def __init__(self, path: Path) -> None:
        self.data = bytearray(path.read_bytes())
        assert self.data[4:6] == b"\x02\x01", "an ELF64 little-endian fixture"
        self.phoff, self.shoff = struct.unpack_from("<QQ", self.data, 0x20)
        self.phnum, _, self.shnum, shstrndx = struct.unpack_from("<HHHH", self.data, 0x38)
        names = struct.unpack_from("<Q", self.data, self.shoff + 64 * shstrndx + 24)[0]
        self.index = {}
        for i in range(self.shnum):
            at = names + struct.unpack_from("<I", self.data, self.shoff + 64 * i)[0]
            self.index[bytes(self.data[at : self.data.index(b"\0", at)]).decode()] = i

    def section(self, name: str, **fields: int) -> Elf64:
        """Set `addr`, `offset`, `size` or `flags` of the section `name`."""
        where = {"flags": 8, "addr": 16, "offset": 24, "size": 32}
        for key, value in fields.items():
            struct.pack_into("<Q", self.data, self.shoff + 64 * self.index[name] + where[key], value)
        return self

    def load(self, n: int, **fields: int) -> Elf64:
        """Set `vaddr`, `offset`, `filesz` or `memsz` of the `n`th PT_LOAD program header."""
        loads = [i for i in range(self.phnum) if struct.unpack_from("<I", self.data, self.phoff + 56 * i)[0] == 1]
        where = {"offset": 8, "vaddr": 16, "filesz": 32, "memsz": 40}
        for key, value in fields.items():
            struct.pack_into("<Q", self.data, self.phoff + 56 * loads[n] + where[key], value)
        return self

    def write(self, path: Path) -> Path:
        path.write_bytes(self.data)
        return path


def _analysis(workspace: Workspace, path: Path) -> dict:
    """The finished analysis's status, through the API; it must not fail."""
    workspace.open(path, check_roots=False)
    status = invoke(workspace, "analysis.start", {"wait": True, "timeout_ms": 120000})
    assert status["status"] == "done", status
    return status


@pytest.fixture()
def sample(compile_c) -> Path:
    return compile_c("sample.c", "-O2", True)


# Each: how the sample's tables are patched, and words the warnings must hold.
ODD_TABLES = {
    # .text's end wraps past 2**64 (the gap map refused such regions)
    "wrapping": (lambda e: e.section(".text", addr=TOP - 0xFF), ["'.text'", "end of the address space"]),
    # every code section at one address past the top
    "all_at_top": (
        lambda e: e.section(".init", addr=TOP).section(".plt", addr=TOP).section(".text", addr=TOP),
        ["end of the address space"],
    ),
    # .init's bytes lie past the end of the file and .plt starts where it does (two maps at one address)
    "past_the_file_at_one_address": (
        lambda e: e.section(".init", offset=0x10000000).section(".plt", addr=0x1000),
        ["'.init'", "past the end of the file"],
    ),
    # dummy values: three code sections at one made-up address
    "dummy_addresses": (
        lambda e: e.section(".init", addr=DUMMY).section(".fini", addr=DUMMY).section(".text", addr=DUMMY),
        ["0xdeadbeef", "lies inside"],
    ),
    # .plt grows over .plt.got and part of .text
    "overlapping": (lambda e: e.section(".plt", size=0x100), ["'.text'", "overlaps code section '.plt'"]),
    # a size far past the end of the file
    "huge_size": (lambda e: e.section(".text", size=0x7FFFFFFFFFFF), ["'.text'", "the file holds"]),
    # data sections whose strings and words would lie past 2**64
    "data_wrapping": (
        lambda e: e.section(".rodata", addr=TOP - 0x20).section(".data", addr=TOP - 0x8),
        ["data section '.rodata'", "data section '.data'", "what lies past it is not read"],
    ),
}


@pytest.mark.parametrize("case", sorted(ODD_TABLES))
def test_odd_section_table_is_analysed_with_a_warning(workspace, sample, tmp_path, case):
    patch, words = ODD_TABLES[case]
    path = patch(Elf64(sample)).write(tmp_path / case)
    status = _analysis(workspace, path)
    said = " | ".join(status["warnings"])
    assert all(w in said for w in words), status["warnings"]
    assert status["counts"]["functions"] >= 1


def test_overlapping_and_wrapping_segments_are_analysed(workspace, sample, tmp_path):
    # the code segment laid over the first one, the data segment wrapping past 2**64: the code
    # sections still place the code
    path = Elf64(sample).load(1, vaddr=0).load(3, vaddr=TOP - 0x100, memsz=0x10000).write(tmp_path / "segments")
    status = _analysis(workspace, path)
    assert status["counts"]["functions"] >= 16


def test_code_segments_alone_out_of_order_and_overlapping(workspace, sample, tmp_path):
    # no code sections (their flags cleared): the executable segments place the code, here the first
    # one made executable over the code one, and the third made executable just below 2**64
    elf = Elf64(sample)
    for name in (".init", ".plt", ".plt.got", ".text", ".fini"):
        elf.section(name, flags=0x2)  # allocated, not executable
    loads = [i for i in range(elf.phnum) if struct.unpack_from("<I", elf.data, elf.phoff + 56 * i)[0] == 1]
    for n in (0, 2):
        struct.pack_into("<I", elf.data, elf.phoff + 56 * loads[n] + 4, 5)  # p_flags: r-x
    elf.load(0, vaddr=0x1000).load(2, vaddr=TOP - 0x80)
    status = _analysis(workspace, elf.write(tmp_path / "segments_only"))
    said = " | ".join(status["warnings"])
    assert "code segment 'LOAD3' at 0x1000: lies inside code segment 'LOAD2'" in said, said
    assert "runs past the end of the address space" in said, said
    assert status["counts"]["functions"] >= 1


def test_warnings_are_kept_in_the_program_database(home, sample, tmp_path):
    path = Elf64(sample).section(".text", addr=TOP - 0xFF).write(tmp_path / "wrapping")
    first = Workspace(Config(home=home))
    warnings = _analysis(first, path)["warnings"]
    assert warnings
    first.close(first.program(None).handle)
    again = Workspace(Config(home=home))
    again.open(path, check_roots=False)
    status = invoke(again, "analysis.get", {})
    assert status["status"] == "done" and "loaded from the program database" in status["message"]
    assert status["warnings"] == warnings


def test_plain_file_has_no_warnings(workspace, sample):
    assert _analysis(workspace, sample)["warnings"] == []


# Mutants of corpus files that ended in `internal error (ValueError)`: (file, [(offset, width, value)]).
CORPUS_MUTANTS = {
    # section 12 (.init) at 2**64 - 1 and section 4's size 0
    "elf/hello_world": [(0x1D18, 8, TOP), (0x1B28, 8, 0)],
    # __TEXT's fourth section at 2**64 - 1
    "mach0/hello-osx-x86_64": [(0x1C0, 8, TOP)],
    # __TEXT,__text at 2**64 - 1 with file offset 0, __PAGEZERO 64 GiB + 1
    "mach0/hello-osx-x86_64 ": [(0xD0, 8, TOP), (0xE0, 4, 0), (0x40, 8, 0x1000000001)],
}


@pytest.mark.parametrize("name", sorted(CORPUS_MUTANTS))
def test_corpus_mutant_is_analysed(workspace, tmp_path, name):
    source = corpus_dir() / name.strip()
    if not source.is_file():
        pytest.skip(f"{source} is absent")
    data = bytearray(source.read_bytes())
    for offset, width, value in CORPUS_MUTANTS[name]:
        data[offset : offset + width] = value.to_bytes(width, "little")
    path = tmp_path / source.name
    path.write_bytes(data)
    status = _analysis(workspace, path)
    assert "end of the address space" in " | ".join(status["warnings"])


def test_a_stored_analysis_survives_the_warnings_migration(tmp_path):
    import sqlite3

    from binlens.analysis import ENGINE_VERSION
    from binlens.store import analysis as store
    from binlens.store.database import CORE_MIGRATIONS, ProgramDatabase

    path = tmp_path / "before.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(CORE_MIGRATIONS[0])
    for step in store.ANALYSIS_MIGRATIONS[:3]:
        conn.executescript(step)
    conn.execute("INSERT INTO meta VALUES ('schema.analysis', '3')")
    conn.execute(
        "INSERT INTO analysis_run VALUES (1, ?, 'done', 1, 1, 4, 0, 0, 16, 16, 0.1, '2026-11-30T00:00:00Z')",
        (ENGINE_VERSION,),
    )
    conn.close()
    db = ProgramDatabase(path)
    run = store.load_run(db)
    assert run is not None and run.status == "done" and run.counts["functions"] == 1 and run.warnings == []


def test_functions_command_prints_the_warnings(home, sample, tmp_path):
    from conftest import run_cli

    path = Elf64(sample).section(".text", addr=TOP - 0xFF).write(tmp_path / "wrapping")
    out = run_cli("functions", str(path), home=home)
    assert out.returncode == 0, out.stderr
    assert "binlens: warning: code section '.text' at 0xffffffffffffff00: runs past" in out.stderr


def test_no_disassembler_error_names_the_program(workspace, sample, tmp_path):
    from binlens.errors import BinlensError

    data = bytearray(sample.read_bytes())
    struct.pack_into("<H", data, 0x12, 22)  # e_machine: IBM S/390, which no decoder here reads
    path = tmp_path / "s390"
    path.write_bytes(data)
    workspace.open(path, check_roots=False)
    for method in ("analysis.start", "function.list"):
        params = {"wait": True} if method == "analysis.start" else {}
        with pytest.raises(BinlensError) as err:
            invoke(workspace, method, params)
        assert "no disassembler for architecture" in err.value.message
        assert err.value.target == "/params/program", (method, err.value.code, err.value.target)
    status = invoke(workspace, "analysis.get", {})
    assert status["status"] == "failed" and "no disassembler" in status["error"]


def test_pe_image_base_at_the_top_wraps(workspace, tmp_path):
    source = corpus_dir() / "pe" / "WindowsUI-App.exe"
    if not source.is_file():
        pytest.skip(f"{source} is absent")
    data = bytearray(source.read_bytes())
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    assert struct.unpack_from("<H", data, pe + 24)[0] == 0x20B  # PE32+: ImageBase is 8 bytes at +24
    struct.pack_into("<Q", data, pe + 24 + 24, TOP)
    path = tmp_path / source.name
    path.write_bytes(data)
    status = _analysis(workspace, path)
    assert status["counts"]["functions"] >= 1 and status["counts"]["strings"] >= 1
    info = invoke(workspace, "program.get", {})
    assert any("wrap around" in w for w in info["warnings"]), info["warnings"]
    starts = [int(s["start"], 16) for s in info["sections"]]
    assert all(0 <= a < 1 << 64 for a in starts) and min(starts) < 0x100000


def test_warnings_migration_takes_a_column_added_already(tmp_path):
    import sqlite3

    from binlens.store import analysis as store
    from binlens.store.database import CORE_MIGRATIONS, ProgramDatabase

    path = tmp_path / "raced.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(CORE_MIGRATIONS[0])
    for step in store.ANALYSIS_MIGRATIONS[:3]:
        conn.executescript(step)
    conn.execute("ALTER TABLE analysis_run ADD COLUMN warnings TEXT")  # (as another process's open did)
    conn.execute("INSERT INTO meta VALUES ('schema.analysis', '3')")
    conn.close()
    db = ProgramDatabase(path)
    assert db.schema_versions()["analysis"] == len(store.ANALYSIS_MIGRATIONS)
