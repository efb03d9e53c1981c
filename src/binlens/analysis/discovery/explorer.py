"""Function discovery: trusted seeds, recursive descent, function bodies, non-returning calls.

The explorer decodes "chunks" (straight-line code ending at a branch, call, return or a known
chunk start) once and caches them; everything after that is graph work over the cache:

1. seeds from metadata (entry, symbols, exports, .eh_frame FDEs in the entry state, .pdata,
   LC_FUNCTION_STARTS, init/fini arrays, import thunks);
2. `traverse`: reach every chunk from the seeds (calls, jumps, jump tables), skipping the
   fall-through of calls to functions known not to return;
3. `partition`: each function's body is what its entry reaches without entering another
   function's entry; an unconditional jump that leaves the function's extent (its FDE range,
   or past the next known entry) is a tail call and its target becomes a function;
4. non-returning functions by a least fixpoint (a function returns if it has a reachable
   return, an unresolved indirect jump, or a tail call to a function that returns); new ones
   re-run 2-3 until nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from typing import TYPE_CHECKING, Literal, cast

from binlens.analysis.codemap import CHUNK, INSN, CodeMap
from binlens.analysis.discovery.leaves import leaves
from binlens.analysis.discovery.overrides import NO_RETURN, override_chunk
from binlens.analysis.discovery.partition import Partitioner
from binlens.analysis.discovery.tables import SwitchResolution
from binlens.analysis.model import T_BAD, T_CALL, T_COND, T_FALL, T_ICALL, T_IJUMP, T_JUMP, T_RET, Body, pack_calls
from binlens.analysis.native.kernels import native

if TYPE_CHECKING:
    from binlens.analysis.decode.backend import Backend, Chunk

# the walk of `Explorer.traverse` in C (`_descent.c`); without it the Python loop below runs
_descent = native("_descent", T_FALL, T_JUMP, T_COND, T_CALL, T_ICALL, T_IJUMP, T_RET, T_BAD)
_c_traverse = _descent.traverse if _descent is not None else None
_c_body = _descent.body if _descent is not None else None
_ChunkMap = _descent.ChunkMap if _descent is not None else None
_PredMap = _descent.PredMap if _descent is not None else None  # in 12-byte slots (`_predmap.h`)


def _preds() -> dict[int, int]:
    """A new map of recorded predecessors: a `PredMap`, or a dict without the C extension."""
    return _PredMap() if _PredMap is not None else {}


Progress = Callable[[float, float | None, str | None], None]

NORETURN_NAMES = frozenset(
    [
        "exit",
        "_exit",
        "_Exit",
        "abort",
        "__stack_chk_fail",
        "__assert_fail",
        "__assert_rtn",
        "__assert_perror_fail",
        "err",
        "errx",
        "verr",
        "verrx",
        "__fortify_fail",
        "__chk_fail",
        "longjmp",
        "siglongjmp",
        "_longjmp",
        "__longjmp_chk",
        "pthread_exit",
        "quick_exit",
        "__cxa_throw",
        "__cxa_rethrow",
        "__cxa_bad_cast",
        "__cxa_bad_typeid",
        "__cxa_throw_bad_array_new_length",
        "_Unwind_Resume",
        "std::terminate()",
        "__libc_start_main",
        "__libc_fatal",
        "__malloc_assert",
        "ExitProcess",
        "ExitThread",
        "FatalExit",
        "FatalAppExitA",
        "FatalAppExitW",
        "RtlExitUserThread",
        "RtlExitUserProcess",
        "_exit_group",
        "__report_gsfailure",
        "_invalid_parameter_noinfo_noreturn",
        "_CxxThrowException",
        "__std_terminate",
        "_amsg_exit",
        "__fastfail",
        "__ubsan_handle_builtin_unreachable",
        "__builtin_unreachable",
    ]
)
NORETURN_NAMES = NORETURN_NAMES | {"_" + n for n in NORETURN_NAMES}


class Explorer(SwitchResolution):
    """Decoded chunks plus the graph passes over them."""

    def __init__(
        self,
        codemap: CodeMap,
        backend: Backend,
        jump_tables: Callable[[int, int, list[tuple[int, int]]], tuple[list[int], bool]] | None,
        cond_preds: bool = False,
        cond_first: bool = False,
        case_extent: bool = False,
    ) -> None:
        self.codemap = codemap
        self.backend = backend
        self.decode = backend.decode_chunk
        # x86: a new chunk decoded whole in C (`_x86scan.Scanner`), else False (the path below decides)
        self.fast: Callable[[int], Chunk | Literal[False] | None] | None = getattr(backend, "fast_chunk", None)
        # {va: (end, terminator, targets, last)}: a `ChunkMap` (flat records, `_chunkmap.h`) or a dict
        self.chunks: dict[int, Chunk] = _ChunkMap() if _ChunkMap is not None else {}
        self.pred: dict[int, int] = _preds()
        self.jpred: dict[int, int] = _preds()  # first chunk seen jumping to a chunk
        # first chunk seen branching conditionally to a chunk (kept when asked for: the AArch64
        # resolver needs the guard of gcc's `cmp; b.ls dispatch`, whose dispatch nothing falls into)
        self.cpred: dict[int, int] | None = _preds() if cond_preds else None
        # PowerPC, RISC-V: when both paths fail, try the path preferring conditional branches too
        self.cond_first = cond_first and cond_preds
        # PowerPC, RISC-V: without an FDE or symbol extent, a function holding a guarded table reaches
        # at least its highest case label: a jump up to there is no tail call past the next entry
        self.case_extent = case_extent
        self.jt: dict[int, list[int]] = {}  # indirect jump address -> case targets
        self.unguarded: set[int] = set()  # jumps whose table has no bound check
        self.unresolved: dict[int, int] = {}  # indirect jump -> its chunk, for a later retry
        self.gotos: list[tuple[int, int, list[int]]] = []  # computed-goto tables: (function, end, labels)
        self._jump_tables = jump_tables
        # the paths each unresolved jump last failed on (not on ARM32, where the ARM/Thumb state a
        # path's code decodes in can change under the same addresses)
        self._retried: dict[int, tuple] | None = None if getattr(backend, "arch", "") == "arm" else {}
        self.progress: Progress | None = None
        self.covered = 0
        # keep bodies' edges? `explore` walks without them (cc1: 2M edges, 46 MiB) until discovery ends
        self.record_edges = True  # (then `restore_edges` walks each body once more)
        self._parts = Partitioner()
        self._dirty: set[int] = set()
        self._trav_noret: set[int] | None = None
        self._reached: set[int] = set()
        self._calls: set[int] = set()
        self.unproven: set[int] = set()  # gap-trial starts not proven entries: still open to a data pointer
        # addresses the bodies' walks take as starts that are no functions (`overrides.NO_RETURN`)
        self.stops: frozenset[int] = frozenset()

    def override_flows(self, overrides: Mapping[int, str]) -> None:
        """Decode every chunk with the user's flow `overrides` ({instruction address: kind},
        `overrides.py`) applied; called before anything is decoded (none: nothing changes)."""
        if not overrides:
            return
        fast, decode = self.fast, self.decode

        def overridden(got: Chunk) -> Chunk:
            kind = overrides.get(got[3])
            return override_chunk(got, kind) if kind is not None else got

        def fast_overridden(va: int) -> Chunk | Literal[False] | None:
            got = fast(va) if fast is not None else False
            return overridden(got) if got else got

        def decode_overridden(va: int) -> Chunk | None:
            got = decode(va)
            return overridden(got) if got is not None else None

        if fast is not None:
            self.fast = fast_overridden
        self.decode = decode_overridden
        self.stops = frozenset({NO_RETURN})

    # ------------------------------------------------------------------ chunks
    def chunk(self, va: int) -> Chunk | None:
        """The chunk starting at `va`, decoding it or splitting the chunk that contains it."""
        c = self.chunks.get(va)
        if c is not None:
            return c
        if self.fast is not None:
            got = self.fast(va)
            if got:
                self.chunks[va] = got
                return got
            if got is None:
                return None
        return self._new_chunk(va)

    def _new_chunk(self, va: int) -> Chunk | None:
        """`chunk` for an address with no chunk yet that the fast decoder left to Python."""
        r = self.codemap.region(va)
        if r is None:
            return None
        off = va - r.va
        s = r.state[off]
        if s == INSN:
            h = r.state.rfind(CHUNK, 0, off)
            head = self.chunks.get(r.va + h) if h >= 0 else None
            if head is None or head[0] <= va:  # (no chunk holds va: splitting one would corrupt it)
                return None
            self.chunks[r.va + h] = (va, T_FALL, (va,), va)
            self.pred[va] = r.va + h
            self._dirty.add(r.va + h)
            self.chunks[va] = head
            r.state[off] = CHUNK
            return head
        if s != 0:
            return None
        c = self.decode(va)
        if c is not None:
            self.chunks[va] = c
        return c

    def body_edges(self, f: int, b: Body) -> list[int | str]:
        """The edges of `f`'s body `b` (of the last `partition`): kept in it, or walked again."""
        if b.edges is not None:
            return b.edges
        return cast("list[int | str]", self._parts.walk(self, f).edges)  # (walked with its edges)

    def restore_edges(self, bodies: dict[int, Body]) -> None:
        """Give the bodies of the last `partition` their edges, and record them from here on. The
        walk again is the body's own walk; were a body's chunks to differ (code decoded since split
        one: not seen on the 711 corpus files), the new walk replaces the whole body."""
        for f, b in bodies.items():
            if b.edges is None:
                again = self._parts.walk(self, f)
                if again.chunks != b.chunks:
                    bodies[f] = again
                else:
                    b.edges = again.edges
        self.record_edges = True

    def defer_edges(self) -> None:
        """Walk bodies without their edges until `restore_edges` (discovery re-walks bodies many
        times; their edges are needed once it ends, and for the non-returning test on demand)."""
        self.record_edges = False

    def on_progress(self, progress: Progress | None) -> None:
        """Report the walk's progress to `progress(code bytes reached, None, None)` (None: not at all)."""
        self.progress = progress

    def add_gotos(self, gotos: list[tuple[int, int, list[int]]]) -> None:
        """Computed-goto tables found in data ((function, end of its range, label addresses)): an
        indirect jump of such a function that no table resolves gets its labels as cases."""
        self.gotos.extend(gotos)

    def mark_unproven(self, va: int) -> None:
        """A gap trial at `va` was not proven an entry: a data pointer may still name it one."""
        self.unproven.add(va)

    def note_trial_path(self, src: int, dst: int) -> None:
        """A heuristic trial walked from chunk `src` into `dst`: keep it as `dst`'s predecessor
        unless one is known (the path a switch's bound check is found on)."""
        self.pred.setdefault(dst, src)

    def forget_chunks(self, addresses: Iterable[int], keep: Container[int]) -> None:
        """Drop the cached chunks at `addresses`, except those in `keep` (functions already built, or
        built by another process: their memory serves what is built next)."""
        chunks = self.chunks
        for a in addresses:
            if a not in keep and a in chunks:
                del chunks[a]  # (`pop` would build the chunk's tuple only to drop it)

    def finish(self) -> None:
        """Discovery is over: drop what only its passes need (the body cache, the reached set,
        recorded predecessors), so building functions and references runs with less memory."""
        self._parts = Partitioner()
        self._dirty = set()
        self._trav_noret = None
        self._reached = set()
        self._calls = set()
        if self._retried is not None:
            self._retried = {}
        self.pred = _preds()
        self.jpred = _preds()
        if self.cpred is not None:
            self.cpred = _preds()

    @property
    def noreturn(self) -> set[int] | frozenset[int]:
        """The non-returning functions (and import slots) the last traversal knew."""
        return self._trav_noret if self._trav_noret is not None else frozenset()

    # ------------------------------------------------------------------ passes
    def traverse(
        self, starts: list[int], noret: set[int] | frozenset[int], fresh: list[int] | None = None
    ) -> tuple[set[int], set[int]]:
        """Reach chunks from `starts`; returns (reached chunk starts, direct call targets). `fresh`
        collects the chunks this call reached for the first time (while `noret` is unchanged)."""
        stack, reached, calls = self._walk_from(starts, noret)
        if _c_traverse is not None:  # the same walk in C (`_descent.c`)
            _c_traverse(stack, reached, calls, noret, self.chunks, self.pred, self.jpred, self.cpred, self.fast,
                        self._new_chunk, self.case_targets, fresh, self.progress)  # fmt: skip
        else:
            self._walk(stack, reached, calls, noret, fresh)
        return reached, calls

    def _walk_from(self, starts: list[int], noret: set[int] | frozenset[int]) -> tuple[list[int], set[int], set[int]]:
        """(the addresses to walk from, the reached set and the call set the walk grows). Reachability
        only grows while the set of non-returning functions stays the same: then the last walk's
        sets grow from the new starts only; else a full walk starts, the last one's sets let go first."""
        if self._trav_noret is not None and self._trav_noret == noret:
            reached, calls = self._reached, self._calls
            stack = [s for s in starts if s not in reached]
        else:
            self._reached = self._calls = set()
            reached, calls = self.codemap.address_set(), set()
            stack = list(starts)
        self._trav_noret = set(noret)
        self._reached, self._calls = reached, calls
        return stack, reached, calls

    def _walk(
        self,
        stack: list[int],
        reached: set[int],
        calls: set[int],
        noret: set[int] | frozenset[int],
        fresh: list[int] | None,
    ) -> None:
        """`traverse`'s walk in Python (the twin of `_descent.c`'s): pop, decode, push successors."""
        pred = self.pred
        jpred = self.jpred
        cpred = self.cpred
        get = self.chunks.get
        chunk = self.chunk
        push = stack.append
        see: Callable[[int], None] = reached.add
        if fresh is not None:
            add, note = reached.add, fresh.append

            def see(a: int) -> None:
                add(a)
                note(a)

        progress = self.progress
        tick = 0
        covered = 0
        while stack:
            a = stack.pop()
            if a in reached:
                continue
            c = get(a) or chunk(a)
            if c is None:
                continue
            see(a)
            end, term, t, last = c
            if term == T_COND:
                x = t[1]
                pred[x] = a
                push(x)
                push(t[0])
                if cpred is not None:
                    cpred.setdefault(t[0], a)
            elif term == T_FALL:
                x = t[0]
                pred[x] = a
                push(x)
            elif term == T_CALL:
                x = t[0]
                calls.add(x)
                push(x)
                if x not in noret:
                    x = t[1]
                    pred[x] = a
                    push(x)
            elif term == T_JUMP:
                x = t[0]
                jpred.setdefault(x, a)
                push(x)
            elif term == T_ICALL:
                if t[0] not in noret:
                    x = t[1]
                    pred[x] = a  # (a table address set before a call through a pointer stays in its register)
                    push(x)
            elif term == T_IJUMP:
                stack.extend(self.case_targets(a, last))
                if len(t) > 1:  # a conditional indirect jump (ARM `addls pc, ...`) also falls through
                    x = t[1]
                    pred[x] = a
                    push(x)
            if progress is not None:
                covered += end - a
                tick += 1
                if not tick & 4095:
                    progress(covered, None, None)

    def partition(
        self,
        starts: set[int],
        extents: dict[int, int],
        fragments: Callable[[int], bool],
        noret: set[int],
        accept: Callable[[int], bool] | None = None,
    ) -> tuple[dict[int, Body], set[int]]:
        """Each function's body; also the new function starts found as tail-call targets (with
        `accept`: those it accepted, added as starts and partitioned in turn until none is new).
        Bodies are reused where nothing they depend on changed since the last call (`partition.py`)."""
        if self.stops:
            starts = starts | self.stops
        bodies, new = self._parts.run(self, starts, extents, fragments, noret, self._dirty, accept)
        self._dirty = set()
        for s in self.stops:  # (a walk ends there; no function is there)
            bodies.pop(s, None)
            new.discard(s)
        return bodies, new

    def walk_body(
        self,
        f: int,
        nxt: int,
        ext: int | None,
        starts: set[int],
        fragments: Callable[[int], bool],
        noret: set[int],
        edges: bool | None = None,
    ) -> tuple[Body, set[int], set[int], set[int]]:
        """Walk one function: (body, chunks seen, other starts it ran into, new tail-call starts).
        `edges`: keep the body's edges (None: as `record_edges` says)."""
        b = Body() if (self.record_edges if edges is None else edges) else Body(edges=None)
        if _c_body is not None:  # the same walk in C (`_descent.c`)
            seen, hits, new = _c_body(self.chunks, f, nxt, ext, starts, fragments, noret, b, self._indirect, leaves)
        else:
            seen, hits, new = self._walk_body(b, f, nxt, ext, starts, fragments, noret)
        b.calls = pack_calls(b.calls)
        return b, seen, hits, new

    def _walk_body(
        self,
        b: Body,
        f: int,
        nxt: int,
        ext: int | None,
        starts: set[int],
        fragments: Callable[[int], bool],
        noret: set[int],
    ) -> tuple[set[int], set[int], set[int]]:
        """`walk_body`'s walk in Python (the twin of `_descent.c`'s), filling `b`: (chunks seen, other
        starts it ran into, new tail-call starts)."""
        get = self.chunks.get
        new: set[int] = set()
        hits: set[int] = set()
        add_chunk = b.chunks.append
        add_edge = b.edges.extend if b.edges is not None else _no_edge
        add_tail = b.tails.append
        add_call = b.calls.extend  # (a list while the walk fills it)
        seen = {f}
        stack = [f]
        push = stack.append
        case_hi = 0  # the highest case label of a guarded table met in this body (`case_extent`)
        while stack:
            a = stack.pop()
            c = get(a)
            if c is None:
                b.open_end = True
                continue
            add_chunk(a)
            end, term, t, last = c
            # the common terminators inline (same order of effects as the general loop below)
            if term == T_COND:
                s = t[0]
                if s != f and s in starts:
                    hits.add(s)
                    add_tail((last, s))
                    b.cond_tails.append(s)
                else:
                    add_edge((a, s, "conditional_taken"))
                    if s not in seen:
                        seen.add(s)
                        push(s)
                s = t[1]
                if s != f and s in starts:
                    hits.add(s)
                    add_tail((last, s))
                else:
                    add_edge((a, s, "conditional_fallthrough"))
                    if s not in seen:
                        seen.add(s)
                        push(s)
                continue
            if term == T_FALL:
                s = t[0]
                if s != f and s in starts:
                    hits.add(s)
                    add_tail((last, s))
                else:
                    add_edge((a, s, "fallthrough"))
                    if s not in seen:
                        seen.add(s)
                        push(s)
                continue
            if term in (T_CALL, T_ICALL):
                x = t[0]
                if term == T_CALL or x >= 0:
                    add_call((last, x))
                if x in noret:
                    continue
                s = t[1]
                if s != f and s in starts:
                    hits.add(s)
                else:
                    add_edge((a, s, "call_return"))
                    if s not in seen:
                        seen.add(s)
                        push(s)
                continue
            if term == T_JUMP:
                succ: tuple[tuple[int, str], ...] = ((t[0], "jump"),)
            elif term == T_RET:
                b.has_ret = True
                continue
            elif term == T_IJUMP:
                succ, case_hi = self._indirect(b, f, nxt, ext, starts, fragments, last, t, new, hits, case_hi)
                if not succ:
                    continue
            else:
                if term == T_BAD:
                    b.open_end = True
                continue
            for s, kind in succ:
                if s != f and s in starts:
                    hits.add(s)
                    if kind != "call_return" and kind != "jump_table":
                        b.tails.append((last, s))
                        if kind == "conditional_taken":
                            b.cond_tails.append(s)
                    continue
                inside = not ext and f < s <= case_hi
                if kind == "jump" and s not in seen and not inside and leaves(self.chunks, f, nxt, ext, s, fragments):
                    b.tails.append((last, s))
                    new.add(s)
                    continue
                add_edge((a, s, kind))
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return seen, hits, new

    def _indirect(
        self,
        b: Body,
        f: int,
        nxt: int,
        ext: int | None,
        starts: set[int],
        fragments: Callable[[int], bool],
        last: int,
        t: tuple[int, ...],
        new: set[int],
        hits: set[int],
        case_hi: int,
    ) -> tuple[tuple[tuple[int, str], ...], int]:
        """`walk_body` at an indirect jump (`last`, targets `t`): the successors to follow and the highest
        case label so far; tail calls and starts it meets go into `b`, `new` and `hits`."""
        cases = self.jt.get(last)
        # a conditional indirect jump (ARM `addls pc, ...`) also falls through
        fall = ((t[1], "conditional_fallthrough"),) if len(t) > 1 else ()
        if not cases:
            if t[0] >= 0:
                b.tails.append((last, t[0]))
            else:
                b.open_end = True
            return fall, case_hi
        # a table of function entries is a dispatch through pointers: tail calls;
        # so are entries of an unguarded table that lie below the function
        if last in self.unguarded and ext:
            # an unguarded table may be read past its end: keep entries inside the function
            cases = [x for x in cases if f <= x < f + ext or fragments(x) or x in starts]
        elif last in self.unguarded:
            cases = [x for x in cases if x < nxt or x in starts]
        if last in self.unguarded:
            below = [x for x in cases if x < f and x not in starts and not fragments(x)]
            new.update(below)
            b.tails.extend((last, x) for x in below)
            cases = [x for x in cases if x >= f or x in starts]
        entries = [x for x in cases if x in starts and x != f]
        if self.case_extent and last not in self.unguarded:
            case_hi = max([case_hi, *(x for x in cases if x not in starts)])
        hits.update(entries)
        b.tails.extend((last, x) for x in entries)
        return tuple((x, "jump_table") for x in cases if x not in starts or x == f) + fall, case_hi


def _no_edge(_edge: tuple) -> None:
    """`walk_body`'s edge recorder while edges are not kept."""


__all__ = ["NORETURN_NAMES", "Body", "Explorer", "Progress"]
