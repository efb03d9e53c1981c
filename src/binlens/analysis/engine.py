"""`analyze(image)`: the whole engine, in-process and pure (no I/O, no database)."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from collections.abc import Callable, Container, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from typing import Any

from binlens.analysis.arch.profiles import profile
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode.backend import Backend, make_backend
from binlens.analysis.discovery.explorer import NORETURN_NAMES, Explorer
from binlens.analysis.discovery.functions import iter_functions
from binlens.analysis.discovery.noreturn import noret_callers, returning_functions
from binlens.analysis.discovery.refused import RefusedStarts, data_like_test
from binlens.analysis.heuristics.arm import arm_labels
from binlens.analysis.heuristics.gapmap import Gaps
from binlens.analysis.heuristics.starts import heuristic_starts
from binlens.analysis.intervals import IntervalSet
from binlens.analysis.metadata.armexidx import seed_exidx_starts
from binlens.analysis.metadata.ehframe import parse_eh_frame
from binlens.analysis.metadata.seeds import Seeds, with_source
from binlens.analysis.metadata.thunks import find_thunks
from binlens.analysis.model import (
    SOURCES,
    XREF_KINDS,
    Body,
    FoundString,
    Function,
    ProgramAnalysis,
    Refs,
    Xref,
)
from binlens.analysis.native.kernels import native
from binlens.analysis.refs.strings import find_strings, past_the_top
from binlens.analysis.refs.xrefs import collect_refs, pointers_in_data
from binlens.analysis.switches.gotos import goto_tables
from binlens.analysis.switches.resolvers import resolver_for
from binlens.analysis.version import ENGINE_VERSION
from binlens.loader.image import Image, Section, Symbol

# Discovery walks each body without its edges (`Explorer.record_edges`; `None`: with them, as the
# tests compare): they are walked once when it ends, and on demand for the non-returning test.
_EDGES_LATER: bool | None = True

_K_OFFSET = XREF_KINDS.index("offset")
_descent = native("_descent")  # `_covered` in C (the same sum), or None
ROUNDS = 8  # rounds of descent + partition + non-returning fixpoint in one `_discover` at most
_GAP_ROUNDS = 200  # each round looks at the first address of every remaining gap
_OFFSET_ROUNDS = 8  # each round looks at the addresses taken by code reached so far
Progress = Callable[[float, float | None, str | None], None]
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
        explored = explore(image, progress, extra_starts, excluded_starts)
        strings, refs = explored.references()
        return explored.result(explored.functions(), refs.xrefs(), strings)


@dataclasses.dataclass
class Explored:
    """The engine after discovery and heuristics: every function's code is found. What remains are
    two independent parts, the references (with strings) and the functions' blocks; the analysis
    process runs them in two processes at once (`jobs/fork.py`), `analyze` one after the other."""

    image: Image
    codemap: CodeMap
    backend: Backend
    explorer: Explorer
    bodies: dict[int, Body]
    starts: dict[int, frozenset[str]]
    extents: dict[int, int]
    thunks: dict[int, str]
    noret: set[int]
    jt_tables: dict[int, int]
    covered: int
    rounds: int
    report: Progress
    t0: float
    chunk_count: int = 0
    warnings: list[str] = dataclasses.field(default_factory=list)  # what of the image was not analysed, and why

    def references(self) -> tuple[list[FoundString], Refs]:
        """(strings, references packed): what `ProgramAnalysis` holds of them (`Refs.xrefs` gives the
        references as objects)."""
        self.report(0.85, 1.0, f"{len(self.bodies)} functions; references and strings")
        strings = find_strings(self.image)
        refs = collect_refs(self.image, self.codemap, self.backend, self.explorer, self.bodies, strings, self.jt_tables)
        return strings, refs

    def functions(self, part: tuple[int, int] | None = None) -> list[Function]:
        """Every function with its blocks and edges (`part`: only those of the bodies at places lo..hi
        in address order). Consumes the bodies and chunks: call it after `references`, and once for
        each body (references first also keeps their transient sets from coexisting with the blocks:
        a lower peak of memory)."""
        return list(self.iter_functions(part))

    def iter_functions(self, part: tuple[int, int] | None = None) -> Iterator[Function]:
        """`functions`, each built as it is asked for (the analysis process turns them into rows a
        batch at a time)."""
        return iter_functions(
            self.image,
            self.codemap,
            self.explorer,
            self.bodies,
            self.starts,
            self.extents,
            self.thunks,
            self.noret,
            consume=True,
            part=part,
        )

    def drop(self, part: tuple[int, int]) -> None:
        """Forget the bodies at places lo..hi in address order, and the chunks only they hold (another
        process builds those functions: here they would only take memory)."""
        order = sorted(self.bodies)
        lo, hi = part
        kept = self.codemap.address_set()  # (a bit per code byte: a set of libc's would be a 2 MiB transient)
        keep = kept.add
        for f in (*order[:lo], *order[hi:]):
            for a in self.bodies[f].chunks:
                keep(a)
        chunks = self.explorer.chunks
        for f in order[lo:hi]:
            for a in self.bodies.pop(f).chunks:
                if a not in kept and a in chunks:
                    del chunks[a]  # (`pop` would build the chunk's tuple only to drop it)

    def result(self, functions: list[Function], xrefs: list[Xref], strings: list[FoundString]) -> ProgramAnalysis:
        """The finished analysis."""
        stats = {
            "seconds": time.perf_counter() - self.t0,
            "chunks": float(self.chunk_count),
            "heuristic_rounds": float(self.rounds),
        }
        self.report(1.0, 1.0, f"{len(functions)} functions")
        return ProgramAnalysis(
            engine_version=ENGINE_VERSION,
            arch=self.image.identity.arch,
            functions=functions,
            xrefs=xrefs,
            strings=strings,
            code_bytes=self.codemap.total_bytes,
            covered_bytes=self.covered,
            stats=stats,
            warnings=list(self.warnings),
        )


def explore(
    image: Image,
    progress: Progress | None = None,
    extra_starts: list[int] | tuple[int, ...] = (),
    excluded_starts: list[int] | tuple[int, ...] = (),
) -> Explored:
    """The engine up to the point where every function's code is found (see `Explored`); call it
    with the garbage collector paused (`gc_paused`), as `analyze` does."""
    t0 = time.perf_counter()
    report = progress or (lambda done, total, msg: None)
    image = _text_names(image)
    codemap = CodeMap(image)
    backend = make_backend(image, codemap)
    report(0, None, "reading metadata")
    seeds = Seeds(image, codemap, backend)
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
    frag = IntervalSet(fragments)
    excluded = set(excluded_starts)
    for va in excluded:
        seeds.starts.pop(va, None)
    # what may not become a function start: the user's removed starts, and in an ARM32 Mach-O section
    # that LC_FUNCTION_STARTS covers, any address the linker did not list there
    refused = RefusedStarts(image, excluded)
    data_like = data_like_test(image)
    noret_slots = {imp.slot for imp in image.imports if imp.name in NORETURN_NAMES}
    named_noret = {va for va, name in thunks.items() if name in NORETURN_NAMES}
    named_noret |= {s.address for s in image.symbols if s.name in NORETURN_NAMES and codemap.contains(s.address)}
    jt_tables: dict[int, int] = {}
    explorer = make_explorer(image, codemap, backend, jt_tables)
    explorer.record_edges = _EDGES_LATER is None  # (until discovery ends: `restore_edges`)
    known = extents  # where the heuristics look for no new starts: unwind ranges and sized symbols
    if seeds.arm:  # ARM EHABI unwind index: its starts, each in its state (after what calls decide)
        ranges = seed_exidx_starts(image, backend, explorer, list(seeds.starts), noret_slots | named_noret, seeds.add)
        known = {**ranges, **extents}
        for va in excluded:
            seeds.starts.pop(va, None)
    code_total = max(1, codemap.total_bytes)
    explorer.progress = lambda done, _t, _m: report(
        min(0.6, 0.6 * done / code_total), 1.0, f"decoding: {min(100, 100 * done // code_total)}% of code bytes reached"
    )

    bodies, starts, noret = _discover(
        explorer, seeds.starts, extents, frag, noret_slots | named_noret, noret_slots, refused
    )
    # Careful heuristics, most trusted first; each stage re-runs discovery before the next looks.
    # Data pointers come after the gaps: a switch table of a function nothing has reached yet
    # would otherwise turn its case labels into functions.
    # Within data pointers, targets that start like functions go first for the same reason.
    offsets = ["code_offsets"] * _OFFSET_ROUNDS
    stages = offsets + ["gaps"] * _GAP_ROUNDS + offsets + ["data_prologues", "data_pointers"]
    stages += offsets + ["gaps"] * _GAP_ROUNDS + offsets
    exhausted: set[str] = set()  # repeated stages that found nothing since the last find
    gaps = Gaps(codemap, explorer)  # the gap stage's held chunks, counted between its rounds
    rounds = 0  # heuristic rounds that found starts (each runs discovery again)
    for stage in stages:
        if stage == "data_pointers":
            gaps.after_data = True
            if seeds.arm:  # ARM32 gaps have leaf guesses that wait for this: look at the gaps again
                exhausted.discard("gaps")
        if stage in exhausted:
            continue
        report(0.7, 1.0, f"{len(bodies)} functions; heuristics: {stage}")
        extra = heuristic_starts(image, codemap, explorer, backend, starts, known, bodies, stage, gaps)
        extra = {va: src for va, src in extra.items() if va not in refused and not data_like(va)}
        if not extra:
            exhausted.add(stage)
        else:
            rounds += 1
            exhausted.clear()  # new code: every stage may find more in it
            for va, src in extra.items():
                seeds.starts[va] = with_source(seeds.starts.get(va), src)
            bodies, starts, noret = _discover(explorer, seeds.starts, extents, frag, noret, noret_slots, refused)
            labels = arm_labels(explorer, backend, bodies, seeds.starts) if seeds.arm else set()
            if labels:  # ARM: gap guesses that code found since runs into
                for va in labels:
                    del seeds.starts[va]
                bodies, starts, noret = _discover(explorer, seeds.starts, extents, frag, noret, noret_slots, refused)
            if stage in ("data_prologues", "data_pointers"):
                entries = _table_entry_seeds(image, codemap, explorer, backend, jt_tables, seeds.starts)
                labels, gotos = goto_tables(image, codemap, explorer, backend, bodies, starts)
                if entries or gotos:
                    for va in entries | labels:
                        seeds.starts.pop(va, None)
                    explorer.gotos += gotos
                    bodies, starts, noret = _discover(
                        explorer, seeds.starts, extents, frag, noret, noret_slots, refused
                    )
    del gaps  # its coverage map and counts are of no further use
    explorer.restore_edges(bodies)  # (discovery walked without them)
    explorer.finish()
    covered = _covered(codemap, explorer, bodies)  # (each chunk once: its seen set is bits)
    return Explored(
        image,
        codemap,
        backend,
        explorer,
        bodies,
        starts,
        extents,
        thunks,
        noret,
        jt_tables,
        covered,
        rounds,
        report,
        t0,
        chunk_count=len(explorer.chunks),
        warnings=codemap.warnings + past_the_top(image),
    )


def _text(value: object) -> str:
    return value.decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)


def _text_names(image: Image) -> Image:
    """The image with every section and symbol name as text (malformed files can carry raw bytes)."""
    # records of four kinds, each with a `name` (and a `raw_name`, but sections), treated alike
    lists: dict[str, list[Any]] = {
        "sections": image.sections,
        "symbols": image.symbols,
        "exports": image.exports,
        "imports": image.imports,
    }
    fixed: dict[str, Any] = {}
    for key, items in lists.items():
        if any(not isinstance(x.name, str) or not isinstance(getattr(x, "raw_name", ""), str) for x in items):
            fixed[key] = [
                dataclasses.replace(
                    x, name=_text(x.name), **({"raw_name": _text(x.raw_name)} if hasattr(x, "raw_name") else {})
                )
                for x in items
            ]
    return dataclasses.replace(image, **fixed) if fixed else image


def _metadata_seeds(image: Image, seeds: Seeds) -> dict[int, str]:
    s: Symbol | Section  # (the loops below walk symbols, then sections)
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
    for key in ("init_array", "fini_array", "ctor", "dtor", "opd"):  # (opd: PowerPC64 ELFv1 descriptors)
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




def make_explorer(image: Image, codemap: CodeMap, backend: Backend, jt_tables: dict[int, int]) -> Explorer:
    """The explorer for `image`, with its architecture's jump-table reader (tables found go into
    `jt_tables`) and branch conventions."""
    isa = profile(image.identity.arch)
    return Explorer(
        codemap,
        backend,
        _jump_table_fn(image, codemap, backend, jt_tables),
        cond_preds=isa.cond_preds,
        cond_first=isa.cond_first,
        case_extent=isa.case_extent,
    )


def _jump_table_fn(
    image: Image, codemap: CodeMap, backend: Backend, tables: dict[int, int]
) -> Callable[[int, int, list[tuple[int, int]]], tuple[list[int], bool]] | None:
    jump_table_targets = resolver_for(image.identity.arch)
    if jump_table_targets is None:
        return None

    def resolve(slice_start: int, jump_va: int, earlier: list[tuple[int, int]]) -> tuple[list[int], bool]:
        targets, table, guarded = jump_table_targets(backend, codemap, slice_start, jump_va, earlier)
        if table:
            tables[jump_va] = table
        return targets, guarded

    return resolve


def _discover(
    explorer: Explorer,
    seeds: dict[int, frozenset[str]],
    extents: dict[int, int],
    frag: IntervalSet,
    noret: set[int],
    noret_slots: set[int],
    excluded: Container[int],
) -> tuple[dict[int, Body], dict[int, frozenset[str]], set[int]]:
    """Descent + partition + non-returning fixpoint, repeated until nothing changes."""
    noret = set(noret)
    chunks = explorer.chunks

    def accept(s: int) -> bool:  # a tail-call target that becomes a function start
        return s in chunks and s not in excluded

    for _round in range(ROUNDS):
        starts = dict(seeds)  # (the sources are shared frozensets: `with_source`)
        calls = explorer.traverse(list(starts), noret)[1]
        for _ in range(4):
            more = explorer.retry_tables()
            if not more:
                break
            calls = explorer.traverse(list(starts) + more, noret)[1]
        for c in calls:
            if c in explorer.chunks and c not in excluded:
                starts[c] = with_source(starts.get(c), "call")
        bodies, tails = explorer.partition(set(starts), extents, frag, noret, accept=accept)
        for s in tails:
            starts[s] = with_source(None, "tail_call")
        cold = _cold_parts(bodies, starts, extents)
        if cold:
            # frameless cold parts have entry-state CFI: demote them to fragments and redo the round
            for va in cold:
                seeds.pop(va, None)
            frag = IntervalSet(frag.ranges + [(va, extents.pop(va)) for va in cold])
            continue
        returns = returning_functions(bodies, noret_slots, explorer.chunks, explorer.body_edges)
        found = {f for f in bodies if f not in returns} - noret
        if not found:
            return bodies, starts, noret
        # the callers that cannot return without them, at once instead of one level a round
        found |= noret_callers(bodies, explorer.chunks, noret, found, noret_slots, explorer.body_edges)
        noret |= found
    # out of rounds: walk the bodies once more with what the last round learnt, so that they agree
    # with `noret` (no edge after a call to a function flagged as not returning) and the fragments
    bodies, _new = explorer.partition(set(starts), extents, frag, noret)
    return bodies, starts, noret


def _table_entry_seeds(
    image: Image,
    codemap: CodeMap,
    explorer: Explorer,
    backend: Backend,
    tables: dict[int, int],
    seeds: dict[int, frozenset[str]],
) -> set[int]:
    """Starts guessed from data pointers that turned out to be entries of a switch table.

    The data-pointer heuristic runs before the functions those pointers lead into are known, so
    an absolute-pointer switch table in `.rodata` looks like a list of function pointers. Once
    discovery has reached the switch and resolved its table (with a bound check), a start whose
    only evidence is pointers that all lie inside such tables, and no reference from code, is
    a case label: it is dropped, and the discovery that follows gives it back to its function.
    """
    guessed = {va for va, src in seeds.items() if src == {"pointer"}}
    if not guessed:
        return set()
    ptr = 8 if image.identity.bits == 64 else 4
    spans = []
    for jump, table in tables.items():
        cases = explorer.jt.get(jump)
        if cases and jump not in explorer.unguarded and guessed.intersection(cases):
            spans.append((table, table + ptr * len(cases)))
    if not spans:
        return set()
    inside = IntervalSet([(lo, hi - lo) for lo, hi in spans])
    in_table: dict[int, bool] = {}
    thumb_bit = profile(image.identity.arch).thumb_bit  # starts are even; Thumb pointers are odd
    for src, dst in pointers_in_data(image, codemap, set()):
        dst &= ~thumb_bit
        if dst in guessed:
            in_table[dst] = in_table.get(dst, True) and inside(src)
    from_code = {
        dst
        for dst, kind in zip(backend.x_dst, backend.x_kind, strict=True)
        if kind == _K_OFFSET and dst in guessed
    }
    return {va for va, ok in in_table.items() if ok and va not in from_code}


def _cold_parts(
    bodies: dict[int, Body], starts: Mapping[int, AbstractSet[str]], extents: dict[int, int]
) -> set[int]:
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
        other.update(b.calls[1::2])
        other.update(callee for _site, callee in b.tails if callee not in b.cond_tails)
    return {s for s in cands if s not in other}


def _covered(codemap: CodeMap, explorer: Explorer, bodies: dict[int, Body]) -> int:
    """Bytes in the chunks of all bodies (each chunk once)."""
    if _descent is not None:  # the same sum in C
        return _descent.covered(explorer.chunks, bodies, codemap.address_set())
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


__all__ = ["ENGINE_VERSION", "SOURCES", "Explored", "analyze", "explore"]
