"""PLT thunks named after their import on RISC-V and ARM (x86 and AArch64: `test_analysis_engine.py`).

`tests/fixtures/src/plt_exit.c` calls `puts` and `exit` through the PLT. Cross-compiled with the
Debian gcc and its libc (PIE, stripped): each PLT entry must be a function named after its import
(the truth is the unstripped build's `name@plt` view in `objdump -d`), and the thunk of `exit`
must be known not to return, so the call to it ends its block (the code after it is not the
fall-through of the call).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "plt_exit.c"
TRIPLES = {"riscv64-linux-gnu": (), "arm-linux-gnueabihf": ("-marm",), "arm-linux-gnueabihf-thumb": ("-mthumb",)}


@pytest.fixture(scope="session")
def plt_build(tmp_path_factory: pytest.TempPathFactory):
    """plt_build(key) -> (unstripped, stripped) of the fixture for TRIPLES[key] (cached)."""
    out_dir = tmp_path_factory.mktemp("pltcross")
    cache: dict[str, tuple[Path, Path]] = {}

    def build(key: str) -> tuple[Path, Path]:
        if key not in cache:
            triple = key.removesuffix("-thumb")
            gcc = shutil.which(f"{triple}-gcc")
            if gcc is None or not Path(f"/usr/{triple}/lib").is_dir():
                pytest.skip(f"{triple}-gcc or its libc is missing (Debian packages gcc-{triple}, libc6-dev-*-cross)")
            exe, stripped = out_dir / key, out_dir / f"{key}.stripped"
            flags = ["-O2", "-fPIE", "-pie", *TRIPLES[key]]
            subprocess.run([gcc, *flags, "-o", exe, SRC], check=True, capture_output=True)
            subprocess.run([f"{triple}-strip", "-s", "-o", stripped, exe], check=True, capture_output=True)
            cache[key] = (exe, stripped)
        return cache[key]

    return build


def _plt_entries(exe: Path, triple: str) -> dict[int, str]:
    """`name@plt` -> address, from the unstripped build's disassembly."""
    text = subprocess.run([f"{triple}-objdump", "-d", "-j", ".plt", str(exe)], capture_output=True, text=True).stdout
    return {int(a, 16): n for a, n in re.findall(r"^([0-9a-f]+) <(\w+)@plt>:", text, re.M)}


@pytest.mark.parametrize("key", list(TRIPLES))
def test_plt_thunks_carry_their_import_names(plt_build, key):
    exe, stripped = plt_build(key)
    entries = _plt_entries(exe, key.removesuffix("-thumb"))
    assert {"puts", "exit"} <= set(entries.values()), entries
    functions = {f.address: f for f in analyze(parse_path(str(stripped))).functions}
    named = {va: functions[va].thunk_name for va in entries if va in functions}
    assert named == entries, {hex(va): (n, named.get(va)) for va, n in entries.items() if named.get(va) != n}
    (exit_thunk,) = (va for va, n in entries.items() if n == "exit")
    assert functions[exit_thunk].noreturn
    image = parse_path(str(exe))
    checked = next(s.address & ~1 for s in image.symbols if s.name == "checked")
    f = functions[checked]
    calls = [site for site, callee in f.calls if callee == exit_thunk]
    assert calls, "checked does not call exit's thunk"
    (block,) = (b for b in f.blocks if b.start <= calls[0] < b.end)
    assert not [e for e in f.edges if e.src == block.start], "the call to exit falls through"
