"""Fingerprints of PIC and non-PIC builds of the same code agree (docs/COMPARE.md, "Fingerprints"):
a -fPIC shared library loads an address with `lea r, [rip+X]` and reaches its own export through a
far PLT `jmp`, the non-PIC static executable with `mov r32, X` and a short `jmp` to the function
next door. tests/fixtures/src/pic_pair.c, built both ways here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.api import invoke
from conftest import FIXTURE_SRC


@pytest.fixture(scope="module")
def pair(build_dir: Path) -> dict[str, Path]:
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("no gcc")
    src = str(FIXTURE_SRC / "pic_pair.c")
    out = {"lib": build_dir / "libpicpair.so", "exe": build_dir / "picpair-static"}
    if not out["lib"].exists():
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out["lib"]), src], check=True)
    if not out["exe"].exists():
        try:
            args = [cc, "-O2", "-fno-pie", "-no-pie", "-static", "-DWITH_MAIN", "-o", str(out["exe"]), src]
            subprocess.run(args, check=True, capture_output=True)
        except subprocess.CalledProcessError:
            pytest.skip("no static C library (libc.a) to link against")
    out["exe_s"] = build_dir / "picpair-static-stripped"
    if not out["exe_s"].exists():
        subprocess.run(["strip", "-s", "-o", str(out["exe_s"]), str(out["exe"])], check=True)
    return out


def _code(path: Path, name: str) -> str:
    text = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return text.split(f"<{name}>:\n", 1)[1].split("\n\n", 1)[0]


def _symbol(path: Path, name: str) -> int:
    for line in subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise AssertionError(name)


def test_pic_and_non_pic_builds_fingerprint_alike(workspace, pair):
    # the two spellings this is about are really there
    assert "lea " in _code(pair["lib"], "pair_version") and "mov    $0x" in _code(pair["exe"], "pair_version")
    assert "\teb " in _code(pair["exe"], "scale_by_one") and "\te9 " in _code(pair["lib"], "scale_by_one")
    lib, exe = workspace.open(pair["lib"]), workspace.open(pair["exe"])
    for name in ("pair_version", "scale_by_one"):
        got = [
            invoke(workspace, "compare.fingerprints", {"program": p.handle, "selector": {"name": name}})["functions"][0]
            for p in (lib, exe)
        ]
        assert got[0]["exact"] == got[1]["exact"], name


def test_signature_apply_names_small_pic_functions_in_a_static_executable(workspace, pair):
    prog = workspace.open(pair["exe_s"])
    r = invoke(workspace, "signature.apply", {"program": prog.handle, "references": [{"path": str(pair["lib"])}]})
    named = {n["name"]: int(n["address"], 16) for n in r["named"]}
    for name in ("pair_version", "scale_by_one", "main"):
        assert named.get(name) == _symbol(pair["exe"], name), (name, r["named"])
