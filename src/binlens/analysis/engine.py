"""`analyze(image)`: the whole engine, in-process and pure (no I/O, no database)."""

from __future__ import annotations

import bisect
import dataclasses
import gc
import re
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from itertools import chain

from binlens.analysis.codemap import CodeMap, CodeRegion
from binlens.analysis.discovery import (
    NORETURN_NAMES,
    Body,
    Explorer,
    FragmentIndex,
    returning_functions,
)
from binlens.analysis.ehframe import parse_eh_frame
from binlens.analysis.functions import build_functions
from binlens.analysis.model import (
    SOURCES,
    T_BAD,
    T_CALL,
    T_COND,
    T_FALL,
    T_ICALL,
    T_JUMP,
    T_RET,
    XREF_KINDS,
    Function,
    ProgramAnalysis,
    Xref,
)
from binlens.analysis.strings import find_strings
from binlens.analysis.thunks import find_thunks
from binlens.analysis.xrefs import collect_xrefs, pointers_in_data
from binlens.errors import BinlensError
from binlens.loader.image import Image

ENGINE_VERSION = "2"  # 2: AArch64 jump tables
_K_OFFSET = XREF_KINDS.index("offset")
_GAP_ROUNDS = 200  # each round looks at the first address of every remaining gap
Progress = Callable[[float, float | None, str | None], None]
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
    rb"|\x8d\x76\x00|\x8d\x74\x26\x00|\x2e?\x8d\xb4\x26\x00\x00\x00\x00|\x8d\xbc\x27\x00\x00\x00\x00)*"
)


_gc_lock = threading.Lock()
_gc_pauses = 0  # analyses running now (threads)
_gc_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while an analysis runs (nesting and threads safe).

    The engine builds hundreds of thousands of small acyclic objects (chunk tuples, sets,
    blocks, references); each automatic collection re-scans all of them, which cost about a
    fifth of the run time on libc. Reference counting still frees everything as usual; the
    collector is restored (as it was) when the last running analysis ends.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


def make_backend(image: Image, codemap: CodeMap) -> object:
    """The decoder for the image's architecture, or `unsupported`."""
    arch = image.identity.arch
    if arch in ("x86-64", "x86"):
        from binlens.analysis.x86 import X86Backend

        return X86Backend(image, codemap)
    from binlens.analysis import capstone_backend

    if capstone_backend.supported(image):
        return capstone_backend.CapstoneBackend(image, codemap)
    raise BinlensError("unsupported", f"no disassembler for architecture {arch!r}")


class _Seeds:
    """Function starts with their sources, normalised (Thumb bit) and limited to code."""

    def __init__(self, image: Image, codemap: CodeMap, backend: object) -> None:
        self.codemap = codemap
        self.backend = backend
        self.arm = image.identity.arch == "arm"
        self.starts: dict[int, set[str]] = {}

    def add(self, va: int, source: str) -> int | None:
        if self.arm and va & 1:
            va &= ~1
            self.backend.thumb.add(va)  # type: ignore[attr-defined]
        if not self.codemap.contains(va):
            return None
        self.starts.setdefault(va, set()).add(source)
        return va


def analyze(
    image: Image,
    progress: Progress | None = None,
    extra_starts: list[int] | tuple[int, ...] = (),
    excluded_starts: list[int] | tuple[int, ...] = (),
) -> ProgramAnalysis:
    """Run the full analysis of `image`: functions, blocks, references, strings, call graph.

    `extra_starts` are function starts a user defined; `excluded_starts` ones a user removed.
    `progress(done, total, message)` is called along the way and may raise to cancel.
    """
    with gc_paused():
        return _analyze(image, progress, extra_starts, excluded_starts)


def _analyze(
    image: Image,
    progress: Progress | None,
    extra_starts: list[int] | tuple[int, ...],
    excluded_starts: list[int] | tuple[int, ...],
) -> ProgramAnalysis:
    t0 = time.perf_counter()
    report = progress or (lambda done, total, msg: None)
    image = _text_names(image)
    codemap = CodeMap(image)
    backend = make_backend(image, codemap)
    report(0, None, "reading metadata")
    seeds = _Seeds(image, codemap, backend)
    thunks = _metadata_seeds(image, seeds)
    for va in extra_starts:
        seeds.add(va, "user")
    fdes = parse_eh_frame(image)
    extents: dict[int, int] = {}
    for s in image.symbols:
        if s.kind == "function" and s.size and codemap.contains(s.address):
            extents[s.address & ~1 if seeds.arm else s.address] = s.size
    fragments = []
    for fde in fdes:
        if fde.entry:
            va = seeds.add(fde.start, "eh_frame")
            if va is not None and fde.size:
                extents[va] = fde.size
        else:
            fragments.append((fde.start, fde.size))
    frag = FragmentIndex(fragments)
    excluded = set(excluded_starts)
    for va in excluded:
        seeds.starts.pop(va, None)
    noret_slots = {imp.slot for imp in image.imports if imp.name in NORETURN_NAMES}
    named_noret = {va for va, name in thunks.items() if name in NORETURN_NAMES}
    named_noret |= {s.address for s in image.symbols if s.name in NORETURN_NAMES and codemap.contains(s.address)}
    jt_tables: dict[int, int] = {}
    explorer = Explorer(
        codemap,
        backend,
        _jump_table_fn(image, codemap, backend, jt_tables),
        cond_preds=image.identity.arch == "aarch64",
    )
    code_total = max(1, codemap.total_bytes)
    explorer.progress = lambda done, _t, _m: report(
        min(0.6, 0.6 * done / code_total), 1.0, f"decoding: {min(100, 100 * done // code_total)}% of code bytes reached"
    )

    bodies, starts, noret = _discover(
        explorer, seeds.starts, extents, frag, noret_slots | named_noret, noret_slots, excluded
    )
    # Careful heuristics, most trusted first; each stage re-runs discovery before the next looks.
    # Data pointers come after the gaps: a switch table of a function nothing has reached yet
    # would otherwise turn its case labels into functions.
    # Within data pointers, targets that start like functions go first for the same reason.
    stages = ["code_offsets"] + ["gaps"] * _GAP_ROUNDS + ["data_prologues", "data_pointers"]
    stages += ["gaps"] * _GAP_ROUNDS
    skip_gaps = False
    # x86 chunks never overlap (every byte is checked); capstone's fixed-width decoders can
    # overlap a chunk begun at a misaligned address, so they recount each round
    gaps = _Gaps(codemap, explorer, disjoint=image.identity.arch in ("x86-64", "x86"))
    for stage in stages:
        if stage != "gaps":
            skip_gaps = False
        elif skip_gaps:
            continue
        report(0.7, 1.0, f"{len(bodies)} functions; heuristics: {stage}")
        extra = _heuristic_starts(image, codemap, explorer, backend, starts, extents, bodies, stage, gaps)
        if not extra and stage == "gaps":
            skip_gaps = True
        if extra:
            for va, src in extra.items():
                if va not in excluded:
                    seeds.starts.setdefault(va, set()).add(src)
            bodies, starts, noret = _discover(explorer, seeds.starts, extents, frag, noret, noret_slots, excluded)
    del gaps  # its coverage map and counts are of no further use
    explorer.finish()
    covered = _covered(codemap, explorer, bodies)  # here, its set reuses the memory just freed
    report(0.85, 1.0, f"{len(bodies)} functions; references and strings")
    # references first: their transient sets then do not coexist with the functions' blocks (lower peak memory)
    strings = find_strings(image)
    xrefs = collect_xrefs(image, codemap, backend, explorer, bodies, strings, jt_tables)
    nchunks = len(explorer.chunks)
    functions = build_functions(image, codemap, explorer, bodies, starts, extents, thunks, noret, consume=True)
    stats = {"seconds": time.perf_counter() - t0, "chunks": float(nchunks)}
    report(1.0, 1.0, f"{len(functions)} functions")
    return ProgramAnalysis(
        engine_version=ENGINE_VERSION,
        arch=image.identity.arch,
        functions=functions,
        xrefs=xrefs,
        strings=strings,
        code_bytes=codemap.total_bytes,
        covered_bytes=covered,
        stats=stats,
    )


def analyze_functions(
    image: Image,
    entries: list[int],
    starts: set[int],
    noreturn: set[int],
    string_starts: set[int] = frozenset(),  # type: ignore[assignment]
) -> tuple[list[Function], list[Xref]]:
    """Local analysis: the bodies of `entries` alone, with `starts` as every other known entry.

    Used when a user defines or undefines a function: only the functions around it change.
    Returns those functions and the references made from their code (no data pointers).
    """
    with gc_paused():
        return _analyze_functions(image, entries, starts, noreturn, string_starts)


def _analyze_functions(
    image: Image,
    entries: list[int],
    starts: set[int],
    noreturn: set[int],
    string_starts: set[int],
) -> tuple[list[Function], list[Xref]]:
    image = _text_names(image)
    codemap = CodeMap(image)
    backend = make_backend(image, codemap)
    seeds = _Seeds(image, codemap, backend)
    thunks = {va: name for va, name in find_thunks(image, codemap).items() if codemap.contains(va)}
    extents: dict[int, int] = {}
    fragments = []
    for fde in parse_eh_frame(image):
        if fde.entry and fde.size:
            extents[fde.start] = fde.size
        elif not fde.entry:
            fragments.append((fde.start, fde.size))
    for s in image.symbols:
        if s.kind == "function" and s.size and codemap.contains(s.address):
            extents.setdefault(s.address, s.size)
    entries = [va for va in (seeds.add(e, "user") for e in entries) if va is not None]
    noret = set(noreturn) | {imp.slot for imp in image.imports if imp.name in NORETURN_NAMES}
    jt_tables: dict[int, int] = {}
    explorer = Explorer(
        codemap,
        backend,
        _jump_table_fn(image, codemap, backend, jt_tables),
        cond_preds=image.identity.arch == "aarch64",
    )
    explorer.traverse(entries, noret)
    for _ in range(4):
        more = explorer.retry_tables()
        if not more:
            break
        explorer.traverse(entries + more, noret)
    everything = set(starts) | set(entries)
    bodies, _new = explorer.partition(everything, extents, FragmentIndex(fragments), noret)
    explorer.finish()
    mine = {f: bodies[f] for f in entries if f in bodies}
    functions = build_functions(image, codemap, explorer, mine, {f: set() for f in mine}, extents, thunks, noret)
    xrefs = collect_xrefs(image, codemap, backend, explorer, mine, set(string_starts), jt_tables, data=False)
    return functions, xrefs


def _text(value: object) -> str:
    return value.decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)


def _text_names(image: Image) -> Image:
    """The image with every section and symbol name as text (malformed files can carry raw bytes)."""
    lists = {"sections": image.sections, "symbols": image.symbols, "exports": image.exports, "imports": image.imports}
    fixed = {}
    for key, items in lists.items():
        if any(not isinstance(x.name, str) or not isinstance(getattr(x, "raw_name", ""), str) for x in items):
            fixed[key] = [
                dataclasses.replace(
                    x, name=_text(x.name), **({"raw_name": _text(x.raw_name)} if hasattr(x, "raw_name") else {})
                )
                for x in items
            ]
    return dataclasses.replace(image, **fixed) if fixed else image


def _metadata_seeds(image: Image, seeds: _Seeds) -> dict[int, str]:
    ident = image.identity
    if ident.entry:
        seeds.add(ident.entry, "entry")
    for s in image.symbols:
        if s.kind == "function" or (s.kind == "other" and ident.format != "ELF"):
            seeds.add(s.address, "symbol")
    for e in image.exports:
        seeds.add(e.address, "export")
    for key, source in (("pdata", "pdata"), ("function_starts", "function_starts")):
        for va in image.function_hints.get(key, []):
            seeds.add(va, source)
    for key in ("init_array", "fini_array", "ctor", "dtor"):
        for va in image.function_hints.get(key, []):
            seeds.add(va, "pointer")
    if ident.format == "ELF":
        for s in image.sections:
            if s.name in (".init", ".fini") and s.size:
                seeds.add(s.va, "entry")
    thunks: dict[int, str] = {}
    for va, name in find_thunks(image, seeds.codemap).items():
        got = seeds.add(va, "thunk")
        if got is not None:
            thunks[got] = name
    return thunks


def _jump_table_fn(image: Image, codemap: CodeMap, backend: object, tables: dict[int, int]) -> Callable | None:
    if image.identity.arch == "aarch64":
        from binlens.analysis.jumptable_a64 import a64_jump_table_targets as jump_table_targets
    elif image.identity.arch in ("x86-64", "x86"):
        from binlens.analysis.jumptable import jump_table_targets
    else:
        return None

    def resolve(slice_start: int, jump_va: int, earlier: list[tuple[int, int]]) -> tuple[list[int], bool]:
        targets, table, guarded = jump_table_targets(backend, codemap, slice_start, jump_va, earlier)
        if table:
            tables[jump_va] = table
        return targets, guarded

    return resolve


def _discover(
    explorer: Explorer,
    seeds: dict[int, set[str]],
    extents: dict[int, int],
    frag: FragmentIndex,
    noret: set[int],
    noret_slots: set[int],
    excluded: set[int],
) -> tuple[dict[int, Body], dict[int, set[str]], set[int]]:
    """Descent + partition + non-returning fixpoint, repeated until nothing changes."""
    noret = set(noret)
    for _round in range(8):
        starts = {va: set(src) for va, src in seeds.items()}
        _reached, calls = explorer.traverse(list(starts), noret)
        for _ in range(4):
            more = explorer.retry_tables()
            if not more:
                break
            _reached, calls = explorer.traverse(list(starts) + more, noret)
        for c in calls:
            if c in explorer.chunks and c not in excluded:
                starts.setdefault(c, set()).add("call")
        while True:
            bodies, new = explorer.partition(set(starts), extents, frag, noret)
            new = {s for s in new if s not in starts and s in explorer.chunks and s not in excluded}
            if not new:
                break
            for s in new:
                starts[s] = {"tail_call"}
        cold = _cold_parts(bodies, starts, extents)
        if cold:
            # frameless cold parts have entry-state CFI: demote them to fragments and redo the round
            for va in cold:
                seeds.pop(va, None)
            frag = FragmentIndex(frag.ranges + [(va, extents.pop(va)) for va in cold])
            continue
        returns = returning_functions(bodies, noret_slots)
        found = {f for f in bodies if f not in returns} - noret
        if not found:
            return bodies, starts, noret
        noret |= found
    return bodies, starts, noret


def _cold_parts(bodies: dict[int, Body], starts: dict[int, set[str]], extents: dict[int, int]) -> set[int]:
    """Unwind-only starts that one other function enters only by conditional jumps (gcc `.cold` parts)."""
    refs: dict[int, set[int]] = {}
    for f, b in bodies.items():
        for s in b.cond_tails:
            refs.setdefault(s, set()).add(f)
    # candidates first: the references from all other bodies are gathered only when there are some
    cands = {}
    for s, fs in refs.items():
        if len(fs) == 1 and starts.get(s) == {"eh_frame"} and s in extents:
            (f,) = fs
            if s < f:
                cands[s] = f
    if not cands:
        return set()
    other: set[int] = set()
    for b in bodies.values():
        other.update(callee for _site, callee in b.calls)
        other.update(callee for _site, callee in b.tails if callee not in b.cond_tails)
    return {s for s in cands if s not in other}


def _heuristic_starts(
    image: Image,
    codemap: CodeMap,
    explorer: Explorer,
    backend: object,
    starts: dict[int, set[str]],
    extents: dict[int, int],
    bodies: dict[int, Body],
    stage: str,
    gaps: _Gaps | None = None,
) -> dict[int, str]:
    """Careful guesses for code nothing reached: code pointers, then prologues in gaps."""
    inside = FragmentIndex(list(extents.items()))
    spans: list[FragmentIndex] = []

    def inside_body(va: int) -> bool:
        if not spans:
            spans.append(FragmentIndex(_body_spans(explorer, bodies)))
        return spans[0](va)

    out: dict[int, str] = {}

    def unexplored(va: int) -> bool:
        r = codemap.region(va)
        return r is not None and r.state[va - r.va] == 0 and not (inside(va) and va not in extents)

    x86 = image.identity.arch in ("x86-64", "x86")

    def accept(va: int, source: str, need_ret: bool = False) -> None:
        if va in starts or va in out:
            return
        if not unexplored(va):
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
        if source == "pointer" and inside_body(va) and not (x86 and _starts_like_function(codemap, va)):
            return  # a label inside a function (computed goto, unresolved table), not an entry
        c = explorer.chunk(va)
        if c is not None and c[1] != T_BAD and (not need_ret or c[1] in (T_RET, T_JUMP)):
            out[va] = source

    if stage == "code_offsets":
        reached = sorted(chain.from_iterable(b.chunks for b in bodies.values()))  # repeats are harmless
        ends = [explorer.chunks[a][0] for a in reached]
        b = backend
        for src, dst, kind in zip(b.x_src, b.x_dst, b.x_kind, strict=False):  # type: ignore[attr-defined]
            if kind == _K_OFFSET and codemap.contains(dst):
                i = bisect.bisect_right(reached, src) - 1
                if i >= 0 and src < ends[i]:
                    accept(dst, "pointer")
    elif stage in ("data_prologues", "data_pointers"):
        for _src, dst in pointers_in_data(image, codemap, set()):
            if stage == "data_pointers" or (x86 and _starts_like_function(codemap, dst)):
                accept(dst, "pointer")
    elif image.identity.arch in ("x86-64", "x86", "aarch64"):
        # Gaps are code no function covers (code decoded on a path later found dead counts too).
        gaps = gaps or _Gaps(codemap, explorer, disjoint=x86)
        covered = gaps.covered(bodies)

        def free(va: int) -> bool:
            r = codemap.region(va)
            return r is not None and r.state[va - r.va] != 2 and not (inside(va) and va not in extents)

        def other_gap(target: int, lo: int, hi: int) -> bool:
            """An aligned, uncovered address outside this gap: the entry of another unreached function."""
            if lo <= target < hi or target % 16:
                return False
            r = codemap.region(target)
            return r is not None and not covered[r.va][target - r.va] and r.state[target - r.va] != 2

        cands = _gap_candidates(codemap, image.identity.arch, covered, gaps.memo)
        for va, prologue, _gap_end in cands:
            if prologue and va not in starts and free(va):
                c = explorer.chunk(va)
                if c is not None and c[1] != T_BAD:
                    out[va] = "prologue"
        if out:
            return out  # let descent from these claim their gaps before weaker guesses
        tried: set[int] = set()
        for _ in range(64):  # a rejected trial leaves the rest of its gap as a new gap
            fresh = [(va, end) for va, pro, end in cands if not pro and va not in tried]
            if not fresh:
                break
            for va, gap_end in fresh:
                tried.add(va)
                if not (x86 and va % 16 == 0 and va not in starts and free(va)):
                    continue
                ok, seen = _self_contained(explorer, va, gap_end, starts, other_gap)
                if ok:
                    out[va] = "prologue"
                else:
                    _cover(codemap, covered, explorer, seen)
            if out:
                break
            cands = _gap_candidates(codemap, image.identity.arch, covered, gaps.memo)
    return out


class _Gaps:
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


def _instruction_start(codemap: CodeMap, va: int) -> bool:
    r = codemap.region(va)
    return r is not None and r.state[va - r.va] in (1, 3)


def _starts_like_function(codemap: CodeMap, va: int) -> bool:
    r = codemap.region(va)
    return r is not None and r.data.startswith(_X86_PROLOGUES, va - r.va)


def _self_contained(
    explorer: Explorer,
    start: int,
    gap_end: int,
    starts: dict[int, set[str]],
    elsewhere: Callable[[int, int, int], bool] = lambda va, lo, hi: False,
) -> tuple[bool, set[int]]:
    """Does code decoded from `start` stay inside its gap (leaving only by calls and tail calls)?

    Unreached blocks of a function (cases of an unresolved switch, code after a call wrongly
    thought to return) jump back into explored code; a function that nothing calls does not.
    """
    stack = [start]
    seen: set[int] = set()
    rets = 0
    while stack:
        a = stack.pop()
        if a in seen:
            continue
        seen.add(a)
        if len(seen) > 4096:
            return False, seen
        if a != start and a in starts:
            continue
        if not start <= a < gap_end:
            return False, seen
        c = explorer.chunk(a)
        if c is None or c[1] == T_BAD:
            return False, seen
        _end, term, t, _last = c
        if term == T_JUMP and t[0] != start and (t[0] in starts or elsewhere(t[0], start, gap_end)):
            rets += 1  # a tail call to a known function, or to an aligned entry in another gap
        elif term in (T_FALL, T_JUMP):
            stack.append(t[0])
        elif term == T_COND:
            stack.extend(t)
        elif term in (T_CALL, T_ICALL):
            stack.append(t[1])
        elif term == T_RET:
            rets += 1
    return rets > 0, seen


def _gap_candidates(
    codemap: CodeMap,
    arch: str,
    covered: dict[int, bytearray],
    memo: dict[int, dict[tuple[int, int], tuple[int, bool, int] | None]] | None = None,
) -> list[tuple[int, bool, int]]:
    """First non-padding address of each gap (code no function covers), whether it starts like a
    function, and where the gap ends. `memo` keeps the answer per gap between rounds (it depends
    on the gap's bounds and the code bytes only)."""
    out = []
    memo = {} if memo is None else memo
    for r in codemap.regions:
        seen = memo.setdefault(r.va, {})
        for span in _zero_runs(covered[r.va]):
            hit = seen.get(span, _MISS)
            if hit is _MISS:
                hit = seen[span] = _gap_candidate(r, arch, *span)
            if hit is not None:
                out.append(hit)
    return out


def _zero_runs(m: bytearray) -> Iterator[tuple[int, int]]:
    """(start, end) of each maximal run of two or more zero bytes in a map of 0s and 1s (C-speed finds)."""
    find = m.find
    pos = 0
    while True:
        start = find(b"\x00\x00", pos)
        if start < 0:
            return
        end = find(b"\x01", start)
        if end < 0:
            end = len(m)
        yield start, end
        pos = end


def _gap_candidate(r: CodeRegion, arch: str, off: int, end: int) -> tuple[int, bool, int] | None:
    """The candidate of the gap [off, end) of region `r` (offsets), or None when it is all padding."""
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


def _covered(codemap: CodeMap, explorer: Explorer, bodies: dict[int, Body]) -> int:
    """Bytes in the chunks of all bodies (each chunk once)."""
    seen = set()
    total = 0
    get = explorer.chunks.get
    for b in bodies.values():
        for a in b.chunks:
            if a not in seen:
                seen.add(a)
                c = get(a)
                if c is not None:
                    total += c[0] - a
    return total


__all__ = ["ENGINE_VERSION", "SOURCES", "analyze", "analyze_functions"]
