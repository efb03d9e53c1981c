"""`main` from the entry code (docs/COMPARE.md, "Signatures"): i386 position-independent entry code
(the GOT register), MIPS (`$gp`, `lw $a0` / `lw $t9; jalr $t9`), and PE C runtimes (mingw's
`__tmainCRTStartup` in the corpus, whose symbols give the truth). The ELF binaries are compiled
here by the cross toolchains and stripped; the truth is the unstripped build's `main`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.api import invoke
from conftest import FIXTURE_SRC, corpus_dir


def _main_symbol(path: Path) -> int:
    for line in subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "T" and parts[2] in ("main", "_main"):
            return int(parts[0], 16)
    raise AssertionError(f"no main in {path}")


def _cross(build_dir: Path, cc: str, tag: str, *flags: str) -> tuple[Path, Path]:
    """(unstripped, stripped) build of cmp_v2.c by a cross compiler, or skip."""
    if shutil.which(cc) is None:
        pytest.skip(f"no {cc}")
    out = build_dir / f"main_{tag}"
    stripped = build_dir / f"main_{tag}-stripped"
    if not stripped.exists():
        subprocess.run([cc, "-O2", *flags, "-o", str(out), str(FIXTURE_SRC / "cmp_v2.c")], check=True)
        strip = shutil.which(cc.replace("-gcc", "-strip")) or "strip"
        subprocess.run([strip, "-s", "-o", str(stripped), str(out)], check=True)
    return out, stripped


def _found_main(workspace, path: Path) -> tuple[int, str] | None:
    from binlens.api.signature import find_main
    from binlens.jobs.state import analysis_of

    prog = workspace.open(path)
    return find_main(prog, analysis_of(prog).require(None, timeout_s=300))


@pytest.mark.parametrize(
    ("cc", "tag", "flags"),
    [
        ("i686-linux-gnu-gcc", "i386_pie", ("-fPIE", "-pie")),
        ("i686-linux-gnu-gcc", "i386_nopie", ("-no-pie",)),
        ("mips-linux-gnu-gcc", "mips_pie", ("-fPIE", "-pie")),
        ("mips-linux-gnu-gcc", "mips_nopie", ("-no-pie",)),
    ],
)
def test_main_from_position_independent_and_fixed_entry_code(workspace, build_dir, cc, tag, flags):
    truth, stripped = _cross(build_dir, cc, tag, *flags)
    assert _found_main(workspace, stripped) == (_main_symbol(truth), "main")


def test_signature_apply_names_main_of_a_stripped_i386_pie(workspace, build_dir):
    truth, stripped = _cross(build_dir, "i686-linux-gnu-gcc", "i386_pie", "-fPIE", "-pie")
    other, _ = _cross(build_dir, "mips-linux-gnu-gcc", "mips_pie", "-fPIE", "-pie")  # names nothing of it
    prog = workspace.open(stripped)
    r = invoke(workspace, "signature.apply", {"program": prog.handle, "references": [{"path": str(other)}]})
    mains = [n for n in r["named"] if n["name"] == "main"]
    assert mains == [
        {"address": hex(_main_symbol(truth)), "name": "main", "score": 1.0, "reference": stripped.name, "step": "entry"}
    ]


_PE_SAMPLES = ("a2.exe", "b.exe", "base.exe", "c.exe", "hello_world_not_stripped.exe", "vista-glass.exe")


@pytest.mark.parametrize("name", [*_PE_SAMPLES, "hex_search.exe"])
def test_main_of_mingw_executables_from_the_c_runtime_start(workspace, name):
    """mingw i386 and x86-64 builds (console and GUI, whose `main` calls WinMain): their symbols say
    where `main` is."""
    path = corpus_dir("pe") / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert _found_main(workspace, path) == (_main_symbol(path), "main")
