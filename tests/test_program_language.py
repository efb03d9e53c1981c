"""program_language.get: Ghidra's language id and compiler spec id of binaries built here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError
from conftest import corpus_dir

SOURCE = "void _start(void) { for (;;); }\n"

# (compiler command, output kind, expected language id, expected compiler spec id)
BUILDS = [
    (["cc", "-m32", "-nostdlib", "-static"], "exe", "x86:LE:32:default", "gcc"),
    (["aarch64-linux-gnu-gcc", "-nostdlib", "-static"], "exe", "AARCH64:LE:64:v8A", "default"),
    (["arm-linux-gnueabihf-gcc", "-marm", "-nostdlib", "-static"], "exe", "ARM:LE:32:v8", "default"),
    (["arm-linux-gnueabihf-gcc", "-mthumb", "-nostdlib", "-static"], "exe", "ARM:LE:32:v8T", "default"),
    (["clang", "--target=mips-linux-gnu"], "obj", "MIPS:BE:32:default", "default"),
    (["clang", "--target=mipsel-linux-gnu"], "obj", "MIPS:LE:32:default", "default"),
    (["clang", "--target=powerpc-linux-gnu"], "obj", "PowerPC:BE:32:default", "default"),
    (["clang", "--target=riscv64-linux-gnu"], "obj", "RISCV:LE:64:RV64GC", "gcc"),
    (["clang", "--target=x86_64-apple-macos"], "obj", "x86:LE:64:default", "gcc"),
    (["clang", "--target=arm64-apple-macos"], "obj", "AARCH64:LE:64:AppleSilicon", "default"),
]


def _build(tmp_path: Path, command: list[str], kind: str) -> Path:
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not installed")
    src = tmp_path / "start.c"
    src.write_text(SOURCE)
    out = tmp_path / ("start.o" if kind == "obj" else "start")
    args = [*command, *(["-c"] if kind == "obj" else []), "-o", str(out), str(src)]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"{' '.join(command)} cannot build here: {done.stderr.strip()[-200:]}")
    return out


def test_native_x86_64_elf_is_x86_le_64_gcc(workspace, compile_c):
    workspace.open(compile_c("sample.c", "-O0"), check_roots=False)
    out = invoke(workspace, "program_language.get", {})
    assert out["language_id"] == "x86:LE:64:default"
    assert out["compiler_spec_id"] == "gcc"
    assert (out["processor"], out["endian"], out["size"], out["variant"]) == ("x86", "LE", 64, "default")
    assert out["program"]["arch"] == "x86-64"


@pytest.mark.parametrize(("command", "kind", "language", "compiler"), BUILDS, ids=[b[2] + "/" + b[1] for b in BUILDS])
def test_cross_built_binaries(workspace, tmp_path, command, kind, language, compiler):
    workspace.open(_build(tmp_path, command, kind), check_roots=False)
    out = invoke(workspace, "program_language.get", {})
    assert (out["language_id"], out["compiler_spec_id"]) == (language, compiler)


def test_pe_from_the_corpus_is_windows(workspace):
    pe = corpus_dir("pe") / "ConsoleApplication1.exe"
    if not pe.is_file():
        pytest.skip(f"{pe} is absent")
    prog = workspace.open(pe, check_roots=False)
    out = invoke(workspace, "program_language.get", {})
    assert out["compiler_spec_id"] == "windows"
    bits = prog.image.identity.bits
    assert out["language_id"] == f"x86:LE:{bits}:default"


def test_unknown_program_handle_is_not_found(workspace, compile_c):
    workspace.open(compile_c("sample.c", "-O0"), check_roots=False)
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "program_language.get", {"program": "nope"})
    assert err.value.code == "not_found"
