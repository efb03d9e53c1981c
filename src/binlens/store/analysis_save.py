"""Writing an analysis to the program database: rows, then one transaction.

`function_rows` and `reference_rows` turn the engine's functions and references into the rows of
`func`, `func_blocks`, `call`, `xref_pack` and `string` (packed as `store.analysis` reads them);
`write_analysis` replaces the stored analysis with them atomically. `save_analysis` composes the
three for an in-process `ProgramAnalysis`; the analysis process builds the rows in two processes
and merges them (`merge_function_rows`, `jobs/fork.py`). `replace_functions` rewrites the rows
of a few functions after a local re-analysis.
"""

from __future__ import annotations

import bisect
import json
import os
import pickle
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from dataclasses import dataclass
from operator import attrgetter
from types import ModuleType
from typing import BinaryIO

from binlens.analysis.model import ProgramAnalysis, Refs, pairs
from binlens.store.analysis import (
    _FUNC_COLUMNS,
    _KIND_CODE,
    _unwords,
    pack_blocks,
    pack_edges,
    pack_xrefs,
)
from binlens.store.database import ProgramDatabase, s64, u64

_TABLES = ("func", "func_blocks", "call", "xref_pack", "string")
_FUNC_INSERT = f"INSERT OR REPLACE INTO func ({_FUNC_COLUMNS}, edges, edge_kinds) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
_BLOCKS_INSERT = "INSERT OR REPLACE INTO func_blocks VALUES (?,?,?)"


def _native_rows() -> ModuleType | None:
    """`binlens.store._rows` (the packers in C, `_rows.c`); None where the Python code runs: the
    extension was not built, or `BINLENS_PURE_PYTHON` is set."""
    if os.environ.get("BINLENS_PURE_PYTHON"):
        return None
    try:
        from binlens.store import _rows
    except ImportError:  # pragma: no cover - a build without a C compiler
        return None
    return _rows


_c_rows = _native_rows()


# The secondary indexes of the analysis tables, as the migration creates them. A full save drops
# them, bulk-inserts, and builds them again: one sort per index instead of a B-tree insert per row,
# which is the faster way to save a whole analysis.
_INDEXES = (
    ("call_by_function", "call(function)"),
    ("call_by_callee", "call(callee)"),
    ("xref_pack_by_function", "xref_pack(function)"),
)
_HIGH = 1 << 63
Column = MutableSequence[int]  # an array 'Q' (as `owner_spans` makes them) or a list of ints
Spans = tuple[Column, Column, Column]


def _signer(*values: Iterable[int]) -> Callable[[int], int]:
    """`s64`, or the identity when none of `values` reaches 2**63 (the usual case: no call per value)."""
    return s64 if max((max(v, default=0) for v in values), default=0) >= _HIGH else int


@dataclass(slots=True)
class FunctionRows:
    """The rows of the functions' tables (`func`, `func_blocks`, `call`), their counts, and who owns
    each address (`owner_spans`, for the references' rows)."""

    func: list[tuple]
    blocks: list[tuple]
    calls: array  # flat (function, site, callee) words, signed as stored (`calls_rows`)
    counts: tuple[int, int, int]  # functions, blocks, instructions
    spans: Spans
    spooled: int = 0  # batches of rows written to `spool` (`streamed_function_rows`), before these
    spool: BinaryIO | None = None

    def parts(self) -> Iterator[tuple[list[tuple], list[tuple], array]]:
        """(func, blocks, calls) rows: the spooled batches, read one at a time, then those held."""
        if self.spooled:
            if self.spool is None:
                raise ValueError("spooled rows without their spool")
            self.spool.seek(0)
            for _ in range(self.spooled):
                yield pickle.load(self.spool)  # noqa: S301 - our own forked child's rows
        yield self.func, self.blocks, self.calls


@dataclass(slots=True)
class ReferenceRows:
    """The rows of `xref_pack` and `string`, and their counts."""

    xrefs: list[tuple]
    strings: list[tuple]
    counts: tuple[int, int]  # references, strings


def function_rows(functions: list, spans: Spans | None = None) -> FunctionRows:
    """Rows for `functions` (sorted by address, as the engine gives them); `spans` when the caller
    has them already (`owner_spans(functions)`)."""
    sg = _signer(map(attrgetter("address"), functions), (max(f.calls, default=0) for f in functions))
    calls = array("q", _call_words(functions, sg))
    n_blocks = sum(len(f.blocks) for f in functions)
    n_insns = sum(b.instruction_count for f in functions for b in f.blocks)
    return FunctionRows(
        list(_func_rows(functions, sg, {})),
        list(_block_rows(functions, sg)),
        calls,
        (len(functions), n_blocks, n_insns),
        owner_spans(functions) if spans is None else spans,
    )


def _call_words(functions: list, sg: Callable[[int], int]) -> Iterator[int]:
    """(function, site, callee) of each call of `functions`, flat, as the `call` table stores them."""
    for f in functions:
        a = sg(f.address)
        for site, callee in pairs(f.calls):
            yield a
            yield sg(site)
            yield sg(callee)


def calls_rows(words: array) -> Iterator[tuple[int, ...]]:
    """`FunctionRows.calls` as rows of the `call` table."""
    it = iter(words)
    return zip(it, it, it, strict=True)


def streamed_function_rows(
    functions: Iterable, batch: int = 512, spool: BinaryIO | None = None, blocks: int = 8192
) -> FunctionRows:
    """`function_rows` of functions made one at a time (in address order: `iter_functions`), a batch
    at a time: only a batch of Function objects with their blocks and edges lives at once, not all
    of them beside their rows. A batch is `batch` functions, or fewer once they hold `blocks` basic
    blocks (gcc's cc1 has 512 functions with 78k blocks and 133k edges), so that a batch of a few
    huge functions is no larger than one of many small ones.

    With `spool`, each batch's func, blocks and calls rows are written to it (a pickle each) and let
    go: the rows returned hold the counts, the spans and how many batches it has (`spooled`). The
    forked child builds its share of the functions this way, so that neither it nor the parent
    holds those rows whole; the parent saves the spooled batches one at a time
    (`FunctionRows.parts`)."""
    out = FunctionRows([], [], array("q"), (0, 0, 0), (array("Q"), array("Q"), array("Q")))
    for group in _batches(functions, batch, blocks):
        rows = function_rows(group)
        group.clear()  # (its functions go before the next batch's are made)
        if spool is not None:
            pickle.dump((rows.func, rows.blocks, rows.calls), spool, protocol=pickle.HIGHEST_PROTOCOL)
            out.spooled += 1
            rows.func, rows.blocks, rows.calls = [], [], array("q")
        merge_function_rows(out, rows)
    if spool is not None:
        spool.flush()
    return out


def _batches(functions: Iterable, most: int, blocks: int) -> Iterator[list]:
    """The functions in lists of at most `most`, each cut once its functions hold `blocks` blocks."""
    group: list = []
    held = 0
    for f in functions:
        group.append(f)
        held += len(f.blocks)
        if len(group) >= most or held >= blocks:
            yield group
            group, held = [], 0
    if group:
        yield group


def merge_function_rows(first: FunctionRows, second: FunctionRows) -> FunctionRows:
    """The rows of two sets of functions (those of `first` all below those of `second`) as one:
    `first`, extended (only `first` may have spooled batches: they come before all the others)."""
    if second.spooled:
        raise ValueError("spooled rows can only be merged as the first")
    (s1, e1, f1), (s2, e2, f2) = first.spans, second.spans
    if _c_rows is not None and all(isinstance(x, array) and x.typecode == "Q" for x in (s1, e1, f1, s2, e2, f2)):
        n1 = len(s1)
        s1 += s2  # (room for the merge, which `merge_spans` does in place in C)
        e1 += e2
        f1 += f2
        n = _c_rows.merge_spans(s1, e1, f1, s2, e2, f2, n1)
        del s1[n:], e1[n:], f1[n:]
    else:
        _merge_spans(s1, e1, f1, s2, e2, f2)
    first.func += second.func
    first.blocks += second.blocks
    first.calls += second.calls
    (functions1, blocks1, insns1), (functions2, blocks2, insns2) = first.counts, second.counts
    first.counts = (functions1 + functions2, blocks1 + blocks2, insns1 + insns2)
    return first


def _merge_spans(s1: Column, e1: Column, f1: Column, s2: Column, e2: Column, f2: Column) -> None:
    """`merge_function_rows`'s merge of spans without the C extension (`_rows.merge_spans`)."""
    # where runs interleave (a chunk shared across the split), only the part where they overlap is
    # merged: each start once, its first as `owner_spans` picks it (sorting the whole of both would take a
    # transient tuple per span: ~4 MiB on libc)
    lo = bisect.bisect_left(s1, s2[0]) if s1 and s2 else len(s1)
    hi = bisect.bisect_right(s2, s1[-1]) if s1 and s2 else 0
    zone = sorted([*zip(s1[lo:], e1[lo:], f1[lo:], strict=True), *zip(s2[:hi], e2[:hi], f2[:hi], strict=True)])
    del s1[lo:], e1[lo:], f1[lo:]
    last = None
    for st, en, fn in zone:
        if st != last:
            last = st
            s1.append(st)
            e1.append(en)
            f1.append(fn)
    s1 += s2[hi:]
    e1 += e2[hi:]
    f1 += f2[hi:]


def reference_rows(xrefs: list | Refs, strings: list, spans: Spans) -> ReferenceRows:
    """Rows for the references (`Xref` objects, or packed: `Refs`; grouped by the function that owns
    their source: `spans`) and the strings (with how many references each has)."""
    sg = _signer(spans[2], map(attrgetter("address"), strings))
    at = {s.address for s in strings}
    dsts = xrefs.dst if isinstance(xrefs, Refs) else map(attrgetter("dst"), xrefs)
    refs = Counter(d for d in dsts if d in at)  # (only the strings' counts: a far smaller dict)
    string_rows = [(sg(s.address), s.size, s.encoding, s.text, s.section, refs.get(s.address, 0)) for s in strings]
    return ReferenceRows(_xref_packs(spans, xrefs, sg), string_rows, (len(xrefs), len(strings)))


def save_analysis(db: ProgramDatabase, a: ProgramAnalysis) -> None:
    """Replace the stored analysis with `a`, atomically."""
    rows = function_rows(a.functions)
    write_analysis(db, run_figures(a), rows, reference_rows(a.xrefs, a.strings, rows.spans), a.warnings)


def run_figures(a: ProgramAnalysis) -> tuple[str, int, int, float]:
    """(engine version, code bytes, covered bytes, seconds): what `analysis_run` keeps of `a` besides counts."""
    return a.engine_version, a.code_bytes, a.covered_bytes, a.stats.get("seconds", 0.0)


def write_analysis(
    db: ProgramDatabase,
    figures: tuple[str, int, int, float],
    frows: FunctionRows,
    rrows: ReferenceRows,
    warnings: Sequence[str] = (),
    run_id: str | None = None,
) -> None:
    """Replace the stored analysis with these rows, atomically (`figures`: see `run_figures`;
    `warnings`: what of the image the analysis left out or cut, and why; `run_id`: the run that
    produced them)."""
    engine, code_bytes, covered_bytes, seconds = figures
    with db.transaction() as conn:
        for name, _on in _INDEXES:
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        for t in _TABLES:
            conn.execute(f"DELETE FROM {t}")  # noqa: S608 - fixed table names
        for func, blocks, calls in frows.parts():
            conn.executemany(_FUNC_INSERT, func)
            conn.executemany(_BLOCKS_INSERT, blocks)
            conn.executemany("INSERT INTO call VALUES (?,?,?)", calls_rows(calls))
        conn.executemany("INSERT INTO xref_pack VALUES (?,?,?)", rrows.xrefs)
        conn.executemany("INSERT INTO string VALUES (?,?,?,?,?,?)", rrows.strings)
        for name, on in _INDEXES:
            conn.execute(f"CREATE INDEX {name} ON {on}")
        conn.execute("DELETE FROM analysis_run")
        conn.execute(
            "INSERT INTO analysis_run (id, engine, status, functions, blocks, instructions, xrefs, strings,"
            " code_bytes, covered_bytes, seconds, finished_at, warnings, run_id) VALUES (1,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                engine,
                "done",
                *frows.counts,
                *rrows.counts,
                code_bytes,
                covered_bytes,
                seconds,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                json.dumps(list(warnings)) if warnings else None,
                run_id,
            ),
        )


def _func_rows(functions: list, sg: Callable[[int], int], sources: dict[int, tuple[str, ...]]) -> Iterable[tuple]:
    """`func` rows (CFG edges packed); `sources` overrides a function's own."""
    return (
        (
            sg(f.address),
            f.size,
            f.symbol_name,
            f.thunk_name,
            ",".join(sources.get(f.address, f.sources)),
            int(f.noreturn),
            len(f.blocks),
            sum(b.instruction_count for b in f.blocks),
            f.mode,
            *pack_edges(f.edges),
        )
        for f in functions
    )


def _block_rows(functions: list, sg: Callable[[int], int]) -> Iterable[tuple]:
    """`func_blocks` rows: each function's blocks, packed."""
    return ((sg(f.address), *pack_blocks(f.blocks)) for f in functions if f.blocks)


def _xref_packs(spans: Spans, xrefs: list | Refs, sg: Callable[[int], int]) -> list[tuple[int | None, bytes, bytes]]:
    """One `xref_pack` row per owner: the function whose block holds the source (None: no function)."""
    starts, ends, fns = spans
    if _c_rows is not None:  # the same grouping and packing in C (`_rows.c`)
        given = (xrefs.src, xrefs.dst, xrefs.kind) if isinstance(xrefs, Refs) else xrefs
        packs = _c_rows.pack_by_owner(starts, ends, fns, given, _KIND_CODE)
        return [(None if owner is None else sg(owner), data, kinds) for owner, data, kinds in packs]
    if isinstance(xrefs, Refs):
        xrefs = xrefs.xrefs()
    right = bisect.bisect_right
    groups: dict[int | None, list] = {}
    for x in xrefs:
        src = x.src
        i = right(starts, src) - 1
        owner = fns[i] if i >= 0 and src < ends[i] else None
        group = groups.get(owner)
        if group is None:
            groups[owner] = group = []
        group.append(x)
    return [(None if owner is None else sg(owner), *pack_xrefs(group)) for owner, group in groups.items()]


def owner_spans(functions: list) -> tuple[array, array, array]:
    """(starts, ends, functions) of the distinct block starts, sorted: who owns an address. Packed
    u64 arrays: as lists with their ints they were ~40 bytes a block for each (libc: 70k blocks)."""
    spans = sorted((b.start, b.end, f.address) for f in functions for b in f.blocks)
    starts, ends, fns = array("Q"), array("Q"), array("Q")
    last = None
    for st, en, fn in spans:
        if st == last:
            continue
        last = st
        starts.append(st)
        ends.append(en)
        fns.append(fn)
    return starts, ends, fns


def replace_functions(
    db: ProgramDatabase,
    remove: set[int],
    functions: list,
    xrefs: list,
    sources: dict[int, tuple[str, ...]],
    run_id: str | None = None,
) -> None:
    """Replace some functions (and the rows that hang off them) after a local re-analysis (the run
    `run_id`, which the stored analysis is named after from then on)."""
    ids = [s64(a) for a in remove | {f.address for f in functions}]
    marks = ",".join("?" * len(ids))
    with db.transaction() as conn:
        conn.execute(f"DELETE FROM func WHERE address IN ({marks})", ids)  # noqa: S608 - placeholders only
        conn.execute(f"DELETE FROM func_blocks WHERE address IN ({marks})", ids)  # noqa: S608
        for table in ("call", "xref_pack"):
            conn.execute(f"DELETE FROM {table} WHERE function IN ({marks})", ids)  # noqa: S608
        conn.executemany(_FUNC_INSERT, _func_rows(functions, s64, sources))
        conn.executemany(_BLOCKS_INSERT, _block_rows(functions, s64))
        conn.executemany(
            "INSERT INTO call VALUES (?,?,?)",
            ((s64(f.address), s64(site), s64(callee)) for f in functions for site, callee in pairs(f.calls)),
        )
        conn.executemany("INSERT INTO xref_pack VALUES (?,?,?)", _xref_packs(owner_spans(functions), xrefs, s64))
        refs: Counter[int] = Counter()
        total = 0
        for data, kinds in conn.execute("SELECT data, kinds FROM xref_pack"):
            refs.update(_unwords(data)[1::2])
            total += len(kinds)
        strings = conn.execute("SELECT address FROM string").fetchall()
        conn.executemany("UPDATE string SET refs = ? WHERE address = ?", [(refs[u64(a)], a) for (a,) in strings])
        conn.execute(
            "UPDATE analysis_run SET functions = (SELECT COUNT(*) FROM func), "
            "blocks = (SELECT COALESCE(SUM(blocks), 0) FROM func), "
            "instructions = (SELECT COALESCE(SUM(instructions), 0) FROM func), "
            "xrefs = ?, run_id = COALESCE(?, run_id) WHERE id = 1",
            (total, run_id),
        )
