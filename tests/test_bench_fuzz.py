"""The mutation fuzzer (bench/fuzz.py): reproducible format-aware mutants, and a runner that tells
ok, clean errors, crashes, hangs and out-of-memory ends apart in real child processes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import CORPUS, ROOT

BENCH = ROOT / "bench"


def _load(name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


fuzz_mutate = _load("fuzz_mutate")

# One corpus file of each format (the fixture build stands in for ELF when the corpus is absent).
_CORPUS_SAMPLES = {
    "pe": "pe/duphead.exe",
    "macho": "mach0/mach0_2-x86_64",
    "fat": "mach0/fat-intel",
    "elf": "elf/analysis/hello-linux-i386nold",
}
# Fields each format's layout must offer the mutator.
_EXPECTED_FIELDS = {
    "elf": ("e_phoff", "e_shnum", "phdr[0].p_offset", "phdr[0].p_filesz", "shdr[1].sh_offset", "shdr[1].sh_size"),
    "pe": ("dos.e_lfanew", "coff.NumberOfSections", "opt.SizeOfHeaders", "dir.IMPORT.Size", "section[0].VirtualSize"),
    "macho": ("header.ncmds", "header.sizeofcmds", "lc[0].cmdsize", ".segment.fileoff", ".section[0].offset"),
    "fat": ("fat.nfat_arch", "fat.arch[0].offset", "fat.arch[0].size", "fat.arch[1].align"),
}


def _source(fmt: str, compile_c: Callable[..., Path]) -> bytes:
    path = CORPUS / _CORPUS_SAMPLES[fmt]
    if path.is_file():
        return path.read_bytes()
    if fmt == "elf":
        return compile_c("sample.c").read_bytes()
    pytest.skip(f"corpus file {path} is absent")


def _names(data: bytes, fmt: str) -> list[str]:
    if fmt == "elf":
        return [f.name for f in fuzz_mutate.elf_layout(data).fields]
    if fmt == "pe":
        return [f.name for f in fuzz_mutate.pe_layout(data).fields]
    if fmt == "macho":
        return [f.name for f in fuzz_mutate.macho_layout(data).fields]
    return [f.name for f in fuzz_mutate.fat_layout(data)[0].fields]


@pytest.mark.parametrize("fmt", fuzz_mutate.FORMATS)
def test_mutants_are_reproducible_differ_and_keep_their_format(fmt: str, compile_c: Callable[..., Path]) -> None:
    src = _source(fmt, compile_c)
    assert fuzz_mutate.detect_format(src) == fmt
    names = _names(src, fmt)
    for want in _EXPECTED_FIELDS[fmt]:
        assert any(want in n for n in names), (want, names[:40])
    magic = 2 if fmt == "pe" else 4
    seen, ops = set(), []
    for index in range(60):
        m = fuzz_mutate.mutate(src, 7, index)
        again = fuzz_mutate.mutate(src, 7, index)
        assert again.data == m.data and again.ops == m.ops  # mutant i of seed s is always the same bytes
        assert isinstance(m.data, bytes) and m.data != src and m.ops
        assert len(m.data) >= 8 and m.data[:magic] == src[:magic]  # still this format's magic: its parser sees it
        seen.add(m.data)
        ops += m.ops
    assert len(seen) >= 55  # different indices, different mutants
    assert fuzz_mutate.mutate(src, 8, 0).data != fuzz_mutate.mutate(src, 7, 0).data or (
        fuzz_mutate.mutate(src, 8, 1).data != fuzz_mutate.mutate(src, 7, 1).data
    )
    assert any(op.startswith("truncated") for op in ops)
    assert any(op.startswith("bytes flipped") for op in ops)
    assert any("->" in op and not op.startswith("truncated") for op in ops)  # header fields set
    if fmt == "fat":
        assert any(op.startswith("slice@") for op in ops)  # a slice's own Mach-O header and load commands


def test_detect_format_refuses_java_class_files() -> None:
    java = b"\xca\xfe\xba\xbe\x00\x00\x00\x34" + bytes(64)  # cafebabe, major version 52
    assert fuzz_mutate.detect_format(java) is None
    with pytest.raises(ValueError):
        fuzz_mutate.mutate(java, 1, 0)


# ------------------------------------------------------------------------------------ the runner
@pytest.fixture()
def elf_corpus(tmp_path: Path, compile_c: Callable[..., Path]) -> Path:
    """A corpus folder holding one fixture ELF build (tmp, not the repository)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "sample").write_bytes(compile_c("sample.c").read_bytes())
    return folder


def _fuzz(tmp_path: Path, corpus: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp_path / "summary.json"
    cmd = [sys.executable, str(BENCH / "fuzz.py"), "--corpus", str(corpus), "--formats", "elf"]
    cmd += ["--out", str(out), "--keep-dir", str(tmp_path / "keep"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.is_file(), proc.stderr
    return proc, json.loads(out.read_text())


def test_small_run_classifies_every_mutant_and_writes_the_summary(tmp_path: Path, elf_corpus: Path) -> None:
    proc, summary = _fuzz(tmp_path, elf_corpus, "--count", "6", "--jobs", "2", "--seed", "3")
    mutants = summary["mutants"]
    assert [m["index"] for m in mutants] == list(range(6))
    for m in mutants:
        assert m["outcome"] in ("ok", "error", "crash", "hang", "oom")
        assert m["rss_kib"] > 10_000 and m["seconds"] > 0 and m["ops"] and m["source"] == "sample"
        if m["outcome"] == "error":
            assert m["code"] and m["code"] != "internal"
    counts = summary["by_format"]["all"]
    assert counts["mutants"] == 6 and counts["rss_kib"]["max"] == max(m["rss_kib"] for m in mutants)
    failed = counts["crashes"] + counts["hangs"]
    assert proc.returncode == (1 if failed else 0), proc.stderr
    assert "| **all** | 6 |" in proc.stdout and summary["meta"]["commit"] in proc.stdout
    assert summary["meta"]["seed"] == 3 and summary["meta"]["date"]
    # only failing mutants are kept
    kept = sorted(p.name for p in (tmp_path / "keep").glob("*.bin")) if (tmp_path / "keep").exists() else []
    assert len(kept) == sum(m["outcome"] in ("crash", "hang", "oom") for m in mutants)


@pytest.mark.parametrize(
    ("hook", "outcome", "code"),
    [("raise", "crash", "RuntimeError"), ("exit", "crash", "exit 70"), ("oom", "oom", "MemoryError")],
)
def test_a_failing_child_is_reported_and_kept(
    tmp_path: Path, elf_corpus: Path, hook: str, outcome: str, code: str
) -> None:
    proc, summary = _fuzz(tmp_path, elf_corpus, "--count", "1", "--seed", "4", "--mem", "1024", "--test-hook", hook)
    (m,) = summary["mutants"]
    assert (m["outcome"], m["code"]) == (outcome, code), m
    assert proc.returncode == (1 if outcome == "crash" else 0)
    assert (tmp_path / "keep" / "s4-i0-elf.bin").is_file() and m["kept"].endswith("s4-i0-elf.bin")
    record = json.loads((tmp_path / "keep" / "s4-i0-elf.json").read_text())
    assert record["index"] == 0 and record["outcome"] == outcome
    if hook == "raise":
        assert "RuntimeError: fuzz test hook" in (m["where"] or ""), m


def test_a_hung_child_is_killed_with_everything_it_started(tmp_path: Path, elf_corpus: Path) -> None:
    proc, summary = _fuzz(tmp_path, elf_corpus, "--count", "1", "--timeout", "3", "--test-hook", "hang")
    (m,) = summary["mutants"]
    assert m["outcome"] == "hang" and m["exit"] == "killed (time limit)", m
    assert 3 <= m["seconds"] < 60
    assert proc.returncode == 1
