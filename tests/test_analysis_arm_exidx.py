"""ARM32 function starts from `.ARM.exidx`, from pushes in gaps, and the ARM/Thumb state of each.

`tests/fixtures/src/arm_states.c` holds ARM and Thumb functions (`target("arm")`/`target("thumb")`):
some called directly (across states too), some reached only through a table of pointers, some
never used. Built with `arm-linux-gnueabihf-gcc` and stripped, once with unwind tables (the unused
functions are then known from `.ARM.exidx` alone) and once without them and with `.ARM.exidx`
removed (the unused functions are then found by the push their frame begins with, in a gap).
The truth is the unstripped build's FUNC symbols: address, size and state (bit 0: Thumb).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode.backend import make_backend
from binlens.analysis.metadata.armexidx import decodes, guess_state, parse_exidx
from binlens.loader.isolate import load_image
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "arm_states.c"
GCC = "arm-linux-gnueabihf-gcc"
STRIP = "arm-linux-gnueabihf-strip"
UNUSED = {"arm_unused", "thumb_unused", "arm_unused2", "thumb_unused2", "arm_unused3", "thumb_unused3"}
UNUSED |= {"arm_unused_leaf", "thumb_unused_leaf", "thumb_unused_checked_leaf", "arm_unused_checked_leaf"}
UNUSED |= {"thumb_unused_tail", "thumb_unused_after_tail", "thumb_unused_shrinkwrapped"}
UNUSED |= {"thumb_unused_lr_only", "thumb_unused_after_lr_pop"}
POINTED = {"arm_pointed", "thumb_pointed"}


def _build(tmp: Path, opt: str, unwind: bool, merge: bool = False) -> tuple[Path, Path]:
    """(unstripped, stripped) builds of the fixture; without unwind tables `.ARM.exidx` is removed too."""
    for tool in (GCC, STRIP):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (Debian packages gcc-arm-linux-gnueabihf, binutils-arm-linux-gnueabihf)")
    out = tmp / f"states{opt}{'eh' if unwind else 'noeh'}{'m' if merge else ''}"
    # (GNU ld merges an entry into the one before when both describe the same frame: kept apart
    # here, so that every function has its own entry; `test_merged_exidx_entries` links without it)
    flags = ["-funwind-tables"] if unwind else ["-fno-unwind-tables", "-fno-asynchronous-unwind-tables"]
    flags += ["-Wl,--no-merge-exidx-entries"] if unwind and not merge else []
    subprocess.run([GCC, opt, *flags, "-o", str(out), str(SRC)], check=True, capture_output=True)
    stripped = out.with_suffix(".stripped")
    extra = [] if unwind else ["-R", ".ARM.exidx", "-R", ".ARM.extab"]
    subprocess.run([STRIP, *extra, "-o", str(stripped), str(out)], check=True, capture_output=True)
    return out, stripped


def _truth(unstripped: Path) -> dict[int, tuple[str, int, bool]]:
    """Even address -> (name, size, Thumb?) of every sized FUNC symbol of the build."""
    img = parse_path(str(unstripped))
    return {
        s.address & ~1: (s.name, s.size, bool(s.address & 1))
        for s in img.symbols
        if s.kind == "function" and s.address and s.size
    }


def _check_every_function(unstripped: Path, stripped: Path) -> dict[str, set[str]]:
    """Every FUNC symbol is a function at its even address in its state, and no function starts
    inside another; returns each fixture function's sources."""
    truth = _truth(unstripped)
    assert {name for name, _size, _thumb in truth.values()} >= UNUSED | POINTED | {"main"}
    result = analyze(load_image(str(stripped)))
    found = {f.address: f for f in result.functions}
    assert not [hex(a) for a in found if a & 1]
    missing = [name for va, (name, _s, _t) in truth.items() if va not in found]
    assert not missing, f"not found: {missing}"
    wrong = [
        (name, found[va].mode)
        for va, (name, _s, thumb) in truth.items()
        if found[va].mode != ("thumb" if thumb else None)
    ]
    assert not wrong, f"decoded in the wrong state: {wrong}"
    inside = [(hex(f), name) for f in found for va, (name, size, _t) in truth.items() if va < f < va + size]
    assert not inside, f"starts inside a function: {inside}"
    return {name: set(found[va].sources) for va, (name, _s, _t) in truth.items()}


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_exidx_entries_are_starts_in_their_state(tmp_path: Path, opt: str) -> None:
    unstripped, stripped = _build(tmp_path, opt, unwind=True)
    img = parse_path(str(stripped))
    entries = parse_exidx(img)
    truth = _truth(unstripped)
    described = {e.start for e in entries if e.kind != "cantunwind"}
    # each entry with an unwind description is a function, and each fixture function has one
    assert described <= set(truth)
    fixture = {va: name for va, (name, _s, _t) in truth.items() if name in UNUSED | POINTED | {"main"}}
    assert set(fixture) <= described
    # the table is sorted and ends with the linker's CANTUNWIND sentinel after the last function
    assert [e.start for e in entries] == sorted(e.start for e in entries)
    assert entries[-1].kind == "cantunwind" and entries[-1].start not in truth
    sources = _check_every_function(unstripped, stripped)
    for name in UNUSED:  # nothing else names them
        assert sources[name] == {"eh_frame"}, (name, sources[name])


def test_merged_exidx_entries(tmp_path: Path) -> None:
    """Linked as usual, entries with the same inline description are merged: a function without an
    entry of its own lies in the range of the one before. Every entry left is still a function
    start, found in its state, and no function starts inside another."""
    unstripped, stripped = _build(tmp_path, "-O2", unwind=True, merge=True)
    entries = parse_exidx(parse_path(str(stripped)))
    truth = _truth(unstripped)
    described = {e.start for e in entries if e.kind != "cantunwind"}
    assert described <= set(truth)
    merged = [va for va, (name, _s, _t) in truth.items() if name in UNUSED and va not in described]
    assert merged  # the build shows the case
    for va in merged:
        holder = max((e for e in entries if e.start < va), key=lambda e: e.start)
        assert holder.kind == "inline" and va < holder.start + holder.size
    result = analyze(load_image(str(stripped)))
    found = {f.address: f for f in result.functions}
    for va in described:
        assert va in found and found[va].mode == ("thumb" if truth[va][2] else None), truth[va][0]
    inside = [(hex(f), name) for f in found for va, (name, size, _t) in truth.items() if va < f < va + size]
    assert not inside
    # methods that only a table in data names, inside a merged range: each comes right after the
    # tail call through a register (`bx r3`) that ends the one before
    forwarders = {va: name for va, (name, _s, _t) in truth.items() if name.startswith("thumb_forward_")}
    assert len(forwarders) == 3
    assert [va for va in forwarders if va not in described]  # (merged into the first's: the build shows the case)
    assert {va: found[va].mode if va in found else None for va in forwarders} == dict.fromkeys(forwarders, "thumb")


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_gap_pushes_are_starts_in_their_state(tmp_path: Path, opt: str) -> None:
    unstripped, stripped = _build(tmp_path, opt, unwind=False)
    img = parse_path(str(stripped))
    assert not any(s.name in (".ARM.exidx", ".ARM.extab") for s in img.sections)
    sources = _check_every_function(unstripped, stripped)
    for name in UNUSED:
        assert sources[name] == {"prologue"}, (name, sources[name])
    # with no unwind range to give it, a function's size is the run of its blocks with the literal
    # pools inside and after it (the words its pc-relative loads read)
    sizes = {f.address: f.size for f in analyze(load_image(str(stripped))).functions}
    wrong = [(name, size, sizes[va]) for va, (name, size, _t) in _truth(unstripped).items() if sizes[va] != size]
    assert not wrong, f"(name, symbol size, found size): {wrong}"


@pytest.mark.parametrize("state", ["-marm", "-mthumb"])
def test_state_guess_never_contradicts_the_symbols(tmp_path: Path, state: str) -> None:
    """The first-bytes guess of the state, on every function of both builds: never the wrong state,
    and it decides most of them (the rest take the state most called functions have)."""
    unstripped, _stripped = _build(tmp_path, "-O2", unwind=True)
    out = tmp_path / f"g{state}"
    subprocess.run([GCC, "-O2", state, "-o", str(out), str(SRC)], check=True, capture_output=True)
    decided = 0
    for path in (unstripped, out):
        img = parse_path(str(path))
        backend = make_backend(img, CodeMap(img))
        for va, (name, _size, thumb) in _truth(path).items():
            data = img.read(va, 16) or b""
            md = backend.md  # type: ignore[attr-defined]
            guess = guess_state(data, lambda t, d=data, a=va, md=md: decodes(md(t), d, a))
            assert guess in (None, thumb), (path.name, name)
            decided += guess is not None
    assert decided >= 20


def test_exidx_prel31_and_kinds(tmp_path: Path) -> None:
    """The entries' first words are prel31 offsets (negative ones too: the index lies after the code)."""
    unstripped, stripped = _build(tmp_path, "-O2", unwind=True)
    img = parse_path(str(stripped))
    sec = next(s for s in img.sections if s.name == ".ARM.exidx")
    raw = img.read(sec.va, sec.size)
    assert raw is not None
    first = struct.unpack_from("<I", raw)[0]
    assert first & 0x40000000  # code lies below the table: a negative offset
    entries = parse_exidx(img)
    assert len(entries) == sec.size // 8
    assert {e.kind for e in entries} >= {"inline", "cantunwind"}
    assert all(e.size > 0 for e in entries[:-1])
