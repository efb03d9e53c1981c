"""The gap stage of x86, AArch64, MIPS, PowerPC and RISC-V: code no function covers that starts like
a function, then trials of the other gaps' first addresses (ARM32's is `arm_gaps.py`).

Gaps are code no function covers (code decoded on a path later found dead counts too). A gap that
starts like a function is taken as one; the code it reaches within the gap is then covered, and a
sub-gap left after it that starts like a function is taken too in the same round (unreferenced
functions laid out one after another). Then exact PIC entries anywhere in a gap (MIPS, PowerPC,
RISC-V). Only when none of those is found does a round try the rest: code from a gap's first
address that stays in the gap, leaving it only by calls and tail calls, is a function.
"""

from __future__ import annotations

import re
import struct
from typing import TYPE_CHECKING, cast

from binlens.analysis.codemap import CodeMap, CodeRegion, zero_runs
from binlens.analysis.heuristics.entries import X86_PROLOGUES, a64_prologue, after_a64_end
from binlens.analysis.heuristics.gapmap import cover
from binlens.analysis.heuristics.prologues import ARCHES as PROLOGUE_ARCHES
from binlens.analysis.heuristics.prologues import GapPrologues
from binlens.analysis.heuristics.round import Round
from binlens.analysis.heuristics.trials import decodes, self_contained
from binlens.analysis.model import T_JUMP

if TYPE_CHECKING:
    from binlens.analysis.decode.x86 import X86Backend

ARCHES = ("x86-64", "x86", "aarch64", *PROLOGUE_ARCHES)  # the architectures this stage looks at
_MISS = object()
_PAD_X86 = re.compile(
    rb"(?:\x90|\xcc|\xf4|\x0f\x0b|\x00|\x66+\x90"
    rb"|\x66*\x2e?\x0f\x1f(?:\x00|\x40\x00|\x44\x00\x00|\x80\x00\x00\x00\x00|\x84\x00\x00\x00\x00\x00)"
    rb"|\x8d\x76\x00|\x8d\x74\x26\x00|\x2e?\x8d\xb4\x26\x00\x00\x00\x00|\x8d\xbc\x27\x00\x00\x00\x00"
    # (i386: gas's `lea esi, [esi + 0]` and `lea edi, [edi + 0]` with 32- and 8-bit displacements, `mov esi, esi`)
    rb"|\x8d\xb6\x00\x00\x00\x00|\x8d\xbf\x00\x00\x00\x00|\x8d\x7f\x00|\x89\xf6)*"
)
Candidate = tuple[int, bool, int]  # (first non-padding address, starts like a function, gap end)


def gaps(r: Round) -> None:
    """The gap stage (see the module docstring): its starts go into `r.out`."""
    stage = _GapStage(r)
    stage.peel()
    stage.exact_entries()
    if r.out:
        return  # let descent from these claim their gaps before weaker guesses
    stage.trials()


class _GapStage:
    """One round of the gap stage: the coverage map it marks as it goes, the prologue kit of MIPS,
    PowerPC and RISC-V, each gap's candidate."""

    def __init__(self, r: Round) -> None:
        self.r = r
        self.covered = r.gaps.covered(r.bodies)
        self.kit: GapPrologues | None = None
        self.align = 16  # x86: a trial's entry and the other gaps' entries it may tail-call are 16-byte aligned
        if r.arch in PROLOGUE_ARCHES:
            if r.gaps.prologues is None:
                r.gaps.prologues = GapPrologues(r.image, r.codemap, r.backend)
            self.kit = r.gaps.prologues
            self.align = self.kit.align
        unguarded = r.explorer.unguarded
        self.case_labels = {x for j, cases in r.explorer.jt.items() if j not in unguarded for x in cases}
        self.cands = gap_candidates(r.codemap, r.arch, self.covered, r.gaps.memo, self.kit)

    def free(self, va: int) -> bool:
        """Is `va` code no instruction runs over, outside the known ranges unless it starts one?"""
        r = self.r
        reg = r.codemap.region(va)
        return reg is not None and reg.state[va - reg.va] != 2 and not (r.inside(va) and va not in r.known)

    def other_gap(self, target: int, lo: int, hi: int) -> bool:
        """An aligned, uncovered address outside this gap: the entry of another unreached function."""
        if lo <= target < hi or target % self.align or self.kit is not None:
            return False  # (MIPS, PowerPC, RISC-V: entries are not aligned apart from other code)
        reg = self.r.codemap.region(target)
        return reg is not None and not self.covered[reg.va][target - reg.va] and reg.state[target - reg.va] != 2

    def peel(self) -> None:
        """Take each gap that starts like a function, and the sub-gaps that do after the code it reaches."""
        r = self.r
        peel = [(va, gap_end) for va, prologue, gap_end in reversed(self.cands) if prologue]
        while peel:
            va, gap_end = peel.pop()
            if va in r.bound or not self.free(va) or not decodes(r.explorer, va):
                continue
            r.out[va] = "prologue"
            r.bound.add(va)
            _ok, seen = self_contained(r.explorer, va, gap_end, r.bound, self.other_gap, self.case_labels)
            cover(r.codemap, self.covered, r.explorer, seen)
            rest = candidates_within(r.codemap, r.arch, self.covered, va, gap_end, self.kit, True)
            peel.extend((sub, sub_end) for sub, pro, sub_end in reversed(rest) if pro)

    def exact_entries(self) -> None:
        """MIPS, PowerPC, RISC-V: exact PIC entries anywhere in a gap (they name their own address)."""
        if self.kit is None:
            return
        r = self.r
        for va in self.kit.exact_entries():
            reg = r.codemap.region(va)
            if reg is None or va in r.starts or va in r.out:
                continue
            if not self.covered[reg.va][va - reg.va] and self.free(va) and decodes(r.explorer, va):
                r.out[va] = "prologue"

    def trials(self) -> None:
        """Try each other gap's first address: a function when its code stays in the gap. A rejected
        trial leaves the rest of its gap as new gaps: their candidates join the work list, found
        within that gap alone."""
        r, kit = self.r, self.kit
        trials = kit is not None and kit.trials
        tried: set[int] = set()
        work = [(va, end) for va, pro, end in reversed(self.cands) if not pro]
        while work:
            va, gap_end = work.pop()
            if va in tried:
                continue
            tried.add(va)
            if va in r.starts or va in self.case_labels or not self.free(va):
                continue  # an aligned case label of a switch found in an earlier trial is not an entry
            if not (va % self.align == 0 and (r.x86 or trials) or r.a64 and after_a64_end(r.codemap, va)):
                continue
            if kit is not None and kit.after_call(va):
                continue  # the rest of a function after a call that does not return
            ok, seen = self_contained(r.explorer, va, gap_end, r.starts, self.other_gap, self.case_labels)
            if ok and not self._a_function(seen):
                ok = False
            if ok:
                r.out[va] = "prologue"
                continue
            r.explorer.mark_unproven(va)  # not proven an entry, but a data pointer may still name it
            cover(r.codemap, self.covered, r.explorer, seen)
            work.extend(self._sub_gaps(va, gap_end))

    def _a_function(self, seen: set[int]) -> bool:
        """Is a self-contained trial's code (its chunks `seen`) a function, not the rest of one
        after a call that does not return (an epilogue), nor a case stub of an unresolved switch?"""
        r, kit = self.r, self.kit
        chunks = r.explorer.chunks
        if r.x86 and cast("X86Backend", r.backend).epilogue_only([(a, chunks[a][0]) for a in seen if a in chunks]):
            return False
        if kit is not None:
            runs = [(a, chunks[a][0]) for a in seen if a in chunks]
            # a lone jump to a known start is a case stub of an unresolved switch, not a function
            lone = len(runs) == 1 and runs[0][1] - runs[0][0] <= 4 and chunks[runs[0][0]][1] == T_JUMP
            return not lone and not kit.epilogue_only(runs) and not kit.borrowed_frame(runs)
        return True

    def _sub_gaps(self, va: int, gap_end: int) -> list[tuple[int, int]]:
        """The work a rejected trial at `va` leaves: the candidates of the gaps left in its gap, in
        the order the work list pops them last. MIPS, PowerPC, RISC-V: a sub-gap that starts like a
        function is taken as one in this round (the next round's gaps forget this trial's code, so
        its start would not be a gap's start)."""
        r, kit = self.r, self.kit
        if kit is None:
            return list(reversed(candidates_within(r.codemap, r.arch, self.covered, va, gap_end)))
        work = []
        for sub, pro, sub_end in reversed(candidates_within(r.codemap, "", self.covered, va, gap_end, kit, True)):
            if pro and sub not in r.starts and self.free(sub) and decodes(r.explorer, sub):
                r.out[sub] = "prologue"
            else:
                work.append((sub, sub_end))
        return work


def gap_candidates(
    codemap: CodeMap,
    arch: str,
    covered: dict[int, bytearray],
    memo: dict[int, dict[int, Candidate | None]] | None = None,
    kit: GapPrologues | None = None,
) -> list[Candidate]:
    """First non-padding address of each gap (code no function covers), whether it starts like a
    function, and where the gap ends. `memo` keeps the answer per gap between rounds (it depends
    on the gap's bounds and the code bytes only). `kit`: the prologue tests of MIPS, PowerPC and RISC-V."""
    out = []
    memo = {} if memo is None else memo
    for r in codemap.regions:
        seen = memo.setdefault(r.va, {})
        width = len(r.data) + 1  # a gap's bounds as one int key (a tuple of two ints costs ~130 bytes)
        for start, end in zero_runs(covered[r.va]):
            key = start * width + end
            hit = seen.get(key, _MISS)
            if hit is _MISS:
                hit = seen[key] = gap_candidate(r, arch, start, end, kit)
            if hit is not None:
                out.append(cast(Candidate, hit))
    return out


def candidates_within(
    codemap: CodeMap,
    arch: str,
    covered: dict[int, bytearray],
    lo: int,
    hi: int,
    kit: GapPrologues | None = None,
    prologues: bool = False,
) -> list:
    """(candidate, gap end) of the gaps left inside [lo, hi) of one region (address order) whose
    candidate does not start like a function; with `prologues`, (candidate, starts like a
    function, gap end) of every gap."""
    r = codemap.region(lo)
    if r is None:
        return []
    out: list = []
    m = covered[r.va]
    for a, b in zero_runs(m, lo - r.va, min(hi, r.end) - r.va):
        hit = gap_candidate(r, arch, a, b, kit)
        if hit is not None and prologues:
            out.append(hit)
        elif hit is not None and not hit[1]:
            out.append((hit[0], hit[2]))
    return out


def gap_candidate(r: CodeRegion, arch: str, off: int, end: int, kit: GapPrologues | None = None) -> Candidate | None:
    """The candidate of the gap [off, end) of region `r` (offsets), or None when it is all padding."""
    if kit is not None:
        return kit.candidate(r, off, end)
    if arch in ("x86-64", "x86"):
        p = _PAD_X86.match(r.data, off, end)
        off = p.end() if p else off
        if off >= end:
            return None
        return (r.va + off, r.data.startswith(X86_PROLOGUES, off), r.va + end)
    while off + 4 <= end and r.data[off : off + 4] in (b"\x1f\x20\x03\xd5", b"\0\0\0\0"):
        off += 4
    if off + 4 > end or off % 4:
        return None
    (w,) = struct.unpack_from("<I", r.data, off)
    return (r.va + off, a64_prologue(w), r.va + end)
