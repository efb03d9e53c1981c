"""Careful heuristics for code descent did not reach: code pointers, then prologues in gaps.

`heuristic_starts` is one stage of them (the engine runs the stages in order, most trusted
first, re-running discovery after each); `Gaps` keeps the gap stage's coverage map between rounds.
"""

from __future__ import annotations

import bisect
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import chain

from binlens.analysis.armexidx import decodes, gap_push, guess_state, starts_with_push
from binlens.analysis.codemap import CodeMap, CodeRegion
from binlens.analysis.discovery import Body, Explorer, FragmentIndex
from binlens.analysis.model import T_BAD, T_CALL, T_COND, T_FALL, T_ICALL, T_IJUMP, T_JUMP, T_RET, XREF_KINDS
from binlens.analysis.prologues import ARCHES as PROLOGUE_ARCHES
from binlens.analysis.prologues import GapPrologues
from binlens.analysis.xrefs import pointers_in_data
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
# instruction alignment of fixed-width (or 16-bit-granular) architectures; ARM32 is handled apart
# (bit 0 names the Thumb state)
_INSN_ALIGN = {"aarch64": 4, "mips": 4, "ppc": 4, "riscv": 2}
_PAD_X86 = re.compile(
    rb"(?:\x90|\xcc|\xf4|\x0f\x0b|\x00|\x66+\x90"
    rb"|\x66*\x2e?\x0f\x1f(?:\x00|\x40\x00|\x44\x00\x00|\x80\x00\x00\x00\x00|\x84\x00\x00\x00\x00\x00)"
    rb"|\x8d\x76\x00|\x8d\x74\x26\x00|\x2e?\x8d\xb4\x26\x00\x00\x00\x00|\x8d\xbc\x27\x00\x00\x00\x00)*"
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
    inside = FragmentIndex(list(extents.items()))
    spans: list[FragmentIndex] = []

    def inside_body(va: int) -> bool:
        if not spans:
            spans.append(FragmentIndex(_body_spans(explorer, bodies)))
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
    insn_align = _INSN_ALIGN.get(image.identity.arch, 1)
    # code_offsets on AArch64, RISC-V, PowerPC, MIPS: a code address taken by code that starts like
    # a function is an entry even where a found function's blocks seem to run on (x86: `_starts_like_function`)
    taken = _prologue_test(image, codemap, mips) if stage == "code_offsets" and not (x86 or arm) else None

    def accept(va: int, source: str, need_ret: bool = False, in_range: bool = False) -> None:
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
            and (_arm_pushes(image, codemap, va | thumb) or _arm_after_end(image, codemap, backend, va, thumb))
        )
        if not unexplored(va, lax) and va not in explorer.unproven:
            # an address-taken prologue that descent ran into (the fall-through after a call that
            # does not return) is still a function of its own
            if (
                source == "pointer"
                and x86
                and image.identity.format == "ELF"
                and _instruction_start(codemap, va)
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
            _set_arm_state(backend, va, thumb)
        c = explorer.chunk(va)
        if c is not None and c[1] != T_BAD and (not need_ret or c[1] in (T_RET, T_JUMP)):
            out[va] = source

    if stage == "code_offsets":
        # code addresses taken by instructions (`lea`, immediates) in code a function reaches; run
        # again after later stages, since code found later takes addresses too (main's handlers)
        # (each reference is looked at once, in the first round where its instruction is reached)
        pending = gaps.offset_refs(backend) if gaps is not None else _offset_refs(backend, codemap, 0)
        if pending:
            reached = sorted(chain.from_iterable(b.chunks for b in bodies.values()))  # repeats are harmless
            ends = [explorer.chunks[a][0] for a in reached]
            later = []
            # AArch64, RISC-V, PowerPC, MIPS (`taken`): an address that descent already ran into (the
            # fall-through after a call that does not return, which the callee's analysis missed) is
            # a function of its own when it starts like one (x86 has its own test in `accept`)
            prologue = taken
            for src, dst in pending:
                i = bisect.bisect_right(reached, src) - 1
                if i >= 0 and src < ends[i]:
                    if (
                        prologue is not None
                        and dst not in starts
                        and not unexplored(dst)
                        and _instruction_start(codemap, dst)
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
                or (arm and _arm_pushes(image, codemap, dst))  # a push in the state the pointer names
            ):
                accept(dst, "pointer")
    elif arm:
        if image.code_endian == "little":
            gaps = gaps or Gaps(codemap, explorer, disjoint=False)
            covered = gaps.covered(bodies)
            for va in _arm_gap_candidates(codemap, backend, covered, gaps.memo):
                accept(va, "prologue", in_range=True)
            # leaf functions (no push): pushes first, since descent from them claims their gaps; and only
            # after the data pointers, which name a function's state (a guess in the wrong one would stay)
            if not out and gaps.after_data:
                decoded = backend.decoded_thumb  # type: ignore[attr-defined]
                prior = 2 * sum(decoded.get(f, False) for f in starts) >= len(starts)  # most functions' state
                for va in _arm_leaf_candidates(image, codemap, backend, covered, prior):
                    accept(va, "prologue", need_ret=True, in_range=True)
    elif image.identity.arch in ("x86-64", "x86", "aarch64") or image.identity.arch in PROLOGUE_ARCHES:
        # Gaps are code no function covers (code decoded on a path later found dead counts too).
        gaps = gaps or Gaps(codemap, explorer, disjoint=x86)
        covered = gaps.covered(bodies)
        kit = None
        align = 16  # x86: a trial's entry and the other gaps' entries it may tail-call are 16-byte aligned
        if image.identity.arch in PROLOGUE_ARCHES:
            if gaps.prologues is None:
                gaps.prologues = GapPrologues(image, codemap, backend)
                # MIPS and PowerPC instructions are aligned words: chunks begun at aligned addresses
                # never overlap, so the coverage map is kept up to date incrementally instead of
                # recounted each round (a misaligned pointer start could overlap another chunk: the
                # map may then err on those bytes alone)
                if image.identity.arch in ("mips", "ppc") and not gaps.bodies:
                    gaps.disjoint = True
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
        for va, prologue, _gap_end in cands:
            if prologue and va not in starts and free(va):
                c = explorer.chunk(va)
                if c is not None and c[1] != T_BAD:
                    out[va] = "prologue"
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
            _cover(codemap, covered, explorer, seen)
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


class Gaps:
    """The coverage map of the gap heuristic, kept up to date between its rounds.

    `covered` is 1 for each code byte inside a chunk of some function. Instead of rebuilding it
    from every body each round, it counts per chunk the bodies that hold it and re-marks only the
    chunks of bodies that changed since the last round (partition hands back the same Body
    object when a body did not change) and chunks split since then. Chunks never overlap on
    x86 (its decoder checks every byte), so each chunk's bytes are marked exactly when some body
    holds it; where chunks may overlap (`disjoint=False`: AArch64 code entered at a misaligned
    address) each round recounts from scratch.
    """

    def __init__(self, codemap: CodeMap, explorer: Explorer, disjoint: bool = True) -> None:
        self.codemap = codemap
        self.explorer = explorer
        self.disjoint = disjoint  # False: chunks may overlap, so each round recounts from scratch
        self.maps = {r.va: bytearray(len(r.data)) for r in codemap.regions}
        self.count: dict[int, int] = {}
        self.bodies: dict[int, Body] = {}
        self.nsplits = 0
        self.memo: dict[int, dict[tuple[int, int], tuple[int, bool, int] | None]] = {}
        self._refs: list[tuple[int, int]] = []
        self.after_data = False  # set once the data-pointer stages have run (ARM32 leaf guesses wait for it)
        self._refs_upto = 0
        self.prologues: GapPrologues | None = None  # MIPS, PowerPC, RISC-V: the image's prologue tests

    def offset_refs(self, backend: object) -> list[tuple[int, int]]:
        """(instruction, code address) of the address-taking references not yet looked at: those
        decoded since the last call join the ones whose instruction no function reached yet (the
        caller keeps in the list what it leaves for later)."""
        n = len(backend.x_kind)  # type: ignore[attr-defined]
        if n > self._refs_upto:
            self._refs += _offset_refs(backend, self.codemap, self._refs_upto)
            self._refs_upto = n
        return self._refs

    def covered(self, bodies: dict[int, Body]) -> dict[int, bytearray]:
        """Per region, the coverage of `bodies` (a copy the caller may mark further)."""
        if not self.disjoint:
            return _covered_maps(self.codemap, self.explorer, bodies)
        if not self.bodies:  # the first round: every chunk of every body is new
            counted: Counter[int] = Counter()  # (a dict: kept as the counts, not copied)
            for b in bodies.values():
                counted.update(b.chunks)
            self.count = counted
            self.bodies = dict(bodies)
            self.nsplits = len(self.explorer.splits)
            _cover(self.codemap, self.maps, self.explorer, self.count)
            return {va: bytearray(m) for va, m in self.maps.items()}
        count = self.count
        touched: set[int] = set()
        old = self.bodies
        gone: list[int] = []  # one entry per (changed body, chunk it no longer holds)
        came: list[int] = []
        for f, b in old.items():
            nb = bodies.get(f)
            if nb is b:
                continue
            if nb is None:
                gone.extend(b.chunks)
            else:  # a recomputed body mostly holds the same chunks: count only the difference
                was, now = set(b.chunks), set(nb.chunks)
                gone.extend(was - now)
                came.extend(now - was)
        for f, b in bodies.items():
            if f not in old:
                came.extend(b.chunks)
        for a in gone:
            n = count[a] - 1
            if n:
                count[a] = n
            else:
                del count[a]
                touched.add(a)
        for a in came:
            n = count.get(a, 0)
            count[a] = n + 1
            if not n:
                touched.add(a)
        splits = self.explorer.splits
        for h, va in splits[self.nsplits :]:
            touched.add(h)
            touched.add(va)
        self.nsplits = len(splits)
        self.bodies = dict(bodies)
        held = {a for a in touched if a in count}
        _cover(self.codemap, self.maps, self.explorer, touched - held, b"\x00")
        _cover(self.codemap, self.maps, self.explorer, held)
        return {va: bytearray(m) for va, m in self.maps.items()}


def _offset_refs(backend: object, codemap: CodeMap, start: int) -> list[tuple[int, int]]:
    """(src, dst) of the `offset` references from index `start` on whose target is code."""
    b = backend
    kinds = b.x_kind  # type: ignore[attr-defined]
    out = []
    contains = codemap.contains
    takes = getattr(b, "takes_address", None)  # x86: only lea and mov/push of an address count
    i = kinds.find(_K_OFFSET, start)
    while i >= 0:
        dst = b.x_dst[i]  # type: ignore[attr-defined]
        src = b.x_src[i]  # type: ignore[attr-defined]
        if contains(dst) and (takes is None or takes(src)):
            out.append((src, dst))
        i = kinds.find(_K_OFFSET, i + 1)
    return out


def _covered_maps(codemap: CodeMap, explorer: Explorer, bodies: dict[int, Body]) -> dict[int, bytearray]:
    """Per code region, 1 for each byte inside a chunk of some function."""
    maps = {r.va: bytearray(len(r.data)) for r in codemap.regions}
    _cover(codemap, maps, explorer, set().union(*(b.chunks for b in bodies.values())))
    return maps


def _cover(
    codemap: CodeMap, maps: dict[int, bytearray], explorer: Explorer, chunks: Iterable[int], fill: bytes = b"\x01"
) -> None:
    """Set the bytes of `chunks` in `maps` to `fill`: chunks in address order, adjacent ones as one run."""
    get = explorer.chunks.get
    r = None
    m = bytearray()
    base = rend = 0
    lo = hi = -1  # the current run, as offsets into m
    for a in sorted(chunks):
        c = get(a)
        if c is None:
            continue
        if r is None or not base <= a < rend:
            if hi > lo:
                m[lo:hi] = fill * (hi - lo)
            lo = hi = -1
            r = codemap.region(a)
            if r is None:
                continue
            m = maps[r.va]
            base, rend = r.va, r.end
        o = a - base
        e = min(c[0], rend) - base
        if e <= o:
            continue
        if lo <= o <= hi:
            if e > hi:
                hi = e
        else:
            if hi > lo:
                m[lo:hi] = fill * (hi - lo)
            lo, hi = o, e
    if hi > lo:
        m[lo:hi] = fill * (hi - lo)


def _body_spans(explorer: Explorer, bodies: dict[int, Body]) -> list[tuple[int, int]]:
    """(entry, size) of the contiguous run of blocks from each function's entry."""
    out = []
    chunks = explorer.chunks
    for f, b in bodies.items():
        end = f
        for a in sorted([a for a in b.chunks if a >= f and a in chunks]):
            if a > end + 16:
                break
            e = chunks[a][0]
            if e > end:
                end = e
        if end > f:
            out.append((f, end - f))
    return out


def _set_arm_state(backend: object, va: int, thumb: bool) -> None:
    """Decode the unexplored ARM32 code at `va` in the state a pointer to it names (Thumb when its bit 0 was set)."""
    modes: set[int] = backend.thumb  # type: ignore[attr-defined]
    if thumb:
        modes.add(va)
    else:
        modes.discard(va)  # e.g. a fall-through guess after a call that does not return


def arm_labels(explorer: Explorer, backend: object, bodies: dict[int, Body], seeds: dict[int, set[str]]) -> set[int]:
    """ARM32: guesses (`prologue` and `pointer` starts with no other evidence) that another
    function's code runs into (falls through or branches past a condition into): a push or a
    coincidental data word inside a function found before the function was (a shrink-wrapped
    frame, or an entry known only from a later stage), and those at a word that a pc-relative load
    reads (a literal pool, named by a data word that happens to hold its address). The caller
    drops them, and the discovery that follows gives their code back to the function."""
    guessed = [va for va, src in seeds.items() if src == {"prologue"} or src == {"pointer"}]
    literals: set[int] = backend.literals  # type: ignore[attr-defined]
    out = {va for va in guessed if va in literals}  # a word a pc-relative load reads is data
    into: dict[int, int] = {}  # guess -> the last instruction of the chunk that runs into it
    chunks = explorer.chunks
    for va in guessed:
        a = explorer.pred.get(va)
        c = chunks.get(a) if a is not None else None
        if c is not None and c[0] == va and c[1] in (T_FALL, T_COND):
            into[va] = c[3]
    if into:  # a body that runs into another start lists it among its tails (from that last instruction)
        out.update(s for f, b in bodies.items() for last, s in b.tails if s != f and into.get(s) == last)
    return out


def _arm_pushes(image: Image, codemap: CodeMap, va: int) -> bool:
    """Does the ARM32 code a pointer names (bit 0: Thumb) begin with `push {..., lr}` in that state?"""
    r = codemap.region(va & ~1)
    if r is None:
        return False
    off = (va & ~1) - r.va
    order = "<" if image.code_endian == "little" else ">"
    return starts_with_push(bytes(r.data[off : off + 16]), bool(va & 1), order)


def _arm_after_end(image: Image, codemap: CodeMap, backend: object, va: int, thumb: int) -> bool:
    """ARM32: does a function end right before `va` (past padding and the words pc-relative loads
    read)? That is, is the instruction before a return: Thumb `bx lr`, `pop {.., pc}`,
    `pop.w {.., pc}`; ARM `bx lr`, `pop {.., pc}`, `ldr pc, [sp], #4`."""
    r = codemap.region(va)
    if r is None or image.code_endian != "little":
        return False
    literals: set[int] = backend.literals  # type: ignore[attr-defined]
    data = r.data
    o = va - r.va
    while o >= 4:
        if (r.va + o - 4) in literals and (r.va + o) % 4 == 0:
            o -= 4
        elif data[o - 2 : o] in (b"\x00\xbf", b"\x00\x00"):
            o -= 2
        else:
            break
    if o < 4:
        return False
    (h,) = struct.unpack_from("<H", data, o - 2)
    (w,) = struct.unpack_from("<I", data, o - 4)
    if h == 0x4770 or h & 0xFF00 == 0xBD00 or (w & 0x8000FFFF == 0x8000E8BD):
        return True
    return (r.va + o) % 4 == 0 and (w == 0xE12FFF1E or w & 0xFFFF8000 == 0xE8BD8000 or w == 0xE49DF004)


def _arm_gap_candidates(
    codemap: CodeMap,
    backend: object,
    covered: dict[int, bytearray],
    memo: dict[int, dict[tuple[int, int], tuple[int, bool, int] | None]],
) -> list[int]:
    """ARM32: in each gap (code no function covers), the first `push {..., lr}` in either state, as
    a code address whose bit 0 says Thumb. A gap usually begins with the literal pool of the
    function before it, so the first non-padding address is data more often than code; the first
    push, Thumb halfword- or ARM word-aligned, is where the next function's frame is built.
    A function may do a little work before its push (`ldr r3, [r0, #8]; push.w {...}`): when
    the gap, past the words pc-relative loads read and padding, begins at most 16 bytes before the
    push with code that runs into it (conditional branches aside: `cbz r0, 1f`), the entry is there instead.
    `memo` keeps the push per gap between rounds (it depends on the gap's bounds and bytes only)."""
    out = []
    literals: set[int] = backend.literals  # type: ignore[attr-defined]
    for r in codemap.regions:
        seen = memo.setdefault(r.va, {})
        for span in _zero_runs(covered[r.va]):
            hit = seen.get(span, _MISS)
            if hit is _MISS:
                va = gap_push(r.data, span[0], span[1], r.va)
                hit = seen[span] = None if va is None else (va, True, r.va + span[1])
            if hit is not None:
                out.append(_arm_lead_in(r, backend, literals, r.va + span[0], hit[0]))
    return out


_ARM_PADDING = {2: (b"\x00\xbf", b"\x00\x00"), 4: (b"\x00\x00\xa0\xe1", b"\x00\xf0\x20\xe3", b"\x00\x00\x00\x00")}


def _arm_leaf_candidates(
    image: Image, codemap: CodeMap, backend: object, covered: dict[int, bytearray], prior: bool
) -> list[int]:
    """ARM32: the first address of each gap (past padding and the words pc-relative loads read)
    when a return comes right before it, in the state its first bytes tell (`guess_state`; else
    `prior`, True for Thumb), as a code address whose bit 0 says Thumb: a leaf function nothing
    references (no push to find it by). The caller takes it only when its first block returns or jumps."""
    literals: set[int] = backend.literals  # type: ignore[attr-defined]
    md = backend.md  # type: ignore[attr-defined]
    out = []
    for r in codemap.regions:
        for lo, hi in _zero_runs(covered[r.va]):
            g = r.va + lo + (lo & 1)
            end = r.va + hi
            while g + 4 <= end:
                if g in literals and g % 4 == 0:
                    g += 4
                elif r.data[g - r.va : g - r.va + 2] in (b"\x00\xbf", b"\x00\x00"):
                    g += 2
                else:
                    break
            if g + 4 > end or not _arm_after_end(image, codemap, backend, g, 0):
                continue
            data = (image.read(g, 16) or b"").ljust(16, b"\x00")  # (a short gap at a region's end)
            state = guess_state(data, lambda t, d=data, a=g: decodes(md(t), d, a))
            if state is None:
                state = prior
            if not state and g % 4:
                continue
            out.append(g | int(state))
    return out


def _arm_lead_in(r: CodeRegion, backend: object, literals: set[int], lo: int, push: int) -> int:
    """The entry of the function whose push is at `push` (bit 0: Thumb), in a gap that begins at `lo`."""
    thumb = push & 1
    at = push & ~1
    step = 2 if thumb else 4
    g = lo + (lo & 1)
    while g < at:
        if g in literals and g % 4 == 0:
            g += 4
        elif r.data[g - r.va : g - r.va + step] in _ARM_PADDING[step]:
            g += step
        else:
            break
    if not 0 < at - g <= 16 or (not thumb and g % 4):
        return push
    reach = g
    for ins in backend.md(bool(thumb)).disasm(bytes(r.data[g - r.va : at - r.va]), g):  # type: ignore[attr-defined]
        m = ins.mnemonic.split(".")[0]
        ops = ins.op_str
        if m in ("b", "bl", "blx", "bx", "tbb", "tbh", "udf", "bkpt", "svc") or ops.startswith("pc") or "pc}" in ops:
            return push  # only straight-line code and forward exits (`cbz r0, 1f`) come before a push
        reach = ins.address + ins.size
    return g | thumb if reach == at else push


def _instruction_start(codemap: CodeMap, va: int) -> bool:
    r = codemap.region(va)
    return r is not None and r.state[va - r.va] in (1, 3)


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


def _self_contained(
    explorer: Explorer,
    start: int,
    gap_end: int,
    starts: dict[int, set[str]],
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
    memo: dict[int, dict[tuple[int, int], tuple[int, bool, int] | None]] | None = None,
    kit: GapPrologues | None = None,
) -> list[tuple[int, bool, int]]:
    """First non-padding address of each gap (code no function covers), whether it starts like a
    function, and where the gap ends. `memo` keeps the answer per gap between rounds (it depends
    on the gap's bounds and the code bytes only). `kit`: the prologue tests of MIPS, PowerPC and RISC-V."""
    out = []
    memo = {} if memo is None else memo
    for r in codemap.regions:
        seen = memo.setdefault(r.va, {})
        for span in _zero_runs(covered[r.va]):
            hit = seen.get(span, _MISS)
            if hit is _MISS:
                hit = seen[span] = _gap_candidate(r, arch, *span, kit)
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
    for a, b in _zero_runs(m, lo - r.va, min(hi, r.end) - r.va):
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


def _zero_runs(m: bytearray, pos: int = 0, stop: int | None = None) -> Iterator[tuple[int, int]]:
    """(start, end) of each maximal run of two or more zero bytes in a map of 0s and 1s (C-speed
    finds), within [pos, stop) when given (a run is cut at `stop`)."""
    find = m.find
    stop = len(m) if stop is None else stop
    while True:
        start = find(b"\x00\x00", pos, stop)
        if start < 0:
            return
        end = find(b"\x01", start, stop)
        if end < 0:
            end = stop
        yield start, end
        pos = end


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
