"""ARM32 gap heuristic: where a function found by its push really starts.

`tests/fixtures/src/arm_lead_in.S` (Thumb-2, no unwind tables), built with the ARM cross toolchain
without libc and stripped. The truth is the unstripped build's symbol table.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "arm_lead_in.S"
TOOLS = ("arm-linux-gnueabihf-gcc", "arm-linux-gnueabihf-strip")


def test_gap_starts_skip_pool_padding_and_take_a_two_byte_lead_in(tmp_path: Path) -> None:
    """`log10f` starts at its push, not at the `nop.w` and literal pool before it (whose words decode
    as Thumb code running into the push); `lead` starts at its `cbz`, a two-byte gap left once the
    leaf before it is found, not at the push found first."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (Debian gcc-arm-linux-gnueabihf, binutils-arm-linux-gnueabihf)")
    out, stripped = tmp_path / "lead_in", tmp_path / "lead_in.stripped"
    flags = ["-nostdlib", "-static", "-mfpu=vfpv3-d16", "-mfloat-abi=hard"]
    subprocess.run(["arm-linux-gnueabihf-gcc", *flags, "-o", str(out), str(SRC)], check=True, capture_output=True)
    subprocess.run(["arm-linux-gnueabihf-strip", "-o", str(stripped), str(out)], check=True)
    truth = {s.name: s.address & ~1 for s in parse_path(str(out)).symbols if s.kind == "function"}
    assert set(truth) == {"_start", "deg", "log10f", "tailer", "lead", "last"}
    found = {f.address: f for f in analyze(parse_path(str(stripped))).functions}
    assert set(found) == set(truth.values()), sorted(map(hex, set(found) ^ set(truth.values())))
    for name in ("log10f", "tailer", "lead"):  # reached by nothing: found in gaps
        assert found[truth[name]].sources == ("prologue",) and found[truth[name]].mode == "thumb", name
    # `lead` holds its check: the `cbz` and the `bx lr` it jumps to are its code
    assert found[truth["lead"]].size == truth["last"] - truth["lead"]


LEAF_RUN = Path(__file__).resolve().parent / "fixtures" / "src" / "arm_leaf_run.S"


def test_a_run_of_unreferenced_leaves_is_found_in_one_round(tmp_path: Path) -> None:
    """Twelve leaves nothing calls, laid out one after another with a framed function among them:
    every one is found (by the gap heuristic), each at its first instruction, and the run takes
    one round of the gap stage, not one round per leaf (`heuristic_rounds` counts the rounds that
    found starts)."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (Debian gcc-arm-linux-gnueabihf, binutils-arm-linux-gnueabihf)")
    out, stripped = tmp_path / "leaf_run", tmp_path / "leaf_run.stripped"
    subprocess.run(["arm-linux-gnueabihf-gcc", "-nostdlib", "-static", "-o", str(out), str(LEAF_RUN)], check=True)
    subprocess.run(["arm-linux-gnueabihf-strip", "-o", str(stripped), str(out)], check=True)
    truth = {s.name: s.address & ~1 for s in parse_path(str(out)).symbols if s.kind == "function"}
    assert len(truth) == 15
    result = analyze(parse_path(str(stripped)))
    found = {f.address: f for f in result.functions}
    assert set(found) == set(truth.values()), sorted(map(hex, set(found) ^ set(truth.values())))
    ends = dict(zip(sorted(truth.values()), sorted(truth.values())[1:], strict=False))
    for name, va in truth.items():
        if name.startswith("leaf") or name == "framed":
            assert found[va].sources == ("prologue",) and found[va].mode == "thumb", name
            if va in ends:  # each holds its own code, up to the next one
                assert found[va].size == ends[va] - va, name
    assert result.stats["heuristic_rounds"] <= 2, result.stats
