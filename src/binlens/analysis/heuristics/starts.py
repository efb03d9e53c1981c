"""Careful heuristics for code descent did not reach: code pointers, then prologues in gaps.

`heuristic_starts` is one stage of them (the engine runs the stages in order, most trusted
first, re-running discovery after each); `Gaps` counts the gap stage's held chunks between rounds.
"""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Callable, Container
from itertools import chain

from binlens.analysis.codemap import CodeMap, CodeRegion, instruction_start, zero_runs
from binlens.analysis.discovery.explorer import Body, Explorer
from binlens.analysis.heuristics.arm import (
    arm_after_end,
    arm_gap_candidates,
    arm_leaf_candidates,
    arm_pushes,
    arm_runs_into,
    set_arm_state,
)
from binlens.analysis.heuristics.gapmap import Gaps, body_spans, cover, offset_refs_from
from binlens.analysis.heuristics.prologues import ARCHES as PROLOGUE_ARCHES
from binlens.analysis.heuristics.prologues import INSN_ALIGN, GapPrologues
from binlens.analysis.intervals import IntervalSet
from binlens.analysis.model import (
    T_BAD,
    T_CALL,
    T_COND,
    T_FALL,
    T_ICALL,
    T_IJUMP,
    T_JUMP,
    T_RET,
    XREF_KINDS,
)
from binlens.analysis.refs.xrefs import pointers_in_data
from binlens.loader.image import Image

_K_OFFSET = XREF_KINDS.index("offset")
_X86_PROLOGUES = (
    b"\xf3\x0f\x1e\xfa",  # endbr64
    b"\xf3\x0f\x1e\xfb",  # endbr32
    b"\x55\x48\x89\xe5",  # push rbp; mov rbp, rsp
    b"\x55\x89\xe5",  # push ebp; mov ebp, esp
    b"\x55\x8b\xec",  # push ebp; mov ebp, esp (MSVC)
    b"\x8b\xff\x55",  # mov edi, edi; push ebp (hot-patch)
    b"\x41\x57",  # push r15
    b"\x41\x56",  # push r14
    b"\x41\x55",  # push r13
    b"\x41\x54",  # push r12
    b"\x48\x83\xec",  # sub rsp, imm8
    b"\x48\x81\xec",  # sub rsp, imm32
    b"\x53\x48\x83\xec",  # push rbx; sub rsp
    b"\x55\x53",  # push rbp; push rbx
    b"\x48\x89\x5c\x24",  # mov [rsp+x], rbx (MSVC x64)
    b"\x40\x53",  # push rbx (REX, MSVC x64)
    b"\x40\x55",  # push rbp (REX, MSVC x64)
)
_MISS = object()
_PAD_X86 = re.compile(
    rb"(?:\x90|\xcc|\xf4|\x0f\x0b|\x00|\x66+\x90"
    rb"|\x66*\x2e?\x0f\x1f(?:\x00|\x40\x00|\x44\x00\x00|\x80\x00\x00\x00\x00|\x84\x00\x00\x00\x00\x00)"
    rb"|\x8d\x76\x00|\x8d\x74\x26\x00|\x2e?\x8d\xb4\x26\x00\x00\x00\x00|\x8d\xbc\x27\x00\x00\x00\x00"
    # (i386: gas's `lea esi, [esi + 0]` and `lea edi, [edi + 0]` with 32- and 8-bit displacements, `mov esi, esi`)
    rb"|\x8d\xb6\x00\x00\x00\x00|\x8d\xbf\x00\x00\x00\x00|\x8d\x7f\x00|\x89\xf6)*"
)


def heuristic_starts(
    image: Image,
    codemap: CodeMap,
    explorer: Explorer,
    backend: object,
    starts: dict[int, set[str]],
    extents: dict[int, int],
    bodies: dict[int, Body],
    stage: str,
    gaps: Gaps | None = None,
) -> dict[int, str]:
    """Careful guesses for code nothing reached: code pointers, then prologues in gaps."""
    inside = IntervalSet(list(extents.items()))
    spans: list[IntervalSet] = []

    def inside_body(va: int) -> bool:
        if not spans:
            spans.append(IntervalSet(body_spans(explorer, bodies)))
        return spans[0](va)

    out: dict[int, str] = {}

    def unexplored(va: int, lax: bool = False) -> bool:
        r = codemap.region(va)
        return r is not None and r.state[va - r.va] == 0 and (lax or not (inside(va) and va not in extents))

    x86 = image.identity.arch in ("x86-64", "x86")
    mips = _mips_prologue(image, codemap) if image.identity.arch == "mips" else None

    arm = image.identity.arch == "arm"
    # (Mach-O's LC_FUNCTION_STARTS lists every function: the rest of its code is not an entry, but
    # landing pads and code after calls that do not return, which a trial cannot tell apart)
    a64 = image.identity.arch == "aarch64" and not image.function_hints.get("function_starts")
    insn_align = INSN_ALIGN.get(image.identity.arch, 1)
    # code_offsets on AArch64, RISC-V, PowerPC, MIPS: a code address taken by code that starts like
    # a function is an entry even where a found function's blocks seem to run on (x86: `_starts_like_function`)
    taken = _prologue_test(image, codemap, mips) if stage == "code_offsets" and not (x86 or arm) else None

    bound: set[int] = set(starts)  # the starts, and those the gap stage takes as it goes (its peels)

    def accept(
        va: int, source: str, need_ret: bool = False, in_range: bool = False, gap_end: int = 0, trial: bool = False
    ) -> None:
        thumb = False
        if arm:  # a code address with bit 0 set names Thumb code at the even address; else ARM code
            thumb = bool(va & 1)
            va &= ~1
            if not thumb and va & 3:
                return  # ARM instructions are word-aligned: no ARM function starts here
        elif va % insn_align:
            return  # no instruction of the architecture starts here
        if va in starts or va in out:
            return
        # ARM: a linker merges the unwind entry of a function into the one before when the two
        # describe the same frame, so one range may hold a second function: a gap's push or leaf
        # (`in_range`), or code a data pointer names that begins with a push in its state or comes
        # right after a return, may start inside a range
        lax = arm and (
            in_range
            or source == "pointer"
            and (arm_pushes(image, codemap, va | thumb) or arm_after_end(image, codemap, backend, va, thumb, tail=True))
        )
        if not unexplored(va, lax) and va not in explorer.unproven:
            # an address-taken prologue that descent ran into (the fall-through after a call that
            # does not return) is still a function of its own
            if (
                source == "pointer"
                and x86
                and image.identity.format == "ELF"
                and instruction_start(codemap, va)
                and not inside(va)
                and _starts_like_function(codemap, va)
            ):
                out[va] = source
            return
        if (
            source == "pointer"
            and inside_body(va)
            and not (x86 and _starts_like_function(codemap, va))
            and not (taken is not None and taken(va))
        ):
            return  # a label inside a function (computed goto, unresolved table), not an entry
        if arm:
            if va in backend.literals:  # type: ignore[attr-defined]
                return  # a literal pool word a pc-relative load reads: data
            set_arm_state(backend, va, thumb)
        c = explorer.chunk(va)
        if c is None or c[1] == T_BAD:
            return
        # `need_ret`: the first block returns or jumps (not with `trial`), or (with the gap's end) the
        # code from here stays in the gap, leaving it only by calls and tail calls
        ends = not trial and c[1] in (T_RET, T_JUMP)
        if not need_ret or ends or (gap_end and _self_contained(explorer, va, gap_end, bound)[0]):
            out[va] = source

    if stage == "code_offsets":
        # code addresses taken by instructions (`lea`, immediates) in code a function reaches; run
        # again after later stages, since code found later takes addresses too (main's handlers)
        # (each reference is looked at once, in the first round where its instruction is reached)
        pending = gaps.offset_refs(backend) if gaps is not None else offset_refs_from(backend, codemap, 0)
        if pending:
            reached = sorted(chain.from_iterable(b.chunks for b in bodies.values()))  # repeats are harmless
            # whether each reference lies in a chunk some function holds, a byte each, before `accept`
            # decodes (and may split) code (a list of every chunk's end would take 16 MiB on gcc's cc1)
            chunks = explorer.chunks
            held = bytearray(
                (i := bisect.bisect_right(reached, src) - 1) >= 0 and src < chunks[reached[i]][0] for src, _ in pending
            )
            del reached
            later = []
            # AArch64, RISC-V, PowerPC, MIPS (`taken`): an address that descent already ran into (the
            # fall-through after a call that does not return, which the callee's analysis missed) is
            # a function of its own when it starts like one (x86 has its own test in `accept`)
            prologue = taken
            for (src, dst), inside_held in zip(pending, held, strict=True):
                if inside_held:
                    if (
                        prologue is not None
                        and dst not in starts
                        and not unexplored(dst)
                        and instruction_start(codemap, dst)
                        and not inside(dst)
                        and prologue(dst)
                    ):
                        out[dst] = "pointer"
                    else:
                        accept(dst, "pointer")
                else:
                    later.append((src, dst))
            pending[:] = later
    elif stage in ("data_prologues", "data_pointers"):
        for _src, dst in pointers_in_data(image, codemap, set()):
            if (
                stage == "data_pointers"
                or (x86 and _starts_like_function(codemap, dst))
                or (mips and mips(dst))
                or (arm and arm_pushes(image, codemap, dst))  # a push in the state the pointer names
            ):
                accept(dst, "pointer")
    elif arm:
        if image.code_endian == "little":
            gaps = gaps or Gaps(codemap, explorer)
            covered = gaps.covered(bodies)
            for va, _gap_end in arm_gap_candidates(codemap, backend, covered, gaps.memo):
                accept(va, "prologue", in_range=True)
            # leaf functions (no push): pushes first, since descent from them claims their gaps; and only
            # after the data pointers, which name a function's state (a guess in the wrong one would stay)
            if not out and gaps.after_data:
                decoded = backend.decoded_thumb  # type: ignore[attr-defined]
                prior = 2 * sum(decoded.get(f, False) for f in starts) >= len(starts)  # most functions' state
                # A leaf taken covers what descent from it reaches, and the rest of its gap is looked
                # at again in the same round: runs of small leaves laid out one after another took a
                # round each (~50 rounds on some armv7 files). (Not for pushes: found in the first
                # rounds, in gaps that still hold much unreached code, a push guessed before the
                # discovery of the code around it can be a literal pool's words.)
                # (a sub-gap is looked at as the next round would: its push first, then its leaf)
                first = arm_leaf_candidates(image, codemap, backend, covered, prior)
                work: list[tuple] = [(False, *leaf, None) for leaf in reversed(first)]
                while work:
                    push, va, gap_end, after_tail, within = work.pop()
                    if push:
                        accept(va, "prologue", in_range=True)
                        if (va & ~1) not in out:  # no function there: the sub-gap's leaf, if any
                            sub = arm_leaf_candidates(image, codemap, backend, covered, prior, within)
                            work.extend((False, *leaf, within) for leaf in reversed(sub))
                            continue
                    elif starts.get(gap_end) == {"prologue"} and arm_runs_into(codemap, backend, va, gap_end):
                        # the checks before a frame whose push was found first: the entry is here (the
                        # push, which this code now runs into, is dropped after the next discovery)
                        accept(va, "prologue", in_range=True)
                        continue
                    else:
                        accept(va, "prologue", need_ret=True, in_range=True, gap_end=gap_end, trial=after_tail)
                    entry = va & ~1
                    if entry not in out or entry in bound:
                        continue
                    bound.add(entry)
                    cover(codemap, covered, explorer, _descend(explorer, entry))
                    within = (entry, gap_end)
                    pushes = arm_gap_candidates(codemap, backend, covered, gaps.memo, within)
                    if pushes:
                        work.extend((True, p, end, False, within) for p, end in reversed(pushes))
                    else:
                        sub = arm_leaf_candidates(image, codemap, backend, covered, prior, within)
                        work.extend((False, *leaf, within) for leaf in reversed(sub))
    elif image.identity.arch in ("x86-64", "x86", "aarch64") or image.identity.arch in PROLOGUE_ARCHES:
        # Gaps are code no function covers (code decoded on a path later found dead counts too).
        gaps = gaps or Gaps(codemap, explorer)
        covered = gaps.covered(bodies)
        kit = None
        align = 16  # x86: a trial's entry and the other gaps' entries it may tail-call are 16-byte aligned
        if image.identity.arch in PROLOGUE_ARCHES:
            if gaps.prologues is None:
                gaps.prologues = GapPrologues(image, codemap, backend)
            kit = gaps.prologues
            align = kit.align

        def free(va: int) -> bool:
            r = codemap.region(va)
            return r is not None and r.state[va - r.va] != 2 and not (inside(va) and va not in extents)

        def other_gap(target: int, lo: int, hi: int) -> bool:
            """An aligned, uncovered address outside this gap: the entry of another unreached function."""
            if lo <= target < hi or target % align or kit is not None:
                return False  # (MIPS, PowerPC, RISC-V: entries are not aligned apart from other code)
            r = codemap.region(target)
            return r is not None and not covered[r.va][target - r.va] and r.state[target - r.va] != 2

        unguarded = explorer.unguarded
        case_labels = {x for j, cases in explorer.jt.items() if j not in unguarded for x in cases}
        cands = _gap_candidates(codemap, image.identity.arch, covered, gaps.memo, kit)
        # A gap that starts like a function is taken as one; the code it reaches within the gap is
        # then covered, and a sub-gap left after it that starts like a function is taken too in
        # the same round (unreferenced functions laid out one after another: one round each before)
        peel = [(va, gap_end) for va, prologue, gap_end in reversed(cands) if prologue]
        while peel:
            va, gap_end = peel.pop()
            if va in bound or not free(va) or not _decodes(explorer, va):
                continue
            out[va] = "prologue"
            bound.add(va)
            _ok, seen = _self_contained(explorer, va, gap_end, bound, other_gap, case_labels)
            cover(codemap, covered, explorer, seen)
            rest = _candidates_within(codemap, image.identity.arch, covered, va, gap_end, kit, True)
            peel.extend((sub, sub_end) for sub, pro, sub_end in reversed(rest) if pro)
        if kit is not None:  # exact PIC entries anywhere in a gap (they name their own address)
            for va in kit.exact_entries():
                r = codemap.region(va)
                if va not in starts and va not in out and r is not None and not covered[r.va][va - r.va] and free(va):
                    c = explorer.chunk(va)
                    if c is not None and c[1] != T_BAD:
                        out[va] = "prologue"
        if out:
            return out  # let descent from these claim their gaps before weaker guesses
        trials = kit is not None and kit.trials
        tried: set[int] = set()
        # a rejected trial leaves the rest of its gap as new gaps:
        # their candidates join the work list, found within that gap alone
        work = [(va, end) for va, pro, end in reversed(cands) if not pro]
        while work:
            va, gap_end = work.pop()
            if va in tried:
                continue
            tried.add(va)
            if va in starts or va in case_labels or not free(va):
                continue  # an aligned case label of a switch found in an earlier trial is not an entry
            if not (va % align == 0 and (x86 or trials) or a64 and _after_a64_end(codemap, va)):
                continue
            if kit is not None and kit.after_call(va):
                continue  # the rest of a function after a call that does not return
            ok, seen = _self_contained(explorer, va, gap_end, starts, other_gap, case_labels)
            if ok and x86:  # the rest of a function after a call that does not return (an epilogue)
                chunks = explorer.chunks
                ok = not backend.epilogue_only([(a, chunks[a][0]) for a in seen if a in chunks])  # type: ignore[attr-defined]
            if ok and kit is not None:
                chunks = explorer.chunks
                runs = [(a, chunks[a][0]) for a in seen if a in chunks]
                # a lone jump to a known start is a case stub of an unresolved switch, not a function
                lone = len(runs) == 1 and runs[0][1] - runs[0][0] <= 4 and chunks[runs[0][0]][1] == T_JUMP
                ok = not lone and not kit.epilogue_only(runs) and not kit.borrowed_frame(runs)
            if ok:
                out[va] = "prologue"
                continue
            explorer.unproven.add(va)  # not proven an entry, but a data pointer may still name it
            cover(codemap, covered, explorer, seen)
            if kit is None:
                work.extend(reversed(_candidates_within(codemap, image.identity.arch, covered, va, gap_end)))
                continue
            # MIPS, PowerPC, RISC-V: a sub-gap that starts like a function is taken as one now (the
            # next round's gaps forget this trial's code, so its start would not be a gap's start)
            for sub, pro, sub_end in reversed(_candidates_within(codemap, "", covered, va, gap_end, kit, True)):
                if pro and sub not in starts and free(sub) and _decodes(explorer, sub):
                    out[sub] = "prologue"
                else:
                    work.append((sub, sub_end))
    return out


def _starts_like_function(codemap: CodeMap, va: int) -> bool:
    r = codemap.region(va)
    return r is not None and r.data.startswith(_X86_PROLOGUES, va - r.va)


def _prologue_test(image: Image, codemap: CodeMap, mips: Callable[[int], bool] | None) -> Callable[[int], bool] | None:
    """A test for AArch64, RISC-V, PowerPC or MIPS code that starts like a function (None for other
    architectures): AArch64 `stp x29, x30, [sp, #-N]!`, `paciasp`, `bti c`, `sub sp, sp, #N`;
    RISC-V `addi sp, sp, -N` (or `c.addi16sp`); PowerPC `stwu`/`stdu r1, -N(r1)`, `mflr r0`, a
    PPC64 global entry (`addis r2, r12` / `lis r2`); MIPS `_mips_prologue`."""
    arch = image.identity.arch
    if arch == "mips":
        return mips
    if arch not in ("aarch64", "riscv", "ppc"):
        return None
    little = image.identity.endian == "little" or arch == "aarch64"
    word = struct.Struct("<I" if little else ">I")
    half = struct.Struct("<H")

    def test(va: int) -> bool:
        r = codemap.region(va)
        off = va - r.va if r is not None else -1
        if r is None or off + 2 > len(r.data) or va & (1 if arch == "riscv" else 3):
            return False
        if arch == "riscv":
            (h,) = half.unpack_from(r.data, off)
            if h & 3 != 3:  # compressed: `c.addi16sp sp, -N`
                return h & 0xEF83 == 0x6101 and bool(h & 0x1000)
        if off + 4 > len(r.data):
            return False
        (w,) = word.unpack_from(r.data, off)
        if arch == "riscv":
            return w & 0xFFFFF == 0x10113 and bool(w >> 31)  # addi sp, sp, -N
        if arch == "aarch64":
            return w & 0xFFC07FFF == 0xA9807BFD or w in (0xD503233F, 0xD503245F) or w & 0xFF0003FF == 0xD10003FF
        return (
            w >> 16 == 0x9421
            and bool(w & 0x8000)  # stwu r1, -N(r1)
            or w & 0xFFFF8003 == 0xF8218001  # stdu r1, -N(r1)
            or w == 0x7C0802A6  # mflr r0
            or w >> 16 in (0x3C4C, 0x3C40)  # addis r2, r12, hi / lis r2, hi: a PPC64 global entry
        )

    return test


def _mips_prologue(image: Image, codemap: CodeMap) -> Callable[[int], bool]:
    """A test for MIPS code that starts like a function: `addiu`/`daddiu $sp, $sp, -N` or `lui $gp, ...`
    (`.cpload`). Used to take function pointers in data before the rest (case labels in switch tables)."""
    word = struct.Struct("<I" if image.identity.endian == "little" else ">I")

    def test(va: int) -> bool:
        r = codemap.region(va)
        off = va - r.va if r is not None else -1
        if r is None or va & 3 or off + 4 > len(r.data):
            return False
        (w,) = word.unpack_from(r.data, off)
        return (w >> 16) in (0x27BD, 0x67BD) and w & 0x8000 != 0 or w >> 16 == 0x3C1C

    return test


_A64_PAD = (0xD503201F, 0)  # nop, zero padding


def _after_a64_end(codemap: CodeMap, va: int) -> bool:
    """Is the last non-padding AArch64 word before `va` an unconditional end of flow (`ret`, `b`,
    `br`, `brk`, `udf`), or is there none? Code right after a call that was taken as returning
    (or a conditional branch) is the rest of a function, not the entry of another one."""
    r = codemap.region(va)
    if r is None or va % 4:
        return False
    off = va - r.va - 4
    while off >= 0:
        (w,) = struct.unpack_from("<I", r.data, off)
        if w not in _A64_PAD:
            break
        off -= 4
    else:
        return True
    return (
        w & 0xFFFFFC1F == 0xD65F0000  # ret
        or w & 0xFC000000 == 0x14000000  # b
        or w & 0xFFFFFC1F == 0xD61F0000  # br
        or w & 0xFFE0001F == 0xD4200000  # brk
        or w >> 16 == 0  # udf
        or w in (0xD65F0BFF, 0xD65F0FFF)  # retaa, retab
    )


def _descend(explorer: Explorer, entry: int) -> list[int]:
    """The chunks descent from `entry` reaches that it had not reached before (the discovery after
    this round walks on from them): what a function taken now covers, callees and literal pools
    read included, before the next candidate in its gap is looked for."""
    fresh: list[int] = []
    explorer.traverse([entry], explorer.noreturn, fresh)
    return fresh


def _self_contained(
    explorer: Explorer,
    start: int,
    gap_end: int,
    starts: Container[int],
    elsewhere: Callable[[int, int, int], bool] = lambda va, lo, hi: False,
    case_labels: set[int] | None = None,
) -> tuple[bool, set[int]]:
    """Does code decoded from `start` stay inside its gap (leaving only by calls and tail calls)?

    Unreached blocks of a function (cases of an unresolved switch, code after a call wrongly
    thought to return) jump back into explored code; a function that nothing calls does not.
    The cases of a bounded switch met on the way are part of the trial (and added to `case_labels`).
    """
    # (address, soft): code reached through a switch's cases is soft: a case that leaves the gap
    # or runs into bytes decoded otherwise before is skipped, not taken as evidence against
    stack = [(start, False)]
    seen: set[int] = set()
    rets = 0
    while stack:
        a, soft = stack.pop()
        if a in seen:
            continue
        seen.add(a)
        if len(seen) > 4096:
            return False, seen
        if a != start and a in starts:
            continue
        if not start <= a < gap_end:
            if soft:
                continue
            return False, seen
        c = explorer.chunk(a)
        if c is None or c[1] == T_BAD:
            if soft:
                continue
            return False, seen
        _end, term, t, last = c
        if term == T_JUMP and t[0] != start and (t[0] in starts or elsewhere(t[0], start, gap_end)):
            rets += 1  # a tail call to a known function, or to an aligned entry in another gap
        elif term in (T_FALL, T_JUMP):
            if term == T_FALL:
                explorer.pred.setdefault(t[0], a)  # the path a switch's bound check is found on
            stack.append((t[0], soft))
        elif term == T_COND:
            explorer.pred.setdefault(t[1], a)
            stack.extend((x, soft) for x in t)
        elif term in (T_CALL, T_ICALL):
            stack.append((t[1], soft))
        elif term == T_RET:
            rets += 1
        elif term == T_IJUMP:
            cases = explorer.trial_cases(a, last)
            if cases:
                stack.extend((x, True) for x in cases)
                if case_labels is not None:
                    case_labels.update(cases)
    return rets > 0, seen


def _gap_candidates(
    codemap: CodeMap,
    arch: str,
    covered: dict[int, bytearray],
    memo: dict[int, dict[int, tuple[int, bool, int] | None]] | None = None,
    kit: GapPrologues | None = None,
) -> list[tuple[int, bool, int]]:
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
                hit = seen[key] = _gap_candidate(r, arch, start, end, kit)
            if hit is not None:
                out.append(hit)
    return out


def _candidates_within(
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
        hit = _gap_candidate(r, arch, a, b, kit)
        if hit is not None and prologues:
            out.append(hit)
        elif hit is not None and not hit[1]:
            out.append((hit[0], hit[2]))
    return out


def _decodes(explorer: Explorer, va: int) -> bool:
    """Does code at `va` decode into a chunk without an invalid instruction?"""
    c = explorer.chunk(va)
    return c is not None and c[1] != T_BAD


def _gap_candidate(
    r: CodeRegion, arch: str, off: int, end: int, kit: GapPrologues | None = None
) -> tuple[int, bool, int] | None:
    """The candidate of the gap [off, end) of region `r` (offsets), or None when it is all padding."""
    if kit is not None:
        return kit.candidate(r, off, end)
    if arch in ("x86-64", "x86"):
        p = _PAD_X86.match(r.data, off, end)
        off = p.end() if p else off
        if off >= end:
            return None
        return (r.va + off, r.data.startswith(_X86_PROLOGUES, off), r.va + end)
    while off + 4 <= end and r.data[off : off + 4] in (b"\x1f\x20\x03\xd5", b"\0\0\0\0"):
        off += 4
    if off + 4 > end or off % 4:
        return None
    (w,) = struct.unpack_from("<I", r.data, off)
    ok = w & 0xFFC07FFF == 0xA9807BFD or w in (0xD503233F, 0xD503245F) or w & 0xFF0003FF == 0xD10003FF
    return (r.va + off, ok, r.va + end)
