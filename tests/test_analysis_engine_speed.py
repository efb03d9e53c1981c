"""The engine's fast paths give the same answers as the straightforward ones they replace."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from binlens.analysis import analyze
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode.x86 import X86Backend
from binlens.analysis.engine import gc_paused
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
    from binlens.analysis.heuristics import gapmap

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
    from binlens.analysis.discovery.explorer import Explorer
    from binlens.analysis.discovery.functions import iter_functions
    from binlens.analysis.intervals import IntervalSet

    image = parse_path(str(compile_c("sample.c", "-O2", True)))
    codemap = CodeMap(image)
    explorer = Explorer(codemap, X86Backend(image, codemap), None)
    bodies, new = explorer.partition(set(), {}, IntervalSet([]), set())
    assert bodies == {} and new == set()
    assert list(iter_functions(image, codemap, explorer, bodies, {}, {}, {}, set(), consume=True)) == []


def _check_partition_turns(path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Analyse `path`; every partition that grows the starts by tail calls must give the bodies and
    the added starts of a fresh partitioner that is called again after each turn. The most turns
    that added starts in one call."""
    from binlens.analysis.discovery import partition

    kept = partition.Partitioner.run
    most = [0]

    def view(bodies):  # type: ignore[no-untyped-def]
        return {f: (b.chunks, b.edges, b.calls, b.tails, b.has_ret, b.open_end) for f, b in bodies.items()}

    def checked(self, ex, starts, extents, fragments, noret, dirty, accept=None):  # type: ignore[no-untyped-def]
        got, grown = kept(self, ex, starts, extents, fragments, noret, dirty, accept)
        if accept is None:
            return got, grown
        fresh, current, added, turns = partition.Partitioner(), set(starts), set(), 0
        while True:  # the straightforward loop: a whole partition per turn
            want, found = kept(fresh, ex, set(current), extents, fragments, noret, set())
            new = {s for s in found if s not in current and accept(s)}
            if not new:
                break
            current |= new
            added |= new
            turns += 1
        assert grown == added
        assert view(got) == view(want)
        most[0] = max(most[0], turns)
        return got, grown

    monkeypatch.setattr(partition.Partitioner, "run", checked)
    assert analyze(parse_path(str(path))).functions
    return most[0]


def test_partition_turns_equal_a_fresh_partition_per_turn(compile_c, monkeypatch):
    """Tail-call starts are added turn by turn inside one partition call, each turn walking only
    the bodies its new starts change; the result must be what whole partitions give."""
    extra = ("-fno-asynchronous-unwind-tables", "-fno-unwind-tables")
    assert _check_partition_turns(compile_c("nounwind.c", "-O2", True, strip=True, extra=extra), monkeypatch) > 0
    # four turns: t1 .. t4 each become a start only after the one before
    path = compile_c("tail_chain.S", "-O2", False, strip=True)
    assert _check_partition_turns(path, monkeypatch) == 4
    links = {s.address for s in parse_path(str(compile_c("tail_chain.S", "-O2", False))).symbols if s.name[:1] == "t"}
    tails = {f.address for f in analyze(parse_path(str(path))).functions if f.sources == ("tail_call",)}
    assert len(links) == 4 and links <= tails


def test_partition_turns_on_a_stripped_arm64_mach_o(monkeypatch):
    """An arm64 Mach-O whose tail-call starts come in over up to four turns (the armv7 `BatteryLife`
    has the most, 200 turns a round, but a fresh partition per turn would make the test slow)."""
    path = corpus_dir("mach0") / "TrollStore"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert _check_partition_turns(path, monkeypatch) > 0
