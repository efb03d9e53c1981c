"""The engine's fast paths give the same answers as the straightforward ones they replace."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.analysis.codemap import CodeMap
from binlens.analysis.engine import gc_paused
from binlens.analysis.x86 import X86Backend
from binlens.loader.parse_lief import parse_path
from conftest import corpus_dir


def _sweep(path: Path, misaligned_first: bool) -> None:
    """Decode every region chunk by chunk with the fast and the exact decoder; all must agree."""
    image = parse_path(str(path))
    fast_map, exact_map = CodeMap(image), CodeMap(image)
    fast, exact = X86Backend(image, fast_map), X86Backend(image, exact_map)
    checked = 0
    for rf, rx in zip(fast_map.regions, exact_map.regions, strict=True):
        if misaligned_first:
            # code decoded from odd offsets first: the aligned sweep then overlaps it (the slow path)
            for va in range(rf.va + 1, min(rf.end, rf.va + 4096), 97):
                assert fast.decode_chunk(va) == exact.decode_chunk_exact(va)
        va = rf.va
        while va < rf.end:
            got = fast.decode_chunk(va)
            want = exact.decode_chunk_exact(va)
            assert got == want, hex(va)
            checked += 1
            va = got[0] if got is not None and got[0] > va else va + 1
        assert rf.state == rx.state
    assert checked > 50
    assert (fast.x_src, fast.x_dst, fast.x_kind) == (exact.x_src, exact.x_dst, exact.x_kind)


@pytest.mark.parametrize("opt,pie,misaligned", [("-O2", True, False), ("-O0", False, True)])
def test_fast_chunk_decoder_matches_the_exact_one(compile_c, opt, pie, misaligned):
    _sweep(compile_c("sample.c", opt, pie), misaligned)


@pytest.mark.parametrize("name", ["test_gcc_7.2.0_32.out", "test_msvc_1900_32.exe", "test_msvc_1700_64.exe"])
def test_fast_chunk_decoder_matches_on_32_bit_pic_and_pe_code(name):
    path = corpus_dir("jmptbl") / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    _sweep(path, True)


def test_garbage_collector_is_paused_during_analysis_and_restored(compile_c):
    path = compile_c("sample.c", "-O2", True)
    seen: list[bool] = []
    assert gc.isenabled()
    analyze(parse_path(str(path)), progress=lambda done, total, msg: seen.append(gc.isenabled()))
    assert seen and not any(seen)
    assert gc.isenabled()
    with gc_paused():  # nested pauses keep it off until the outermost ends
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        analyze(parse_path(str(path)))
        assert not gc.isenabled()  # a collector the caller turned off stays off
    finally:
        gc.enable()


def test_analysis_raising_from_progress_restores_the_collector(compile_c):
    path = compile_c("sample.c", "-O0", False)

    def cancel(done: float, total: float | None, msg: str | None) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        analyze(parse_path(str(path)), progress=cancel)
    assert gc.isenabled()


def _check_gap_rounds(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Analyse `path`, checking each round's kept coverage map against a full rebuild."""
    from binlens.analysis import gapmap

    rounds: list[int] = []
    kept = gapmap.Gaps.covered

    def checked(self, bodies):  # type: ignore[no-untyped-def]
        got = kept(self, bodies)
        assert got == gapmap.covered_maps(self.codemap, self.explorer, bodies)
        rounds.append(sum(m.count(1) for m in got.values()))
        return got

    monkeypatch.setattr(gapmap.Gaps, "covered", checked)
    result = analyze(parse_path(str(path)))
    assert result.covered_bytes > 0
    return rounds


@pytest.mark.parametrize("opt,pie,least", [("-O0", False, 2), ("-O2", True, 1)])
def test_incremental_gap_coverage_equals_a_full_recount(compile_c, monkeypatch, opt, pie, least):
    """Without unwind info the gap heuristic runs one or more rounds; its kept map must match a
    rebuild each time (the -O2 build now needs one round: its trials leave sub-gaps on a work list
    and the code-offset heuristic finds its callbacks first; -O0 and the MSVC test below run several)."""
    extra = ("-fno-asynchronous-unwind-tables", "-fno-unwind-tables")
    rounds = _check_gap_rounds(compile_c("nounwind.c", opt, pie, strip=True, extra=extra), monkeypatch)
    assert len(rounds) >= least and rounds[-1] > 0


def test_incremental_gap_coverage_through_changed_bodies_and_splits(monkeypatch):
    """An MSVC x86 program without unwind data: 7 rounds (14 before a round took every function
    laid out after one it found), hundreds of recomputed bodies and splits."""
    path = corpus_dir("jmptbl") / "test_msvc_1900_32.exe"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    rounds = _check_gap_rounds(path, monkeypatch)
    assert len(rounds) >= 5 and rounds == sorted(rounds)


def test_partition_and_functions_with_no_starts(compile_c):
    """No function starts at all (a damaged file): empty results, not an error."""
    from binlens.analysis.discovery import Explorer, FragmentIndex
    from binlens.analysis.functions import build_functions

    image = parse_path(str(compile_c("sample.c", "-O2", True)))
    codemap = CodeMap(image)
    explorer = Explorer(codemap, X86Backend(image, codemap), None)
    bodies, new = explorer.partition(set(), {}, FragmentIndex([]), set())
    assert bodies == {} and new == set()
    assert build_functions(image, codemap, explorer, bodies, {}, {}, {}, set(), consume=True) == []
