"""Function starts in gaps on MIPS, PowerPC and RISC-V, without unwind information.

`tests/fixtures/src/gaps.c` holds functions nothing calls (dead exported functions and `used`
statics, leaves and not) and a helper only they call. It is cross-compiled with the Debian gcc
(PIC and non-PIC, -O0 and -O2), linked with `main` as entry, stripped of its symbols and of
`.eh_frame`; the engine must then find every FUNC symbol of the unstripped build, the ones nothing
calls by the `prologue` heuristic, and no start inside another function.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.analysis.heuristics.prologues import GapPrologues
from binlens.loader.parse_lief import parse_path

SRC = Path(__file__).resolve().parent / "fixtures" / "src" / "gaps.c"
UNCALLED = ("unused_static", "exported_leaf", "exported_caller", "unused_leaf")
# (triple, optimisation, PIC, extra compiler flags)
BUILDS = [
    ("mips-linux-gnu", "-O2", True, ()),
    ("mipsel-linux-gnu", "-O0", True, ()),
    ("mips-linux-gnu", "-O2", False, ("-fno-pic", "-mno-abicalls")),
    ("mips64-linux-gnuabi64", "-O2", True, ()),
    ("powerpc-linux-gnu", "-O2", True, ()),
    ("powerpc-linux-gnu", "-O0", False, ("-fno-pic", "-fno-pie")),
    ("powerpc64le-linux-gnu", "-O2", True, ()),
    ("riscv64-linux-gnu", "-O2", True, ()),
    ("riscv64-linux-gnu", "-O0", False, ("-fno-pic", "-fno-pie")),
]


def _build(out_dir: Path, triple: str, opt: str, pic: bool, extra: tuple[str, ...]) -> xb.Build:
    cc = xb.toolchain("gcc", triple)
    flags = [opt, "-fasynchronous-unwind-tables", *(["-fPIC"] if pic else []), *extra]
    tag = f"gaps-{triple}{opt}-{'pic' if pic else 'nopic'}"
    link = ("-pie",) if pic and not triple.startswith("mips") else ()
    return xb.cross_build(out_dir, triple, cc, flags, tag, src=SRC, ld_flags=link)


gaps_build = xb.build_fixture("gaps", _build)


@pytest.mark.parametrize(
    "triple,opt,pic,extra", BUILDS, ids=[f"{t.split('-')[0]}{o}-{'pic' if p else 'nopic'}" for t, o, p, _ in BUILDS]
)
def test_uncalled_functions_are_found_by_their_prologues(gaps_build, triple, opt, pic, extra):
    """Every function of the build is a start; those nothing calls come from the gap heuristic."""
    b = gaps_build(triple, opt, pic, extra)
    image = parse_path(str(b.exe))
    funcs = {s.name: (s.address, s.size) for s in image.symbols if s.kind == "function" and s.size}
    assert set(UNCALLED) <= set(funcs), f"the build lacks some fixture functions: {sorted(funcs)}"
    analysis = analyze(parse_path(str(b.no_eh)))
    found = {f.address: set(f.sources) for f in analysis.functions}
    missing = sorted(name for name, (va, _n) in funcs.items() if va not in found)
    assert not missing, f"functions not found: {missing}"
    for name in UNCALLED:
        assert "prologue" in found[funcs[name][0]], f"{name}: sources {found[funcs[name][0]]}"
    # a PPC64 ELFv2 function's local entry (8 bytes past its global entry) is where direct calls go
    local = 8 if triple.startswith("powerpc64") else 0
    inside = [(hex(s), name) for s in found for name, (va, n) in funcs.items() if va < s < va + n and s != va + local]
    assert not inside, f"starts inside functions: {inside}"


@pytest.mark.parametrize("triple", ["mips-linux-gnu", "mips64-linux-gnuabi64", "powerpc64le-linux-gnu"])
def test_exact_pic_entries_name_every_pic_function(gaps_build, triple):
    """The `.cpload`/`.cpsetup` and PPC64 global-entry sequences that pass the `_gp`/TOC check are
    exactly the entries of the functions that set up the PIC register (no address inside one)."""
    b = gaps_build(triple, "-O2", True, ())
    image = parse_path(str(b.no_eh))
    from binlens.analysis.codemap import CodeMap
    from binlens.analysis.engine import make_backend

    codemap = CodeMap(image)
    kit = GapPrologues(image, codemap, make_backend(image, codemap))
    exact = kit.exact_entries()
    assert kit.base is not None
    starts = {b.labels[n] for n in (*UNCALLED, "helper", "main") if n in b.labels}
    assert exact, "no exact entry found"
    assert set(exact) <= starts, f"exact entries that are not function starts: {sorted(set(exact) - starts)}"
    # the functions touching globals set up the PIC register; each of them is an exact entry
    for name in ("exported_leaf", "exported_caller", "helper"):
        assert b.labels[name] in exact, f"{name} at {b.labels[name]:#x} is not an exact entry"


@pytest.mark.parametrize(
    "triple,extra",
    [("mipsel-linux-gnu", ()), ("powerpc-linux-gnu", ("-fno-pic", "-fno-pie")), ("riscv64-linux-gnu", ("-fno-pic",))],
)
def test_trials_refuse_the_middle_and_the_end_of_a_function(gaps_build, triple, extra):
    """-O0 code: a whole function allocates its frame and sets its frame pointer; its second half
    frees a frame it did not allocate, and its middle uses a frame pointer it did not set."""
    b = gaps_build(triple, "-O0", not extra, extra)
    image = parse_path(str(b.no_eh))
    from binlens.analysis.codemap import CodeMap
    from binlens.analysis.engine import make_backend

    codemap = CodeMap(image)
    kit = GapPrologues(image, codemap, make_backend(image, codemap))
    va, size = b.labels["exported_caller"], b.sizes["exported_caller"]
    third = (size // 3) & ~3
    whole, second_half, middle = [(va, va + size)], [(va + 2 * third, va + size)], [(va + third, va + 2 * third)]
    assert not kit.epilogue_only(whole) and not kit.borrowed_frame(whole)
    assert kit.epilogue_only(second_half)
    assert kit.borrowed_frame(middle)


@pytest.mark.parametrize(
    "triple,opt,pic,extra",
    [
        ("mips-linux-gnu", "-O2", True, ()),
        ("powerpc-linux-gnu", "-O0", False, ("-fno-pic", "-fno-pie")),
        ("aarch64-linux-gnu", "-O0", True, ()),
        ("riscv64-linux-gnu", "-O2", False, ("-fno-pic",)),
    ],
)
def test_incremental_gap_coverage_equals_a_full_recount(gaps_build, monkeypatch, triple, opt, pic, extra):
    """Every architecture counts the held chunks between gap rounds, only the bodies that changed
    counted again, chunks that overlap others included (MIPS delay slots that start a chunk, code
    entered at a misaligned address): each round's map must equal a rebuild from every body, and
    the analysis must find the same functions."""
    from binlens.analysis.heuristics import gapmap

    b = gaps_build(triple, opt, pic, extra)
    plain = {f.address for f in analyze(parse_path(str(b.no_eh))).functions}
    kept = gapmap.Gaps.covered
    rounds: list[int] = []

    def checked(self, bodies):  # type: ignore[no-untyped-def]
        got = kept(self, bodies)
        rounds.append(len(bodies))
        assert got == gapmap.covered_maps(self.codemap, self.explorer, bodies)
        return got

    monkeypatch.setattr(gapmap.Gaps, "covered", checked)
    checked_run = {f.address for f in analyze(parse_path(str(b.no_eh))).functions}
    assert len(rounds) >= 2, rounds
    assert checked_run == plain


def test_chunks_that_overlap_stay_covered_by_the_other(gaps_build):
    """A MIPS branch's chunk also holds its delay slot, where another chunk may start: when the
    chunk of the slot leaves every body, the round's map must still cover the slot (the branch's
    chunk holds it), as a full recount does."""
    from binlens.analysis.codemap import CodeMap
    from binlens.analysis.discovery.explorer import Body, Explorer
    from binlens.analysis.engine import make_backend
    from binlens.analysis.heuristics import gapmap

    b = gaps_build("mipsel-linux-gnu", "-O0", True, ())
    image = parse_path(str(b.no_eh))
    codemap = CodeMap(image)
    backend = make_backend(image, codemap)
    explorer = Explorer(codemap, backend, None)
    main = b.labels["main"]
    r = codemap.region(main)
    code = bytes(r.data[main - r.va : main - r.va + 256])
    branch = next(a for a, _n, m, _t in backend.lite_md(False).disasm_lite(code, main) if m[:1] in ("b", "j"))
    slot = explorer.chunk(branch + 4)  # the delay slot first, as a chunk of its own
    both = explorer.chunk(branch)  # then the branch: its chunk runs over the slot's first instruction
    assert slot is not None and both is not None and both[0] > branch + 4
    gaps = gapmap.Gaps(codemap, explorer)
    rounds = [
        {branch: Body(chunks=[branch]), branch + 4: Body(chunks=[branch + 4])},
        {branch: Body(chunks=[branch])},  # the slot's chunk leaves: its bytes stay covered
        {},
    ]
    for bodies in rounds:
        assert gaps.covered(bodies) == gapmap.covered_maps(codemap, explorer, bodies)
    assert gaps.covered(rounds[1])[r.va][branch + 4 - r.va] == 1
