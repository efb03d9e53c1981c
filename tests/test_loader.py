"""Loader acceptance: identity against system tools, corpus formats and arches, fuzzed inputs."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from binlens.errors import BinlensError
from conftest import ROOT, corpus_dir

PE_MACHINES = {0x8664: "x86-64", 0x14C: "x86", 0xAA64: "aarch64", 0x1C0: "arm", 0x1C4: "arm", 0x1C2: "arm"}
MACHO_CPUS = {0x01000007: "x86-64", 7: "x86", 0x0100000C: "aarch64", 12: "arm", 18: "ppc", 0x01000012: "ppc"}


def sha256sum(path: Path) -> str:
    if shutil.which("sha256sum") is None:
        pytest.skip("sha256sum is not installed")
    return subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]


def readelf_facts(path: Path) -> tuple[int, int]:
    """(entry, lowest PT_LOAD vaddr) as readelf prints them."""
    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    head = subprocess.run(["readelf", "-hlW", str(path)], capture_output=True, text=True, check=True).stdout
    entry = int(re.search(r"Entry point address:\s+(0x[0-9a-f]+)", head).group(1), 16)
    loads = [int(m.group(1), 16) for m in re.finditer(r"^\s+LOAD\s+0x[0-9a-f]+\s+(0x[0-9a-f]+)", head, re.M)]
    return entry, min(loads)


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
@pytest.mark.parametrize("pie", [True, False])
def test_elf_identity_matches_sha256sum_and_readelf(workspace, compile_c, opt, pie):
    path = compile_c("sample.c", opt, pie=pie)
    ident = workspace.open(path, check_roots=False).identity
    entry, base = readelf_facts(path)
    assert ident["sha256"] == sha256sum(path)
    assert ident["size"] == path.stat().st_size
    assert (ident["format"], ident["arch"], ident["bits"], ident["endian"]) == ("ELF", "x86-64", 64, "little")
    assert int(ident["entry"], 16) == entry
    assert int(ident["image_base"], 16) == base
    assert ident["file_name"] == path.name


def _pe_machine(data: bytes) -> str | None:
    if len(data) < 0x40 or data[:2] != b"MZ":
        return None
    (lfanew,) = struct.unpack_from("<I", data, 0x3C)
    if lfanew + 6 > len(data) or data[lfanew : lfanew + 4] != b"PE\0\0":
        return None
    (machine,) = struct.unpack_from("<H", data, lfanew + 4)
    return PE_MACHINES.get(machine)


def _macho_cpu(data: bytes) -> str | None:
    magic = data[:4]
    if magic in (b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe"):
        (cpu,) = struct.unpack_from("<I", data, 4)
    elif magic in (b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf"):
        (cpu,) = struct.unpack_from(">I", data, 4)
    else:
        return None
    return MACHO_CPUS.get(cpu)


def _corpus_files(sub: str) -> list[Path]:
    return sorted(p for p in corpus_dir(sub).rglob("*") if p.is_file())


def test_pe_and_macho_identity_matches_sha256sum(workspace):
    pe = next(p for p in _corpus_files("pe") if _pe_machine(p.read_bytes()) == "x86-64")
    macho = next(p for p in _corpus_files("mach0") if _macho_cpu(p.read_bytes()) == "x86-64")
    for path, fmt in ((pe, "PE"), (macho, "MachO")):
        ident = workspace.open(path, check_roots=False).identity
        assert ident["format"] == fmt
        assert ident["sha256"] == sha256sum(path)


@pytest.mark.parametrize(("sub", "fmt", "arch_of"), [("pe", "PE", _pe_machine), ("mach0", "MachO", _macho_cpu)])
def test_corpus_opens_with_right_format_and_arch(workspace, sub, fmt, arch_of):
    """At least 20 files of each format open, and the arch agrees with the header read here."""
    ok = []
    for path in _corpus_files(sub):
        want = arch_of(path.read_bytes())
        if want is None:
            continue
        try:
            ident = workspace.open(path, check_roots=False).identity
        except BinlensError:
            continue
        assert (ident["format"], ident["arch"]) == (fmt, want), path
        ok.append(path)
    assert len(ok) >= 20, f"only {len(ok)} {fmt} files opened"


def test_universal_macho_slices(workspace):
    path = corpus_dir("mach0") / "BatteryLife"
    if not path.exists():
        pytest.skip("BatteryLife is not in the corpus")
    default = workspace.open(path, check_roots=False)
    assert default.image.slices == ["arm", "aarch64"]
    assert default.identity["arch"] == "arm"  # no x86-64 slice: the first one
    arm64 = workspace.open(path, "aarch64", check_roots=False)
    assert arm64.identity["arch"] == "aarch64" and arm64.identity["slice"] == "aarch64"
    assert arm64.identity["sha256"] == default.identity["sha256"]  # identity is the file's bytes
    assert arm64.db.path != default.db.path
    with pytest.raises(BinlensError) as err:
        workspace.open(path, "mips", check_roots=False)
    assert err.value.code == "not_found" and err.value.target == "/params/slice"


FUZZ_SCRIPT = r"""
import json, sys, time
from pathlib import Path
from binlens.workspace import Config, Workspace
from binlens.errors import BinlensError
ws = Workspace(Config(home=Path(sys.argv[1])))
for line in sys.stdin:
    path = line.rstrip("\n")
    t = time.monotonic()
    try:
        ws.open(path, check_roots=False)
        out = "ok"
    except BinlensError as err:
        out = err.code
    print(json.dumps({"path": path, "outcome": out, "seconds": time.monotonic() - t}), flush=True)
print(json.dumps({"done": True}), flush=True)
"""


def test_every_fuzzed_file_ends_in_result_or_clean_error(tmp_path):
    files = _corpus_files("fuzzed")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-c", FUZZ_SCRIPT, str(tmp_path / "home")],
        input="\n".join(map(str, files)) + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(x) for x in proc.stdout.splitlines()]
    assert rows[-1] == {"done": True}
    rows = rows[:-1]
    assert len(rows) == len(files)
    outcomes = {r["outcome"] for r in rows}
    assert outcomes <= {"ok", "invalid_argument", "unsupported", "not_found"}, outcomes
    slow = [r for r in rows if r["seconds"] >= 10]
    assert not slow, slow


def test_unsupported_and_malformed_inputs(workspace, tmp_path):
    cases = {
        "text.txt": (b"hello, this is not a binary\n", "unsupported"),
        "empty": (b"", "invalid_argument"),
        "elf-truncated": (b"\x7fELF\x02\x01\x01" + b"\0" * 9, "invalid_argument"),
        "java.class": (b"\xca\xfe\xba\xbe\x00\x00\x00\x34" + b"\0" * 64, "unsupported"),
    }
    for name, (data, code) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(BinlensError) as err:
            workspace.open(path, check_roots=False)
        assert err.value.code == code, name
    with pytest.raises(BinlensError) as err:
        workspace.open(tmp_path / "missing", check_roots=False)
    assert err.value.code == "not_found" and err.value.target == "/params/path"
