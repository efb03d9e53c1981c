"""Code nothing reaches, and numbers that look like code addresses: `tests/fixtures/src/deadcode.c`.

- AArch64 without unwind tables: exported functions nothing calls, leaf ones with no prologue
  among them, are found by trial decoding of the gaps between functions (a gap that starts right
  after a `ret`/`b` and decodes to a self-contained function).
- Position-independent ELF (`*_RELATIVE`, MIPS `R_MIPS_REL32` relocations): a word in data is an
  address only where a relocation puts one; a number equal to a code address is not a pointer
  there (it is in a fixed-address executable, where nothing tells the two apart).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.analysis.codemap import CodeMap
from binlens.analysis.refs.xrefs import pointers_in_data
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "deadcode.c"
A64 = "aarch64-linux-gnu"
NO_UNWIND = ("-fno-asynchronous-unwind-tables", "-fno-unwind-tables")


def _cc(triple: str | None) -> str:
    cc = f"{triple}-gcc" if triple else (shutil.which("cc") or "gcc")
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed" + (f" (Debian package gcc-{triple})" if triple else ""))
    return cc


def _build(out: Path, triple: str | None, opt: str, pie: bool, magic: int = 0) -> tuple[Path, Path]:
    """(unstripped, stripped of symbols and of `.eh_frame`) builds of the fixture."""
    exe = out / f"{triple or 'native'}{opt}{'pie' if pie else 'nopie'}{magic:x}"
    args = [_cc(triple), opt, f"-DMAGIC={magic:#x}UL", *NO_UNWIND, "-o", str(exe), str(SRC)]
    args += ["-fPIE", "-pie"] if pie else ["-fno-pie", "-no-pie"]
    subprocess.run(args, check=True, capture_output=True)
    strip = f"{triple}-strip" if triple else "strip"
    stripped = exe.with_suffix(".stripped")
    subprocess.run([strip, "-s", "-R", ".eh_frame", "-R", ".eh_frame_hdr", "-o", str(stripped), str(exe)], check=True)
    return exe, stripped


def _functions(path: Path) -> dict[str, int]:
    return {s.name: s.address for s in parse_path(str(path)).symbols if s.kind == "function" and s.address}


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_aarch64_functions_nothing_calls_are_found_without_unwind_tables(tmp_path, opt):
    exe, stripped = _build(tmp_path, A64, opt, pie=True)
    truth = _functions(exe)
    analysis = analyze(parse_path(str(stripped)))
    found = {f.address: f for f in analysis.functions if not f.thunk_name}
    dead = ["unused_leaf", "unused_popcount", "unused_loop", "unused_caller"]
    missing = {n: hex(truth[n]) for n in dead if truth[n] not in found}
    assert not missing, f"dead functions not found: {missing}"
    # each is a whole function: it ends where the next symbol's function begins, no later start inside
    for name in dead:
        f = found[truth[name]]
        inside = [hex(a) for a in found if f.address < a < f.address + f.size]
        assert not inside, f"{name}: starts inside it {inside}"
    starts = set(truth.values())
    false = sorted(hex(a) for a in found if a not in starts)
    assert not false, f"function starts that are not functions: {false}"


@pytest.mark.parametrize("triple", [None, A64, "mipsel-linux-gnu"], ids=["x86-64", "aarch64", "mips"])
def test_a_number_equal_to_a_code_address_is_a_pointer_only_where_relocated(tmp_path, triple):
    for pie in (True, False):
        probe, _ = _build(tmp_path, triple, "-O2", pie)
        target = _functions(probe)["unused_loop"]
        exe, stripped = _build(tmp_path, triple, "-O2", pie, magic=target)
        assert _functions(exe)["unused_loop"] == target  # the number moved no code
        image = parse_path(str(exe))
        symbols = {s.name: s.address for s in image.symbols}
        pointers = dict(pointers_in_data(image, CodeMap(image), set()))
        assert pointers.get(symbols["callback"]) == symbols["live"]  # a relocated (or absolute) pointer
        # the number: a pointer to unused_loop only in the fixed-address build
        assert (symbols["magic"] in pointers) is (not pie), (pie, sorted(map(hex, pointers)))
