"""`analyze(image)`: the whole engine, in-process and pure (no I/O, no database)."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from collections.abc import Callable, Container, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import contextmanager

from binlens.analysis.arch.profiles import profile
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode.backend import Backend, make_backend
from binlens.analysis.discovery.explorer import NORETURN_NAMES, Explorer
from binlens.analysis.discovery.functions import iter_functions
from binlens.analysis.discovery.noreturn import noret_callers, returning_functions
from binlens.analysis.discovery.refused import RefusedStarts, data_like_test
from binlens.analysis.heuristics.arm import arm_labels
from binlens.analysis.heuristics.gapmap import Gaps
from binlens.analysis.heuristics.round import Round
from binlens.analysis.heuristics.starts import DATA_STAGES, heuristic_starts, schedule
from binlens.analysis.intervals import IntervalSet
from binlens.analysis.metadata.armexidx import seed_exidx_starts
from binlens.analysis.metadata.ehframe import parse_eh_frame
from binlens.analysis.metadata.names import text_names
from binlens.analysis.metadata.seeds import Seeds, file_seeds, with_source
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
from binlens.loader.image import Image

# Discovery walks each body without its edges (`Explorer.record_edges`; `None`: with them, as the
# tests compare): they are walked once when it ends, and on demand for the non-returning test.
_EDGES_LATER: bool | None = True

_K_OFFSET = XREF_KINDS.index("offset")
_descent = native("_descent")  # `_covered` in C (the same sum), or None
ROUNDS = 8  # rounds of descent + partition + non-returning fixpoint in one `Discovery.run` at most
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
    flow_overrides: Mapping[int, str] | None = None,
) -> ProgramAnalysis:
    """Run the full analysis of `image`: functions, blocks, references, strings, call graph.

    `extra_starts` are function starts a user defined; `excluded_starts` ones a user removed;
    `flow_overrides` the instructions whose flow the user overrode (`discovery/overrides.py`).
    `progress(done, total, message)` is called along the way and may raise to cancel.
    """
    with gc_paused():
        explored = explore(image, progress, extra_starts, excluded_starts, flow_overrides)
        strings, refs = explored.references()
        return explored.result(explored.functions(), refs.xrefs(), strings)


@dataclasses.dataclass
class CodeReader:
    """The image and what the engine made to read its code: the code map, the decoder, the explorer
    (the chunk cache and the walks) and the jump tables its resolvers found (jump -> table address)."""

    image: Image
    codemap: CodeMap
    backend: Backend
    explorer: Explorer
    jt_tables: dict[int, int]


@dataclasses.dataclass
class Discovered:
    """What one discovery found: each function's body, the function starts with their sources, and
    the non-returning functions (and import slots)."""

    bodies: dict[int, Body]
    starts: dict[int, frozenset[str]]
    noret: set[int]


@dataclasses.dataclass
class Explored:
    """The engine after discovery and heuristics: every function's code is found. What remains are
    two independent parts, the references (with strings) and the functions' blocks; the analysis
    process runs them in two processes at once (`jobs/fork.py`), `analyze` one after the other."""

    reader: CodeReader
    found: Discovered
    extents: dict[int, int]  # unwind ranges and sized symbols: start -> bytes
    thunks: dict[int, str]  # import thunks: start -> the import's name
    report: Progress
    t0: float  # `time.perf_counter()` when the analysis began
    covered: int = 0  # bytes in the chunks of all bodies
    rounds: int = 0  # heuristic rounds that found starts
    chunk_count: int = 0
    warnings: list[str] = dataclasses.field(default_factory=list)  # what of the image was not analysed, and why

    def references(self) -> tuple[list[FoundString], Refs]:
        """(strings, references packed): what `ProgramAnalysis` holds of them (`Refs.xrefs` gives the
        references as objects)."""
        reader = self.reader
        self.report(0.85, 1.0, f"{len(self.found.bodies)} functions; references and strings")
        strings = find_strings(reader.image)
        refs = collect_refs(
            reader.image, reader.codemap, reader.backend, reader.explorer, self.found.bodies, strings, reader.jt_tables
        )
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
        reader, found = self.reader, self.found
        return iter_functions(
            reader.image,
            reader.codemap,
            reader.explorer,
            found.bodies,
            found.starts,
            self.extents,
            self.thunks,
            found.noret,
            consume=True,
            part=part,
        )

    def drop(self, part: tuple[int, int]) -> None:
        """Forget the bodies at places lo..hi in address order, and the chunks only they hold (another
        process builds those functions: here they would only take memory)."""
        bodies = self.found.bodies
        order = sorted(bodies)
        lo, hi = part
        kept = self.reader.codemap.address_set()  # (a bit per code byte: a set of libc's would be a 2 MiB transient)
        keep = kept.add
        for f in (*order[:lo], *order[hi:]):
            for a in bodies[f].chunks:
                keep(a)
        explorer = self.reader.explorer
        for f in order[lo:hi]:
            explorer.forget_chunks(bodies.pop(f).chunks, kept)

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
            arch=self.reader.image.identity.arch,
            functions=functions,
            xrefs=xrefs,
            strings=strings,
            code_bytes=self.reader.codemap.total_bytes,
            covered_bytes=self.covered,
            stats=stats,
            warnings=list(self.warnings),
        )


def explore(
    image: Image,
    progress: Progress | None = None,
    extra_starts: list[int] | tuple[int, ...] = (),
    excluded_starts: list[int] | tuple[int, ...] = (),
    flow_overrides: Mapping[int, str] | None = None,
) -> Explored:
    """The engine up to the point where every function's code is found (see `Explored`); call it
    with the garbage collector paused (`gc_paused`), as `analyze` does."""
    t0 = time.perf_counter()
    report = progress or (lambda done, total, msg: None)
    image = text_names(image)
    codemap = CodeMap(image)
    backend = make_backend(image, codemap)
    report(0, None, "reading metadata")
    seeds, thunks, extents, frag = _read_metadata(image, codemap, backend, extra_starts)
    excluded = set(excluded_starts)
    for va in excluded:
        seeds.starts.pop(va, None)
    # what may not become a function start: the user's removed starts, and in an ARM32 Mach-O section
    # that LC_FUNCTION_STARTS covers, any address the linker did not list there
    refused = RefusedStarts(image, excluded)
    data_like = data_like_test(image)
    noret_slots, named_noret = _named_noreturn(image, codemap, thunks)
    jt_tables: dict[int, int] = {}
    explorer = make_explorer(image, codemap, backend, jt_tables)
    explorer.override_flows(flow_overrides or {})
    if _EDGES_LATER is not None:
        explorer.defer_edges()  # (until discovery ends: `restore_edges`)
    reader = CodeReader(image, codemap, backend, explorer, jt_tables)
    known = extents  # where the heuristics look for no new starts: unwind ranges and sized symbols
    if seeds.arm:  # ARM EHABI unwind index: its starts, each in its state (after what calls decide)
        ranges = seed_exidx_starts(image, backend, explorer, list(seeds.starts), noret_slots | named_noret, seeds.add)
        known = {**ranges, **extents}
        for va in excluded:
            seeds.starts.pop(va, None)
    explorer.on_progress(_decoding_progress(report, codemap))
    discovery = Discovery(explorer, seeds, extents, frag, noret_slots, refused)
    found = discovery.run(noret_slots | named_noret)
    found, rounds = _heuristics(reader, discovery, found, known, data_like, report)
    explorer.restore_edges(found.bodies)  # (discovery walked without them)
    explorer.finish()
    return Explored(
        reader=reader,
        found=found,
        extents=extents,
        thunks=thunks,
        report=report,
        t0=t0,
        covered=_covered(codemap, explorer, found.bodies),  # (each chunk once: its seen set is bits)
        rounds=rounds,
        chunk_count=len(explorer.chunks),
        warnings=codemap.warnings + past_the_top(image),
    )


def _read_metadata(
    image: Image, codemap: CodeMap, backend: Backend, extra_starts: list[int] | tuple[int, ...]
) -> tuple[Seeds, dict[int, str], dict[int, int], IntervalSet]:
    """(the seeds, the import thunks, the extents, the fragments) the file's metadata and the user's
    starts give: seeds from the entry, symbols, exports, thunks, then the user's starts, then the
    `.eh_frame` FDEs in the entry state; extents from sized symbols and FDEs; fragments from the
    FDEs of code that is not an entry (cold parts)."""
    seeds = Seeds(image, codemap, backend)
    thunks = file_seeds(image, seeds)
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
            start = seeds.add(fde.start, "eh_frame")
            if start is not None and fde.size:
                extents[start] = fde.size
        else:
            fragments.append((fde.start, fde.size))
    return seeds, thunks, extents, IntervalSet(fragments)


def _named_noreturn(image: Image, codemap: CodeMap, thunks: dict[int, str]) -> tuple[set[int], set[int]]:
    """(the import slots, the thunks and symbols in code) of the functions whose names say they do
    not return (`NORETURN_NAMES`)."""
    noret_slots = {imp.slot for imp in image.imports if imp.name in NORETURN_NAMES}
    named_noret = {va for va, name in thunks.items() if name in NORETURN_NAMES}
    named_noret |= {s.address for s in image.symbols if s.name in NORETURN_NAMES and codemap.contains(s.address)}
    return noret_slots, named_noret


def _decoding_progress(report: Progress, codemap: CodeMap) -> Progress:
    """The walk's progress (code bytes reached) as the analysis's: up to 60%."""
    code_total = max(1, codemap.total_bytes)
    return lambda done, _t, _m: report(
        min(0.6, 0.6 * done / code_total), 1.0, f"decoding: {min(100, 100 * done // code_total)}% of code bytes reached"
    )


def _heuristics(
    reader: CodeReader,
    discovery: Discovery,
    found: Discovered,
    known: dict[int, int],
    data_like: Callable[[int], bool],
    report: Progress,
) -> tuple[Discovered, int]:
    """Careful heuristics in `heuristics.starts.SCHEDULE`'s order, most trusted first; each round that
    finds starts re-runs discovery before the next looks, and makes every stage worth running again
    (a stage that found nothing is skipped until then). Returns the last discovery and the number
    of rounds that found starts. `known`: where the heuristics look for no new starts."""
    seeds = discovery.seeds
    exhausted: set[str] = set()  # repeated stages that found nothing since the last find
    gaps = Gaps(reader.codemap, reader.explorer)  # the gap stage's held chunks, counted between its rounds
    rounds = 0
    for stage in schedule():
        if stage == "data_pointers":
            gaps.after_data = True
            if seeds.arm:  # ARM32 gaps have leaf guesses that wait for this: look at the gaps again
                exhausted.discard("gaps")
        if stage in exhausted:
            continue
        report(0.7, 1.0, f"{len(found.bodies)} functions; heuristics: {stage}")
        guess = Round(reader.image, reader.explorer, found.starts, known, found.bodies, gaps)
        extra = heuristic_starts(stage, guess)
        extra = {va: src for va, src in extra.items() if va not in discovery.refused and not data_like(va)}
        if not extra:
            exhausted.add(stage)
            continue
        rounds += 1
        exhausted.clear()  # new code: every stage may find more in it
        found = _rediscover(reader, discovery, found, stage, extra)
    return found, rounds


def _rediscover(
    reader: CodeReader, discovery: Discovery, found: Discovered, stage: str, extra: dict[int, str]
) -> Discovered:
    """Discovery again with a heuristic round's starts (`extra`); then, ARM32, again without the gap
    guesses that code found since runs into; after a data stage, again without the data pointers
    that turn out to be switch-table entries or computed-goto labels."""
    starts = discovery.seeds.starts
    for va, src in extra.items():
        starts[va] = with_source(starts.get(va), src)
    found = discovery.run(found.noret)
    labels = arm_labels(reader.explorer, reader.backend, found.bodies, starts) if discovery.seeds.arm else set()
    if labels:  # ARM: gap guesses that code found since runs into
        for va in labels:
            del starts[va]
        found = discovery.run(found.noret)
    if stage in DATA_STAGES:
        entries = _table_entry_seeds(reader, starts)
        labels, gotos = goto_tables(
            reader.image, reader.codemap, reader.explorer, reader.backend, found.bodies, found.starts
        )
        if entries or gotos:
            for va in entries | labels:
                starts.pop(va, None)
            reader.explorer.add_gotos(gotos)
            found = discovery.run(found.noret)
    return found


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


class Discovery:
    """Descent + partition + non-returning fixpoint from the seeds, repeated until nothing changes;
    `run` again after each change of the seeds."""

    def __init__(
        self,
        explorer: Explorer,
        seeds: Seeds,
        extents: dict[int, int],
        frag: IntervalSet,
        noret_slots: set[int],
        refused: Container[int],
    ) -> None:
        """`extents`: unwind ranges and sized symbols (a cold part found is dropped from them and from
        the seeds); `frag`: the code ranges that are parts of functions, not entries; `noret_slots`:
        the import slots of non-returning functions; `refused`: where no function may start."""
        self.explorer = explorer
        self.seeds = seeds
        self.extents = extents
        self.frag = frag
        self.noret_slots = noret_slots
        self.refused = refused

    def run(self, noret: set[int]) -> Discovered:
        """Discover from the seeds as they are now, with the functions `noret` known not to return."""
        explorer, extents, excluded = self.explorer, self.extents, self.refused
        seeds = self.seeds.starts
        noret = set(noret)
        frag = self.frag  # (the cold parts a run demotes are fragments of that run only)
        chunks = explorer.chunks

        def accept(s: int) -> bool:  # a tail-call target that becomes a function start
            return s in chunks and s not in excluded

        for _round in range(ROUNDS):
            starts = dict(seeds)  # (the sources are shared frozensets: `with_source`)
            self._add_calls(starts, noret)
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
            found = self._not_returning(bodies, noret)
            if not found:
                return Discovered(bodies, starts, noret)
            noret |= found
        # out of rounds: walk the bodies once more with what the last round learnt, so that they agree
        # with `noret` (no edge after a call to a function flagged as not returning) and the fragments
        bodies, _new = explorer.partition(set(starts), extents, frag, noret)
        return Discovered(bodies, starts, noret)

    def _add_calls(self, starts: dict[int, frozenset[str]], noret: set[int]) -> None:
        """Walk from `starts` (resolving the jump tables that failed again, a few times, as the walk
        records more paths) and add the direct call targets in code to them."""
        explorer = self.explorer
        calls = explorer.traverse(list(starts), noret)[1]
        for _ in range(4):
            more = explorer.retry_tables()
            if not more:
                break
            calls = explorer.traverse(list(starts) + more, noret)[1]
        for c in calls:
            if c in explorer.chunks and c not in self.refused:
                starts[c] = with_source(starts.get(c), "call")

    def _not_returning(self, bodies: dict[int, Body], noret: set[int]) -> set[int]:
        """The functions newly found not to return, and the callers that cannot return without them
        (at once instead of one level a round)."""
        explorer, slots = self.explorer, self.noret_slots
        returns = returning_functions(bodies, slots, explorer.chunks, explorer.body_edges)
        found = {f for f in bodies if f not in returns} - noret
        if found:
            found |= noret_callers(bodies, explorer.chunks, noret, found, slots, explorer.body_edges)
        return found


def _table_entry_seeds(reader: CodeReader, seeds: dict[int, frozenset[str]]) -> set[int]:
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
    image, explorer = reader.image, reader.explorer
    ptr = 8 if image.identity.bits == 64 else 4
    spans = []
    for jump, table in reader.jt_tables.items():
        cases = explorer.jt.get(jump)
        if cases and jump not in explorer.unguarded and guessed.intersection(cases):
            spans.append((table, table + ptr * len(cases)))
    if not spans:
        return set()
    inside = IntervalSet([(lo, hi - lo) for lo, hi in spans])
    in_table: dict[int, bool] = {}
    thumb_bit = profile(image.identity.arch).thumb_bit  # starts are even; Thumb pointers are odd
    for src, dst in pointers_in_data(image, reader.codemap, set()):
        dst &= ~thumb_bit
        if dst in guessed:
            in_table[dst] = in_table.get(dst, True) and inside(src)
    from_code = {
        dst
        for dst, kind in zip(reader.backend.x_dst, reader.backend.x_kind, strict=True)
        if kind == _K_OFFSET and dst in guessed
    }
    return {va for va, ok in in_table.items() if ok and va not in from_code}


def _cold_parts(bodies: dict[int, Body], starts: Mapping[int, AbstractSet[str]], extents: dict[int, int]) -> set[int]:
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


__all__ = ["ENGINE_VERSION", "SOURCES", "Discovered", "Explored", "CodeReader", "analyze", "explore"]
