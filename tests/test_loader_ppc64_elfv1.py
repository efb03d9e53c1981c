"""PowerPC64 ELFv1: function symbols, exports and the entry point name descriptors in `.opd`.

`tests/fixtures/src/elfv1.c` is built big-endian for the ELFv1 ABI with Debian's powerpc64le gcc
(`-mbig-endian -mabi=elfv1`, freestanding: there is no big-endian libc here). The truth is
objdump's view of the unstripped build: the code of each function as `.name`, the linker's call
stubs as `*.plt_call.name`. binlens must put each function's name on its code (not on the data
of its descriptor), find the functions only a descriptor names once the symbols are stripped,
name the call stub after the import it loads, and start the executable at `_start`'s code.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "elfv1.c"
GCC = "powerpc64le-linux-gnu-gcc"
FLAGS = ["-mbig-endian", "-mabi=elfv1", "-O2", "-fPIC", "-nostdlib"]


@pytest.fixture(scope="module")
def elfv1(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which(GCC) is None:
        pytest.skip(f"{GCC} missing (Debian package gcc-powerpc64le-linux-gnu)")
    out = tmp_path_factory.mktemp("elfv1")
    paths = {"so": out / "v1.so", "exe": out / "v1.exe"}
    try:
        subprocess.run([GCC, *FLAGS, "-shared", "-o", paths["so"], SRC], check=True, capture_output=True)
        subprocess.run([GCC, *FLAGS, "-static", "-o", paths["exe"], SRC], check=True, capture_output=True)
    except subprocess.CalledProcessError as err:
        pytest.skip(f"this toolchain cannot build big-endian ELFv1: {err.stderr.decode(errors='replace')[:200]}")
    paths["so.stripped"] = out / "v1.stripped.so"
    strip = ["powerpc64le-linux-gnu-strip", "-s", "-o", paths["so.stripped"], paths["so"]]
    subprocess.run(strip, check=True, capture_output=True)
    return paths


def _objdump(path: Path) -> tuple[dict[str, int], dict[int, str]]:
    """(`.name` code symbols -> address, call stub address -> import name) from objdump -d."""
    text = subprocess.run(["powerpc64le-linux-gnu-objdump", "-d", str(path)], capture_output=True, text=True).stdout
    code = {n: int(a, 16) for a, n in re.findall(r"^([0-9a-f]+) <\.(\w+)>:", text, re.M)}
    stubs = {int(a, 16): n for a, n in re.findall(r"^([0-9a-f]+) <[0-9a-f]+\.plt_call\.(\w+)>:", text, re.M)}
    return code, stubs


def test_symbols_name_the_code_their_descriptors_describe(elfv1: dict[str, Path]) -> None:
    code, _stubs = _objdump(elfv1["so"])
    assert {"helper", "hidden", "api_entry"} <= set(code)
    image = parse_path(str(elfv1["so"]))
    opd = next(s for s in image.sections if s.name == ".opd")
    functions = {s.name: s.address for s in image.symbols if s.kind == "function"}
    assert {n: functions[n] for n in ("helper", "hidden", "api_entry")} == {
        n: code[n] for n in ("helper", "hidden", "api_entry")
    }
    assert not [n for n, a in functions.items() if opd.va <= a < opd.va + opd.size]
    exports = {e.name: e.address for e in image.exports}
    assert exports["helper"] == code["helper"] and exports["api_entry"] == code["api_entry"]


def test_stripped_functions_are_found_named_and_stubs_are_thunks(elfv1: dict[str, Path]) -> None:
    code, stubs = _objdump(elfv1["so"])
    assert "helper" in stubs.values()  # the build shows the case: a call through the PLT
    found = {f.address: f for f in analyze(parse_path(str(elfv1["so.stripped"]))).functions}
    assert {code[n] for n in ("helper", "hidden", "api_entry")} <= set(found)
    assert found[code["helper"]].symbol_name == "helper" and found[code["api_entry"]].symbol_name == "api_entry"
    assert "pointer" in found[code["hidden"]].sources  # only its descriptor names it
    assert {va: found[va].thunk_name for va in stubs if va in found} == stubs


def test_executable_entry_is_the_code_of_start(elfv1: dict[str, Path]) -> None:
    code, _stubs = _objdump(elfv1["exe"])
    image = parse_path(str(elfv1["exe"]))
    assert image.identity.entry == code["_start"]
    found = {f.address: f for f in analyze(image).functions}
    assert "entry" in found[code["_start"]].sources
