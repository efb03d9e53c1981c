"""AArch64 computed gotos and mask-bounded switches: `tests/fixtures/src/dispatch_x86.c` cross-built.

The threaded interpreter's `goto *disptab[op & 15]` is a table of absolute code pointers (`.xword
.Lx`) read by `ldr xT, [xB, xI, lsl #3]; br xT` with an `and` as the only bound (gcc -O0 merges
every dispatch into one shared `br`); clang also compiles `switch (x & 7)` to a relative byte
table bounded by the mask alone. Truth: the table entries in the compiler's assembly, the
labels' addresses from the unstripped build (`as -L`); the engine runs on the build stripped of
symbols and `.eh_frame`, where both functions are reached only through a pointer in data.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "dispatch_x86.c"
BINUTILS = ("aarch64-linux-gnu-as", "aarch64-linux-gnu-ld", "aarch64-linux-gnu-strip")
_LABEL = re.compile(r"^(\.?[A-Za-z_][\w.$]*):")
_ENTRY = re.compile(r"^\s*\.(?:xword|word|hword|byte)\s+\(?(\.L\w+)")


def _build(out: Path, compiler: str, opt: str) -> tuple[str, Path, dict[str, int], dict[str, int]]:
    missing = [t for t in BINUTILS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (Debian package binutils-aarch64-linux-gnu)")
    if compiler == "gcc":
        if shutil.which("aarch64-linux-gnu-gcc") is None:
            pytest.skip("aarch64-linux-gnu-gcc is not installed (Debian package gcc-aarch64-linux-gnu)")
        cc = ["aarch64-linux-gnu-gcc"]
    else:
        if shutil.which("clang") is None:
            pytest.skip("clang is not installed")
        cc = ["clang", "--target=aarch64-linux-gnu", "-fno-addrsig"]
    tag = f"{compiler}{opt}"
    asm, obj, exe, stripped = (out / f"{tag}{ext}" for ext in (".s", ".o", "", ".stripped"))
    subprocess.run([*cc, opt, "-fno-asynchronous-unwind-tables", "-S", "-o", str(asm), str(SRC)], check=True)
    subprocess.run(["aarch64-linux-gnu-as", "-L", "-o", str(obj), str(asm)], check=True)
    subprocess.run(["aarch64-linux-gnu-ld", "-e", "main", "-o", str(exe), str(obj)], check=True)
    subprocess.run(["aarch64-linux-gnu-strip", "-s", "-R", ".eh_frame", "-o", str(stripped), str(exe)], check=True)
    symbols = parse_path(str(exe)).symbols
    return asm.read_text(), stripped, {s.name: s.address for s in symbols}, {s.name: s.size for s in symbols}


def _tables(asm: str) -> list[list[str]]:
    """Each table's entries (their labels), in order."""
    tables: dict[str, list[str]] = {}
    label = ""
    for line in asm.splitlines():
        m = _LABEL.match(line)
        if m:
            label = m.group(1)
            continue
        m = _ENTRY.match(line)
        if m:
            tables.setdefault(label, []).append(m.group(1))
    return list(tables.values())


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_computed_goto_and_mask_tables_resolve(tmp_path, compiler, opt):
    asm, stripped, labels, sizes = _build(tmp_path, compiler, opt)
    analysis = analyze(parse_path(str(stripped)))
    by_start = {f.address: f for f in analysis.functions}
    expected: dict[str, set[int]] = {"interpret": set(), "masked": set()}
    for entries in _tables(asm):
        for label in entries:
            va = labels[label]
            owner = [n for n in expected if labels[n] <= va < labels[n] + sizes[n]]
            assert owner, f"{label} is in neither function"
            expected[owner[0]].add(va)
    assert len(expected["interpret"]) == 16
    if compiler == "clang":
        assert len(expected["masked"]) == 8  # gcc compiles `masked` to a compare tree instead
    for name, want in expected.items():
        f = by_start.get(labels[name])
        assert f is not None, f"{name} was not found"
        got = {e.dst for e in f.edges if e.kind == "jump_table"}
        assert want <= got, (name, sorted(map(hex, want - got)))
        assert not want & set(by_start), f"case labels of {name} taken for functions"
        inside = [a for a in by_start if labels[name] < a < labels[name] + sizes[name]]
        assert not inside, f"false starts inside {name}: {sorted(map(hex, inside))}"


def test_the_builds_exercise_the_shared_br_and_the_mask(tmp_path):
    """gcc -O0 has one `br` for all 16 dispatches; the -O2 builds bound the index with an `and` only."""
    gcc_o0 = _build(tmp_path, "gcc", "-O0")[0].split("\nmasked:", 1)[0]
    assert len(re.findall(r"\tbr\t", gcc_o0)) == 1
    for compiler in ("gcc", "clang"):
        interp = _build(tmp_path, compiler, "-O2")[0].split("\ninterpret:", 1)[1].split("\nmasked:", 1)[0]
        assert re.search(r"\tand\t[wx]\d+, [wx]\d+, #?(15|0xf)\n", interp)
        assert not re.search(r"\tcmp\t[wx]\d+, #?(15|0xf)\n", interp)
