"""The benchmark's ground-truth reader (bench/elfsyms.py) on cross-compiled ELF32/ELF64, both byte orders.

Each case compiles a tiny program with a Debian cross gcc (skipped when that toolchain is not
installed) and compares elfsyms's answer with binutils' `readelf -s` of the same file.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_elfsyms", Path(__file__).parents[1] / "bench" / "elfsyms.py")
elfsyms = importlib.util.module_from_spec(_spec)
sys.modules["bench_elfsyms"] = elfsyms
_spec.loader.exec_module(elfsyms)

SOURCE = """
int twice(int x) { return 2 * x; }
static int __attribute__((noinline)) thrice(int x) { return 3 * x; }
int main(int argc, char **argv) { (void)argv; return twice(argc) + thrice(argc); }
"""


def _build(tmp_path: Path, triple: str, *flags: str) -> Path:
    gcc = shutil.which(f"{triple}-gcc")
    if gcc is None:
        pytest.skip(f"{triple}-gcc not installed")
    src = tmp_path / "t.c"
    src.write_text(SOURCE)
    out = tmp_path / f"t-{triple}"
    subprocess.run([gcc, "-O1", "-fPIE", "-pie", *flags, str(src), "-o", str(out)], check=True, capture_output=True)
    return out


def _readelf_funcs(path: Path) -> dict[str, int]:
    """name -> st_value of the sized, defined FUNC symbols, as binutils reads them."""
    text = subprocess.run(["readelf", "-sW", str(path)], check=True, capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*\d+:\s+([0-9a-f]+)\s+(\d+)\s+FUNC\s+\w+\s+\w+\s+(\d+)\s+(\S+)", line)
        if m and int(m.group(2)) and m.group(3) != "0":
            out[m.group(4)] = int(m.group(1), 16)
    return out


@pytest.mark.parametrize(
    ("triple", "bits", "order"),
    [
        ("aarch64-linux-gnu", 2, 1),  # ELF64 little-endian
        ("powerpc-linux-gnu", 1, 2),  # ELF32 big-endian
        ("mipsel-linux-gnu", 1, 1),  # ELF32 little-endian
    ],
)
def test_functions_match_readelf(tmp_path: Path, triple: str, bits: int, order: int) -> None:
    path = _build(tmp_path, triple)
    header = path.read_bytes()[:6]
    assert (header[4], header[5]) == (bits, order)
    truth = elfsyms.function_symbols(path)
    expected = _readelf_funcs(path)
    assert {"twice", "thrice", "main"} <= set(expected)
    for name in ("twice", "thrice", "main"):
        assert truth[expected[name]] == name
    assert set(truth) == set(expected.values())


def test_thumb_bit_is_cleared_and_mapping_symbols_ignored(tmp_path: Path) -> None:
    path = _build(tmp_path, "arm-linux-gnueabihf", "-mthumb")
    expected = _readelf_funcs(path)
    assert expected["twice"] & 1 and expected["main"] & 1  # Thumb functions: bit 0 set in st_value
    truth = elfsyms.function_symbols(path)
    for name in ("twice", "thrice", "main"):
        assert truth[expected[name] & ~1] == name
    assert all(a % 2 == 0 for a in truth)
    assert not any(n.startswith("$") for n in truth.values())
    # Size-0 crt functions (the neutral set) are cleared the same way.
    neutral = elfsyms.function_symbols(path, sized=False)
    assert neutral and all(a % 2 == 0 for a in neutral)


def test_powerpc_linker_stubs_in_text(tmp_path: Path) -> None:
    """PowerPC 32 secure-PLT: GNU ld writes the import call stubs into .text as NOTYPE labels; elfsyms
    lists them (for the neutral set) and never as functions."""
    path = _build(tmp_path, "powerpc-linux-gnu")
    stubs = elfsyms.function_symbols(path, stubs=True)
    assert any("plt_pic32.__libc_start_main" in n for n in stubs.values())
    text = [r for r in elfsyms.executable_ranges(path) if r[0] <= min(stubs) < r[1]]
    assert text  # the stubs lie in an executable section
    assert not set(stubs) & set(elfsyms.function_symbols(path))
