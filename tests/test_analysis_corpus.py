"""The engine on third-party binaries of the shared corpus (skipped when the corpus is absent)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path
from binlens.store import ProgramDatabase
from binlens.store.analysis_save import save_analysis
from conftest import corpus_dir

ENTRY_SAMPLES = [
    ("pe", "a.exe", "PE", "x86"),
    ("jmptbl", "test_msvc_1700_64.exe", "PE", "x86-64"),
    ("mach0", "ls-osx-x86_64", "MachO", "x86-64"),
    ("mach0", "hello-macos-arm64-chained", "MachO", "aarch64"),
    ("elf", "gnome-extensions", "ELF", "aarch64"),
]


@pytest.mark.parametrize("folder,name,fmt,arch", ENTRY_SAMPLES)
def test_functions_include_the_entry(folder, name, fmt, arch):
    path = corpus_dir(folder) / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    img = parse_path(str(path))
    assert (img.identity.format, img.identity.arch) == (fmt, arch)
    a = analyze(img)
    entry = next((f for f in a.functions if f.address == img.identity.entry), None)
    assert entry is not None and "entry" in entry.sources
    assert entry.blocks and entry.blocks[0].start == img.identity.entry
    assert len(a.functions) >= 5
    # every function starts with a block at its entry and its blocks do not overlap
    for f in a.functions:
        if f.blocks:
            assert any(b.start == f.address for b in f.blocks)
            spans = sorted((b.start, b.end) for b in f.blocks)
            assert all(e1 <= s2 for (_s1, e1), (s2, _e2) in zip(spans, spans[1:], strict=False))


def test_macho_arm64_stubs_are_named_after_imports():
    path = corpus_dir("mach0") / "hello-macos-arm64-chained"
    img = parse_path(str(path))
    a = analyze(img)
    names = {f.thunk_name for f in a.functions if f.thunk_name}
    assert names and names <= {i.name for i in img.imports}


ELF_SWITCHES = [
    "test_clang_3.8_32.out",
    "test_clang_5.0_64.out",
    "test_gcc_5.5.0_32.out",
    "test_gcc_5.5.0_64.out",
    "test_gcc_7.2.0_32.out",
    "test_gcc_7.2.0_64.out",
]


def _objdump_insns(path, start: int, end: int) -> set[int]:
    text = subprocess.run(
        ["objdump", "-d", f"--start-address={start}", f"--stop-address={end}", str(path)],
        capture_output=True,
        text=True,
    ).stdout
    return {int(m.group(1), 16) for m in re.finditer(r"^\s*([0-9a-f]+):\t", text, re.M)}


@pytest.mark.parametrize("name", ELF_SWITCHES)
def test_elf_jump_tables_give_their_case_targets(name):
    path = corpus_dir("jmptbl") / name
    img = parse_path(str(path))
    main = next(s for s in img.symbols if s.name == "main")
    a = analyze(img)
    f = next(f for f in a.functions if f.address == main.address)
    targets = {e.dst for e in f.edges if e.kind == "jump_table"}
    # test.c: cases 1, 2-4, 5, 6, 7, 9, 11, 12, 13 and the default (for 8 and 10): 10 distinct targets
    assert len(targets) == 10, sorted(map(hex, targets))
    assert all(main.address <= t < main.address + main.size for t in targets)
    if shutil.which("objdump"):
        assert targets <= _objdump_insns(path, main.address, main.address + main.size)
    # each case body passes its string to puts (i386 PIC code addresses it from the GOT register)
    texts = {s.address: s.text for s in a.strings}
    used = {texts[x.dst] for x in a.xrefs if x.dst in texts and main.address <= x.src < main.address + main.size}
    assert {"case 1", "case 2,3,4", "case 5", "case 6", "case 7", "case 9", "case 11", "case 12", "case 13"} <= used
    assert "default" in used


@pytest.mark.parametrize("name", ["test_msvc_1700_32.exe", "test_msvc_1700_64.exe", "test_msvc_1900_32.exe"])
def test_msvc_jump_tables_give_their_case_targets(name):
    path = corpus_dir("jmptbl") / name
    a = analyze(parse_path(str(path)))
    s = next(s for s in a.strings if s.text == "case 2,3,4")
    ref = next(x for x in a.xrefs if x.dst == s.address)
    f = a.function_at(ref.src)
    targets = {e.dst for e in f.edges if e.kind == "jump_table"}
    assert len(targets) == 10, sorted(map(hex, targets))
    texts = {s.address: s.text for s in a.strings}
    blocks_with = {}
    for x in a.xrefs:
        if x.dst in texts and texts[x.dst].startswith(("case", "default")):
            blk = next((b for b in f.blocks if b.start <= x.src < b.end), None)
            if blk is not None:
                blocks_with[texts[x.dst]] = blk.start
    # every case string is referenced from a block that a jump-table edge enters
    assert len(blocks_with) == 10
    assert set(blocks_with.values()) == targets


def test_armv7_macho_functions_are_the_linkers_list():
    """An armv7 iOS app (stripped): LC_FUNCTION_STARTS lists every function the linker laid out,
    each with its Thumb bit. Every listed function is found, in the state the list gives, and no
    other start inside the sections the list covers (tail-call targets, gap and data-pointer
    guesses and calls from code decoded in the wrong state had added 8.5k there)."""
    path = corpus_dir("mach0") / "BatteryLife"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    img = parse_path(str(path))  # (the first slice of the universal binary: armv7)
    assert img.identity.arch == "arm"
    listed = {a & ~1: bool(a & 1) for a in img.function_hints["function_starts"]}
    assert len(listed) > 4000
    spans = [(s.va, s.va + s.size) for s in img.sections if any(s.va <= a < s.va + s.size for a in listed)]
    found = {f.address: f for f in analyze(img).functions}
    inside = {a for a in found if any(lo <= a < hi for lo, hi in spans)}
    assert inside == set(listed), (len(inside - set(listed)), len(set(listed) - inside))
    wrong_state = [a for a, thumb in listed.items() if (found[a].mode == "thumb") != thumb]
    assert not wrong_state, [hex(a) for a in wrong_state[:5]]


@pytest.mark.parametrize("name", ["libc.so.0", "busybox-phdr-shdr"])
def test_mips_delay_slots_that_start_chunks_keep_every_block_whole(name, tmp_path):
    """uClibc's MIPS libc and a busybox: a branch's delay slot is the first instruction of another
    chunk, which the branch's chunk used to mark as its own, so a later split took the branch's
    chunk for the one holding the split address: 66 blocks ended at or before their start (which
    then failed the save) and the branch lost its targets. Every block now has a size, every
    reference an address, and all of them stored."""
    path = corpus_dir("elf") / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    a = analyze(parse_path(str(path)))
    assert a.functions
    empty = [(hex(b.start), hex(b.end)) for f in a.functions for b in f.blocks if b.end <= b.start]
    assert not empty, empty[:5]
    assert all(0 <= x.src < 1 << 32 and 0 <= x.dst < 1 << 32 for x in a.xrefs)
    db = ProgramDatabase(tmp_path / "p.sqlite")
    save_analysis(db, a)
    assert db.connect().execute("SELECT count(*) FROM func").fetchone()[0] == len(a.functions)
    db.close()
