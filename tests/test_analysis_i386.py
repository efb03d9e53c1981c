"""i386 position-independent code (`tests/fixtures/src/i386_pic.c`, Debian's i686 cross gcc, -O2 PIE).

- gcc reaches data through whichever register a `__x86.get_pc_thunk.REG` set (`call thunk; add eax,
  GOT - here; lea eax, [eax + str@GOTOFF]`), not only through ebx: the strings `pick` returns are
  referenced from `pick`.
- Stripped of symbols and unwind information, the functions nothing calls are found after the
  padding gas writes between i386 functions (`lea esi, [esi + 0]` and kin).
- Immediates and absolute memory operands are numbers in position-independent code (`sub esp,
  0x1c`, `gs:[0x14]`): no reference is made to the low addresses they would name.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "i386_pic.c"
TRIPLE = "i686-linux-gnu"


@pytest.fixture(scope="module")
def i386_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    flags = ["-O2", "-fPIE", "-pie", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]
    return xb.gcc_linked(tmp_path_factory.mktemp("i386"), TRIPLE, SRC, "pic", flags, (".eh_frame", ".eh_frame_hdr"))


def test_data_reached_through_a_pc_thunk_register(i386_build: tuple[Path, Path]) -> None:
    exe, stripped = i386_build
    symbols = {s.name: s for s in parse_path(str(exe)).symbols}
    pick = symbols["pick"]
    text = subprocess.run([f"{TRIPLE}-objdump", "-d", str(exe)], capture_output=True, text=True).stdout
    body = text.split("<pick>:", 1)[1].split("\n\n", 1)[0]
    assert "get_pc_thunk" in body and "get_pc_thunk.bx" not in body  # the build shows the case
    result = analyze(parse_path(str(stripped)))
    strings = {s.text: s.address for s in result.strings}
    refs = {(x.src, x.dst) for x in result.xrefs}
    inside = range(pick.address, pick.address + pick.size)
    # "none-of-them" is formed in `pick` itself; the table of words is too
    assert any(src in inside and dst == strings["none-of-them"] for src, dst in refs)
    table = symbols["words"].address
    assert any(src in inside and dst == table for src, dst in refs)


def test_functions_after_i386_padding_are_found(i386_build: tuple[Path, Path]) -> None:
    exe, stripped = i386_build
    symbols = {s.name: s.address for s in parse_path(str(exe)).symbols if s.kind == "function"}
    found = {f.address for f in analyze(parse_path(str(stripped))).functions}
    missing = [n for n in ("pick", "unused_sum", "unused_pick_len", "main") if symbols[n] not in found]
    assert not missing


def test_no_references_to_the_numbers_position_independent_code_uses(i386_build: tuple[Path, Path]) -> None:
    _exe, stripped = i386_build
    image = parse_path(str(stripped))
    first = min(s.va for s in image.sections if s.va)
    low = [(hex(x.src), hex(x.dst), x.kind) for x in analyze(image).xrefs if x.dst < first]
    assert not low, low
