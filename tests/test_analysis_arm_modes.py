"""ARM32 state and byte order: Thumb function pointers, and BE8 images (little-endian code, big-endian data).

`tests/fixtures/src/callbacks_arm.c` holds callbacks in ARM and Thumb state reached only through a
table of function pointers in data; built with `arm-linux-gnueabihf-gcc` (Thumb and ARM default
state, -O0/-O2, without unwind tables) and stripped, the engine finds them by the data-pointer
heuristic (or by the gap heuristic, from the push they begin with). The truth is the unstripped
build's symbol table (a Thumb function's symbol has bit 0 set). Big-endian builds are checked
against `arm-linux-gnueabihf-objdump -d`, which reads the mapping symbols (`$a`/`$t`/`$d`) of the
unstripped build and knows BE8.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.analysis.codemap import CodeMap
from binlens.analysis.engine import make_backend
from binlens.loader.image import EF_ARM_BE8, Image
from binlens.loader.isolate import load_image
from binlens.loader.parse_lief import parse_path
from conftest import corpus_dir

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "callbacks_arm.c"
GCC = "arm-linux-gnueabihf-gcc"
TOOLS = (GCC, "arm-linux-gnueabihf-strip", "arm-linux-gnueabihf-objdump", "arm-linux-gnueabihf-ld")
CALLBACKS = {"arm_triple", "thumb_quint", "arm_mask", "thumb_less", "thumb_square", "arm_shift"}
_OBJDUMP_LINE = re.compile(r"^\s+([0-9a-f]+):\t((?:[0-9a-f]{4,8} ?)+)\s*\t(\S+)")


def _need_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} missing (Debian packages gcc-arm-linux-gnueabihf, binutils-arm-linux-gnueabihf)"
        )


def _build(out: Path, *flags: str, link: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """(unstripped, stripped) builds of the fixture."""
    _need_tools()
    cmd = [GCC, *flags, "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-o", str(out), str(SRC), *link]
    subprocess.run(cmd, check=True, capture_output=True)
    stripped = out.with_suffix(".stripped")
    subprocess.run(["arm-linux-gnueabihf-strip", "-o", str(stripped), str(out)], check=True)
    return out, stripped


def _functions_truth(unstripped: Path) -> dict[int, tuple[str, bool]]:
    """Even address -> (name, Thumb?) of every FUNC symbol of the unstripped build."""
    img = parse_path(str(unstripped))
    return {s.address & ~1: (s.name, bool(s.address & 1)) for s in img.symbols if s.kind == "function" and s.address}


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
@pytest.mark.parametrize("state", ["-mthumb", "-marm"])
@pytest.mark.parametrize("pie", [True, False])
def test_pointer_starts_have_no_thumb_bit_and_the_right_mode(tmp_path: Path, state: str, opt: str, pie: bool) -> None:
    unstripped, stripped = _build(tmp_path / f"cb{state}{opt}", state, opt, *(() if pie else ("-no-pie",)))
    truth = _functions_truth(unstripped)
    callbacks = {va: thumb for va, (name, thumb) in truth.items() if name in CALLBACKS}
    assert len(callbacks) == 6 and sum(callbacks.values()) == 3  # the truth is what the fixture says
    result = analyze(parse_path(str(stripped)))
    odd = [hex(f.address) for f in result.functions if f.address & 1]
    assert not odd, f"functions at odd addresses: {odd}"
    by_start = {f.address: f for f in result.functions}
    for va, thumb in callbacks.items():
        name = truth[va][0]
        assert va in by_start, f"{name} at {va:#x} not found"
        # found by its pointer, or before that by the push it begins with (the gap stage comes first)
        assert {"pointer", "prologue"} & set(by_start[va].sources), (name, by_start[va].sources)
        assert by_start[va].mode == ("thumb" if thumb else None), (name, by_start[va].mode)
    # the table's words are `pointer` references to the callbacks' starts, Thumb bit cleared
    pointed = {x.dst for x in result.xrefs if x.kind == "pointer"}
    assert set(callbacks) <= pointed and not {va | 1 for va in callbacks} & pointed
    # the helpers each callback calls in the other state (`blx #imm`) are decoded in their own state
    assert {name for name, _thumb in truth.values()} >= {"thumb_helper", "arm_helper"}
    for va, (name, thumb) in truth.items():
        if name in ("thumb_helper", "arm_helper"):
            assert va in by_start and by_start[va].mode == ("thumb" if thumb else None), name
            assert "call" in by_start[va].sources
            assert all(b.terminator != "invalid" for b in by_start[va].blocks), name
    # every function the build names is listed in its own state (crt code, main, callbacks)
    wrong = [
        (name, hex(va), by_start[va].mode)
        for va, (name, thumb) in truth.items()
        if va in by_start and by_start[va].mode != ("thumb" if thumb else None)
    ]
    assert not wrong


def _objdump(unstripped: Path, *options: str) -> dict[int, tuple[str, str]]:
    """Instruction address -> (encoding as objdump prints it, mnemonic), by the build's mapping symbols."""
    cmd = ["arm-linux-gnueabihf-objdump", "-d", *options, str(unstripped)]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        m = _OBJDUMP_LINE.match(line)
        if m and not m.group(3).startswith("."):  # `.word` of a literal pool is data
            out[int(m.group(1), 16)] = (m.group(2).strip(), m.group(3))
    return out


def _mnemonic(m: str) -> str:
    return m.lower().removesuffix(".n").removesuffix(".w")


def _decoded(img: Image, start: int, end: int, thumb: bool, order: str) -> list[tuple[int, str, str]]:
    """(address, encoding spelled as objdump does, mnemonic) of the engine's decoding of [start, end)."""
    backend = make_backend(img, CodeMap(img))
    out = []
    for ins in backend.instructions(start | int(thumb), end):  # type: ignore[attr-defined]
        raw = ins.bytes
        if thumb:
            enc = " ".join(f"{int.from_bytes(raw[i : i + 2], order):04x}" for i in range(0, len(raw), 2))
        else:
            enc = f"{int.from_bytes(raw, order):08x}"
        out.append((ins.address, enc, ins.mnemonic))
    return out


def _assert_blocks_match_objdump(img: Image, unstripped: Path, order: str) -> int:
    """Every instruction of every analysed block equals objdump's at that address; the count compared."""
    truth = _objdump(unstripped)
    result = analyze(img)
    compared = 0
    for f in result.functions:
        for b in f.blocks:
            for va, enc, mnemonic in _decoded(img, b.start, b.end, f.mode == "thumb", order):
                assert va in truth, f"{va:#x}: not an instruction start for objdump"
                assert (enc, _mnemonic(mnemonic)) == (truth[va][0], _mnemonic(truth[va][1])), hex(va)
                compared += 1
    return compared


def _big_endian_build(tmp_path: Path, be8: bool) -> Path:
    """A freestanding big-endian build: BE8 through gcc's link, BE32 through `ld -EB` without `--be8`."""
    _need_tools()
    flags = ["-O2", "-mbig-endian", "-DNO_LIBC", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]
    out = tmp_path / ("be8" if be8 else "be32")
    try:
        if be8:
            cmd = [GCC, *flags, "-nostdlib", "-static", "-Wl,--be8", "-o", str(out), str(SRC)]
            subprocess.run(cmd, check=True, capture_output=True)
        else:
            obj = out.with_suffix(".o")
            subprocess.run([GCC, *flags, "-c", "-o", str(obj), str(SRC)], check=True, capture_output=True)
            cmd = ["arm-linux-gnueabihf-ld", "-EB", "-e", "_start", "-o", str(out), str(obj)]
            subprocess.run(cmd, check=True, capture_output=True)
    except subprocess.CalledProcessError as err:
        pytest.skip(f"the ARM toolchain cannot link a big-endian program: {err.stderr.decode()[-200:]}")
    return out


def test_be8_code_decodes_little_endian_and_data_stays_big_endian(tmp_path: Path) -> None:
    path = _big_endian_build(tmp_path, be8=True)
    img = load_image(str(path))
    assert img.identity.endian == "big" and img.machine_flags & EF_ARM_BE8 and img.code_endian == "little"
    assert parse_path(str(path)).machine_flags == img.machine_flags  # in-process LIEF and the worker agree
    assert _assert_blocks_match_objdump(img, path, "little") >= 20
    result = analyze(img)
    starts = {f.address: f for f in result.functions}
    truth = _functions_truth(path)
    # the callbacks come from big-endian pointers in data, each in its own state
    for va, (name, thumb) in truth.items():
        if name in CALLBACKS:
            assert va in starts and starts[va].mode == ("thumb" if thumb else None), name
    assert not [f.address for f in result.functions if f.address & 1]


def test_be32_code_stays_big_endian(tmp_path: Path) -> None:
    path = _big_endian_build(tmp_path, be8=False)
    img = load_image(str(path))
    assert img.identity.endian == "big" and not img.machine_flags & EF_ARM_BE8 and img.code_endian == "big"
    assert _assert_blocks_match_objdump(img, path, "big") >= 20


def test_little_endian_and_other_formats_keep_their_byte_order(compile_c) -> None:
    img = load_image(str(compile_c("sample.c", "-O2")))
    assert img.machine_flags == parse_path(str(compile_c("sample.c", "-O2"))).machine_flags
    assert img.code_endian == img.identity.endian == "little"


def test_corpus_be8_image_decodes_like_objdump() -> None:
    """Every analysed instruction of the corpus's stripped BE8 program against objdump's linear
    listings of the file in ARM and in Thumb state (no mapping symbols: objdump is told the state)."""
    path = corpus_dir("elf") / "armeb_hello_static"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    _need_tools()
    img = load_image(str(path))
    assert img.code_endian == "little" and img.identity.endian == "big"
    listings = {False: _objdump(path), True: _objdump(path, "-M", "force-thumb")}
    result = analyze(img)
    entry = next(f for f in result.functions if f.address == img.identity.entry & ~1)
    assert (entry.mode == "thumb") == bool(img.identity.entry & 1)
    backend = make_backend(img, CodeMap(img))
    total = shared = same_mnemonic = 0
    for f in result.functions:
        thumb = f.mode == "thumb"
        truth = listings[thumb]
        for b in f.blocks:
            for ins in backend.instructions(b.start | int(thumb), b.end):  # type: ignore[attr-defined]
                total += 1
                if ins.address not in truth:
                    continue  # a linear listing can be out of step where data sits between functions
                shared += 1
                raw = ins.bytes
                if thumb:
                    enc = " ".join(f"{int.from_bytes(raw[i : i + 2], 'little'):04x}" for i in range(0, len(raw), 2))
                else:
                    enc = f"{int.from_bytes(raw, 'little'):08x}"
                assert enc == truth[ins.address][0], hex(ins.address)
                same_mnemonic += _mnemonic(ins.mnemonic) == _mnemonic(truth[ins.address][1])
    # measured: 63475 instructions, 63456 at objdump's instruction starts, 97.4% the same mnemonic
    # (the rest are aliases: pop/ldmia, push/stmdb, bhs/bcs, lsl/mov...); decoded big-endian, as
    # before BE8 was known, only 4187 instructions were reached and 3% of mnemonics agreed
    assert total > 50_000 and shared >= 0.99 * total and same_mnemonic >= 0.95 * shared


def test_main_of_a_pie_is_found_through_its_got_word(tmp_path) -> None:
    """An ARM PIE's `_start` loads `main` from a GOT word (`ldr r0, [sl, r0]`) whose R_ARM_RELATIVE
    relocation keeps the address in the word itself (REL: no addend field): that word names `main`
    (a Thumb function, so the word is odd), which is then found as a function of its own."""
    _need_tools()
    src = tmp_path / "m.c"
    src.write_text(
        "#include <stdio.h>\n"
        "static int helper(int x) { return x * 3 + 1; }\n"
        'int main(int argc, char **argv) { printf("%d\\n", helper(argc)); return 0; }\n'
    )
    exe, stripped = tmp_path / "m", tmp_path / "m.stripped"
    subprocess.run([GCC, "-O2", "-fPIE", "-pie", "-o", str(exe), str(src)], check=True, capture_output=True)
    subprocess.run(["arm-linux-gnueabihf-strip", "-o", str(stripped), str(exe)], check=True, capture_output=True)
    main = next(s.address for s in parse_path(str(exe)).symbols if s.name == "main")
    assert main & 1  # Thumb
    functions = {f.address: f for f in analyze(load_image(str(stripped))).functions}
    assert main & ~1 in functions
    assert functions[main & ~1].mode == "thumb"


@pytest.mark.parametrize("state", ["-marm", "-mthumb"])
def test_branches_to_code_at_2_gib_and_above_are_followed(tmp_path: Path, state: str) -> None:
    """capstone gives ARM's branch targets as signed 32-bit numbers: code linked at 0x80001000 had
    every call target negative, so functions reached only by calls were never found (and a
    reference to a negative address failed the save). Stripped, no unwind tables, entry `_start`."""
    _need_tools()
    src = SRC.parent / "high_address.c"
    out = tmp_path / f"high{state}"
    flags = ["-O2", "-nostdlib", "-static", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]
    subprocess.run(
        [GCC, state, *flags, "-Wl,-Ttext=0x80001000", "-Wl,--build-id=none", "-o", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    stripped = out.with_suffix(".stripped")
    subprocess.run(["arm-linux-gnueabihf-strip", "-o", str(stripped), str(out)], check=True)
    truth = _functions_truth(out)
    names = {name: va for va, (name, _thumb) in truth.items()}
    assert min(names.values()) >= 0x80001000
    result = analyze(parse_path(str(stripped)))
    by_start = {f.address: f for f in result.functions}
    for name in ("leaf", "middle"):
        assert names[name] in by_start, f"{name} at {names[name]:#x} not found"
        assert "call" in by_start[names[name]].sources
    calls = {(x.dst, x.kind) for x in result.xrefs if x.kind == "call"}
    assert calls == {(names["leaf"], "call"), (names["middle"], "call")}
    assert all(0 <= x.dst < 1 << 32 and 0 <= x.src < 1 << 32 for x in result.xrefs)
