"""The analysis cache in the program database: save a ProgramAnalysis, read it back by query.

Rows are tagged with the engine version (`analysis_run.engine`); a different version means the
cache is stale and the analysis runs again. Addresses are stored as signed 64-bit integers
(SQLite's INTEGER), mapped back to unsigned on read.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
import sys
import uuid
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import accumulate, chain
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, TypeVar

from binlens.analysis.model import XREF_KINDS
from binlens.store.database import Migration, ProgramDatabase, s64, u64

_T = TypeVar("_T")

ANALYSIS_MIGRATIONS: list[Migration] = [
    """
    CREATE TABLE IF NOT EXISTS analysis_run (
        id INTEGER PRIMARY KEY CHECK (id = 1), engine TEXT NOT NULL, status TEXT NOT NULL,
        functions INTEGER, blocks INTEGER, instructions INTEGER, xrefs INTEGER, strings INTEGER,
        code_bytes INTEGER, covered_bytes INTEGER, seconds REAL, finished_at TEXT
    );
    CREATE TABLE IF NOT EXISTS func (
        address INTEGER PRIMARY KEY, size INTEGER NOT NULL, symbol TEXT, thunk TEXT, sources TEXT NOT NULL,
        noreturn INTEGER NOT NULL, blocks INTEGER NOT NULL, instructions INTEGER NOT NULL, mode TEXT
    );
    CREATE TABLE IF NOT EXISTS block (
        function INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL, instructions INTEGER NOT NULL,
        terminator TEXT NOT NULL, PRIMARY KEY (function, start)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS block_by_start ON block(start);
    CREATE TABLE IF NOT EXISTS edge (function INTEGER NOT NULL, src INTEGER NOT NULL, dst INTEGER NOT NULL,
        kind TEXT NOT NULL);
    CREATE INDEX IF NOT EXISTS edge_by_function ON edge(function);
    CREATE TABLE IF NOT EXISTS call (function INTEGER NOT NULL, site INTEGER NOT NULL, callee INTEGER NOT NULL);
    CREATE INDEX IF NOT EXISTS call_by_function ON call(function);
    CREATE INDEX IF NOT EXISTS call_by_callee ON call(callee);
    CREATE TABLE IF NOT EXISTS xref (src INTEGER NOT NULL, dst INTEGER NOT NULL, kind TEXT NOT NULL,
        function INTEGER);
    CREATE INDEX IF NOT EXISTS xref_by_dst ON xref(dst);
    CREATE INDEX IF NOT EXISTS xref_by_src ON xref(src);
    CREATE INDEX IF NOT EXISTS xref_by_function ON xref(function);
    CREATE TABLE IF NOT EXISTS string (address INTEGER PRIMARY KEY, size INTEGER NOT NULL, encoding TEXT NOT NULL,
        text TEXT NOT NULL, section TEXT, refs INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS user_function (address INTEGER PRIMARY KEY, defined INTEGER NOT NULL)
    """,
    # A function's CFG edges live in its own row (`func.edges`: little-endian u64 src, dst pairs;
    # `func.edge_kinds`: the kinds, comma-separated): they are only ever read per function, and
    # 100k edge rows plus their index were a third of the save of libc's analysis. The cached
    # analysis is dropped so that it runs again and fills them.
    """
    ALTER TABLE func ADD COLUMN edges BLOB;
    ALTER TABLE func ADD COLUMN edge_kinds TEXT;
    DROP TABLE IF EXISTS edge;
    DELETE FROM analysis_run
    """,
    # Blocks and references packed too: a function's blocks in one `func_blocks` row (`data`:
    # little-endian u64 start, end, instruction-count triples; `terms`: terminators,
    # comma-separated; not in `func`, whose rows every open reads), its references in one
    # `xref_pack` row (u64 src, dst pairs and one byte of kind each; function NULL: references from
    # outside every function). 70k block and 80k reference rows with their four indexes were
    # ~0.5 s of the save of libc's analysis; readers build their address indexes in memory on
    # first use (`AnalysisView`).
    """
    CREATE TABLE func_blocks (address INTEGER PRIMARY KEY, data BLOB NOT NULL, terms TEXT NOT NULL);
    DROP TABLE IF EXISTS block;
    DROP TABLE IF EXISTS xref;
    CREATE TABLE xref_pack (function INTEGER, data BLOB NOT NULL, kinds BLOB NOT NULL);
    CREATE INDEX xref_pack_by_function ON xref_pack(function);
    DELETE FROM analysis_run
    """,
    # What of the image the analysis left out or cut, and why (odd section or segment tables):
    # a JSON list of lines, NULL when there is nothing to say.
    lambda conn: _add_column(conn, "analysis_run", "warnings", "TEXT"),
    # Run ids: every run (a full analysis, a local re-analysis) is allocated an id before any of
    # its work starts (`analysis_log`); `analysis_run.run_id` names the run whose rows are stored.
    lambda conn: _add_column(conn, "analysis_run", "run_id", "TEXT"),
    """
    CREATE TABLE IF NOT EXISTS analysis_log (
        run_id TEXT PRIMARY KEY, kind TEXT NOT NULL, engine TEXT NOT NULL, status TEXT NOT NULL,
        allocated_at TEXT NOT NULL, finished_at TEXT
    )
    """,
]


def _add_column(conn: sqlite3.Connection, table: str, column: str, kind: str) -> None:
    """`ALTER TABLE table ADD COLUMN column kind`, unless the table has that column already (another
    process's first open may have added it first)."""
    if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


_FUNC_COLUMNS = "address, size, symbol, thunk, sources, noreturn, blocks, instructions, mode"
_EDGE_PAIR = attrgetter("src", "dst")
_EDGE_ORDER = itemgetter(0, 1)
_BLOCK_TRIPLE = attrgetter("start", "end", "instruction_count")
_TERM, _KIND = attrgetter("terminator"), attrgetter("kind")
_KIND_CODE = {k: i for i, k in enumerate(XREF_KINDS)}


def pack_edges(edges: list) -> tuple[bytes | None, str | None]:
    """(`func.edges`, `func.edge_kinds`) for a function's CFG edges; (None, None) when it has none."""
    if not edges:
        return None, None
    flat = array("Q", chain.from_iterable(map(_EDGE_PAIR, edges)))
    if sys.byteorder == "big":
        flat.byteswap()
    return flat.tobytes(), ",".join(e.kind for e in edges)


def _words(values: Iterable[int]) -> bytes:
    """Little-endian u64 words."""
    flat = array("Q", values)
    if sys.byteorder == "big":
        flat.byteswap()
    return flat.tobytes()


def _unwords(blob: bytes) -> array:
    flat = array("Q")
    flat.frombytes(blob)
    if sys.byteorder == "big":
        flat.byteswap()
    return flat


def pack_blocks(blocks: list) -> tuple[bytes | None, str | None]:
    """(`func_blocks.data`, `func_blocks.terms`) for a function's blocks; (None, None) when it has none."""
    if not blocks:
        return None, None
    return _words(chain.from_iterable(map(_BLOCK_TRIPLE, blocks))), ",".join(map(_TERM, blocks))


def unpack_blocks(blob: bytes | None, terms: str | None) -> list[tuple[int, int, int, str]]:
    """(start, end, instructions, terminator) from `pack_blocks`, in stored order."""
    if not blob or not terms:
        return []
    flat = _unwords(blob)
    return list(zip(flat[0::3], flat[1::3], flat[2::3], terms.split(","), strict=True))


def pack_xrefs(xrefs: list) -> tuple[bytes, bytes]:
    """(`xref_pack.data`, `xref_pack.kinds`) for references: (src, dst) words, one byte of kind each."""
    return _words(chain.from_iterable(map(_EDGE_PAIR, xrefs))), bytes(map(_KIND_CODE.__getitem__, map(_KIND, xrefs)))


def unpack_xrefs(blob: bytes, kinds: bytes) -> list[tuple[int, int, str]]:
    """(src, dst, kind) from `pack_xrefs`, in stored order."""
    flat = _unwords(blob)
    return list(zip(flat[0::2], flat[1::2], map(XREF_KINDS.__getitem__, kinds), strict=True))


def unpack_edges(blob: bytes | None, kinds: str | None) -> list[tuple[int, int, str]]:
    """(src, dst, kind) from `pack_edges`, in stored order."""
    if not blob or not kinds:
        return []
    flat = array("Q")
    flat.frombytes(blob)
    if sys.byteorder == "big":
        flat.byteswap()
    return list(zip(flat[0::2], flat[1::2], kinds.split(","), strict=True))


@dataclass(frozen=True, slots=True)
class FunctionRow:
    """One function as stored: what lists and selectors need without loading its blocks."""

    address: int
    size: int
    symbol: str | None
    thunk: str | None
    sources: tuple[str, ...]
    noreturn: bool
    blocks: int
    instructions: int
    mode: str | None = None


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The stored analysis run."""

    engine: str
    status: str
    counts: dict[str, int]
    code_bytes: int
    covered_bytes: int
    seconds: float
    finished_at: str | None
    warnings: list[str] = field(default_factory=list)
    run_id: str | None = None


def _read_only(db_path: str | Path, query: Callable[[sqlite3.Connection], _T]) -> _T | None:
    """`query` on a read-only connection of its own to the database file at `db_path` (what other
    processes committed so far); None when there is no such database or the query fails."""
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error:
        return None
    try:
        return query(conn)
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def stored_run_row(db_path: str | Path) -> tuple[Any, ...] | None:
    """The `analysis_run` row of the database file at `db_path` as it is committed now (None when
    there is none): a caller tells by it whether another process committed a new run since."""
    row = _read_only(db_path, lambda conn: conn.execute("SELECT * FROM analysis_run WHERE id=1").fetchone())
    return tuple(row) if row is not None else None


def stored_state(db_path: Path, engine: str) -> tuple[bool, list[int], list[int]]:
    """(analysis stored by this engine, user-defined starts, user-removed starts), read-only."""
    if not db_path.exists():
        return False, [], []
    got = _read_only(
        db_path,
        lambda conn: (
            conn.execute("SELECT engine, status FROM analysis_run WHERE id=1").fetchone(),
            conn.execute("SELECT address, defined FROM user_function").fetchall(),
        ),
    )
    if got is None:
        return False, [], []
    run, rows = got
    mask = (1 << 64) - 1
    extra = sorted(a & mask for a, d in rows if d)
    excluded = sorted(a & mask for a, d in rows if not d)
    return run is not None and tuple(run) == (engine, "done"), extra, excluded


def load_run(db: ProgramDatabase) -> RunInfo | None:
    """The stored run, or None when nothing was analysed yet."""
    row = db.connect().execute("SELECT * FROM analysis_run WHERE id=1").fetchone()
    if row is None:
        return None
    keys = ("functions", "blocks", "instructions", "xrefs", "strings")
    counts = dict(zip(keys, row[3:8], strict=True))
    return RunInfo(row[1], row[2], counts, row[8], row[9], row[10], row[11], _warnings(row[12]), row[13])


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def allocate_run(db: ProgramDatabase, kind: str, engine: str) -> str:
    """A new run id (`run_` + 32 hex digits), logged as allocated before the run does any work."""
    run_id = "run_" + uuid.uuid4().hex
    with db.transaction() as conn:
        conn.execute(
            "INSERT INTO analysis_log (run_id, kind, engine, status, allocated_at) VALUES (?, ?, ?, 'allocated', ?)",
            (run_id, kind, engine, _utc_now()),
        )
    return run_id


def finish_run(db: ProgramDatabase, run_id: str, status: str) -> None:
    """Record how the run `run_id` ended (done, failed, cancelled)."""
    with db.transaction() as conn:
        conn.execute("UPDATE analysis_log SET status=?, finished_at=? WHERE run_id=?", (status, _utc_now(), run_id))


def name_stored_run(db: ProgramDatabase, run_id: str) -> None:
    """Give the stored analysis that no run names (saved before run ids) the id `run_id`."""
    with db.transaction() as conn:
        conn.execute("UPDATE analysis_run SET run_id=? WHERE id=1 AND run_id IS NULL", (run_id,))


def run_log(db: ProgramDatabase) -> list[dict[str, Any]]:
    """Every run allocated for this program, oldest first."""
    rows = db.connect().execute(
        "SELECT run_id, kind, engine, status, allocated_at, finished_at FROM analysis_log ORDER BY rowid"
    )
    keys = ("run_id", "kind", "engine", "status", "allocated_at", "finished_at")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def _warnings(text: str | None) -> list[str]:
    """`analysis_run.warnings` as a list (empty when NULL or not a JSON list of strings)."""
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [str(w) for w in value] if isinstance(value, list) else []


def user_functions(db: ProgramDatabase) -> dict[int, bool]:
    """Starts the user defined (True) or undefined (False)."""
    rows = db.connect().execute("SELECT address, defined FROM user_function").fetchall()
    return {u64(a): bool(d) for a, d in rows}


def set_user_function(db: ProgramDatabase, va: int, defined: bool) -> None:
    with db.transaction() as conn:
        conn.execute(
            "INSERT INTO user_function VALUES (?,?) ON CONFLICT(address) DO UPDATE SET defined=excluded.defined",
            (s64(va), int(defined)),
        )


class AnalysisView:
    """Read access to a stored analysis: functions in memory; a function's blocks, edges, calls and
    references by query; blocks and references by address through indexes built on first use."""

    def __init__(self, db: ProgramDatabase) -> None:
        self.db = db
        rows = db.connect().execute(f"SELECT {_FUNC_COLUMNS} FROM func ORDER BY address").fetchall()  # noqa: S608
        funcs = [
            FunctionRow(
                u64(r[0]), r[1], r[2], r[3], tuple(r[4].split(",")) if r[4] else (), bool(r[5]), r[6], r[7], r[8]
            )
            for r in rows
        ]
        funcs.sort(key=lambda f: f.address)
        self.functions: list[FunctionRow] = funcs
        self.starts = [f.address for f in funcs]
        self.by_address = {f.address: f for f in funcs}
        self.thunks = {f.thunk: f.address for f in funcs if f.thunk}
        self._block_index: _BlockIndex | None = None
        self._xref_index: _XrefIndex | None = None

    def _q(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        return self.db.connect().execute(sql, args).fetchall()

    def _blocks_by_start(self) -> _BlockIndex:
        idx = self._block_index
        if idx is None:
            idx = self._block_index = _BlockIndex(self._q("SELECT address, data FROM func_blocks"))
        return idx

    def _xrefs_by_address(self) -> _XrefIndex:
        idx = self._xref_index
        if idx is None:
            idx = self._xref_index = _XrefIndex(self._q("SELECT function, data, kinds FROM xref_pack"))
        return idx

    def function_at(self, va: int) -> FunctionRow | None:
        """The function starting at `va`, else the one with a block containing `va`."""
        f = self.by_address.get(va)
        if f is not None:
            return f
        b = self.block_at(va)
        return self.by_address.get(b[0]) if b is not None else None

    def functions_containing(self, va: int) -> list[int]:
        """The entries of every function with a block containing `va` (a block functions share is in each)."""
        idx = self._blocks_by_start()
        out: set[int] = set()
        i = bisect.bisect_right(idx.starts, va) - 1
        while i >= 0 and idx.reach[i] > va:
            if idx.ends[i] > va:
                out.add(idx.fns[i])
            i -= 1
        return sorted(out)

    def blocks(self, fn: int) -> list[tuple[int, int, int, str]]:
        """(start, end, instructions, terminator) of a function's blocks, by address."""
        rows = self._q("SELECT data, terms FROM func_blocks WHERE address=?", (s64(fn),))
        return sorted(unpack_blocks(*rows[0])) if rows else []

    def blocks_in(self, start: int, end: int) -> list[tuple[int, int]]:
        """Distinct (start, end) of blocks that start in [start, end), by address."""
        idx = self._blocks_by_start()
        lo, hi = bisect.bisect_left(idx.starts, start), bisect.bisect_left(idx.starts, end)
        return list(dict.fromkeys(zip(idx.starts[lo:hi], idx.ends[lo:hi], strict=True)))

    def block_at(self, va: int) -> tuple[int, int, int] | None:
        """(function, start, end) of the block containing `va` that starts last."""
        idx = self._blocks_by_start()
        i = bisect.bisect_right(idx.starts, va) - 1
        while i >= 0 and idx.reach[i] > va:  # some block from here down still runs past va
            if idx.ends[i] > va:
                return idx.fns[i], idx.starts[i], idx.ends[i]
            i -= 1
        return None

    def edges(self, fn: int) -> list[tuple[int, int, str]]:
        rows = self._q("SELECT edges, edge_kinds FROM func WHERE address=?", (s64(fn),))
        edges = unpack_edges(*rows[0]) if rows else []
        edges.sort(key=_EDGE_ORDER)  # stable: equal (src, dst) keep the engine's order
        return edges

    def callees(self, fn: int) -> list[tuple[int, int]]:
        """(call site, callee) of calls made by `fn`."""
        rows = self._q("SELECT site, callee FROM call WHERE function=? ORDER BY site", (s64(fn),))
        return [(u64(s), u64(c)) for s, c in rows]

    def callers(self, fn: int) -> list[tuple[int, int]]:
        """(calling function, call site) of calls to `fn`."""
        rows = self._q("SELECT function, site FROM call WHERE callee=? ORDER BY site", (s64(fn),))
        return [(u64(f), u64(s)) for f, s in rows]

    def xrefs_to(self, va: int, kinds: tuple[str, ...] = ()) -> list[tuple[int, int, str, int | None]]:
        """(src, dst, kind, function of src) of the references to `va`, by source."""
        idx = self._xrefs_by_address()
        return idx.rows(idx.by_dst, idx.dst_keys, va, va + 1, kinds)

    def xrefs_from(self, va: int, kinds: tuple[str, ...] = ()) -> list[tuple[int, int, str, int | None]]:
        """The references made by the instruction (or data word) at `va`."""
        idx = self._xrefs_by_address()
        return idx.rows(idx.by_src, idx.src_keys, va, va + 1, kinds)

    def xrefs_between(self, start: int, end: int) -> list[tuple[int, int, str, int | None]]:
        """The references made from addresses in [start, end)."""
        idx = self._xrefs_by_address()
        return idx.rows(idx.by_src, idx.src_keys, start, end, ())

    def xrefs_from_function(self, fn: int, kinds: tuple[str, ...] = ()) -> list[tuple[int, int, str, int | None]]:
        """The references made from the blocks of `fn`."""
        out: list[tuple[int, int, str, int | None]] = [
            (s, d, k, fn)
            for data, codes in self._q("SELECT data, kinds FROM xref_pack WHERE function=?", (s64(fn),))
            for s, d, k in unpack_xrefs(data, codes)
            if not kinds or k in kinds
        ]
        out.sort(key=_EDGE_ORDER)
        return out

    def strings(self) -> list[tuple[int, int, str, str, str | None, int]]:
        rows = self._q("SELECT address, size, encoding, text, section, refs FROM string ORDER BY address")
        return [(u64(a), n, e, t, s, r) for a, n, e, t, s, r in rows]


class _BlockIndex:
    """Every stored block by start address (a block two functions share is listed for each)."""

    def __init__(self, rows: list[sqlite3.Row]) -> None:
        starts, ends, fns = array("Q"), array("Q"), array("Q")
        for address, blob in rows:
            if blob:
                flat = _unwords(blob)
                starts += flat[0::3]
                ends += flat[1::3]
                fns += array("Q", [u64(address)]) * (len(flat) // 3)
        order = sorted(range(len(starts)), key=starts.__getitem__)  # (stable: function order at equal starts)
        self.starts = array("Q", map(starts.__getitem__, order))
        self.ends = array("Q", map(ends.__getitem__, order))
        self.fns = array("Q", map(fns.__getitem__, order))
        self.reach = array("Q", accumulate(self.ends, max))  # the furthest end of the blocks up to each one


class _XrefIndex:
    """Every stored reference, ordered by source and by destination (arrays: ~40 bytes a reference)."""

    def __init__(self, rows: list[sqlite3.Row]) -> None:
        self.src, self.dst, self.kind = array("Q"), array("Q"), bytearray()
        self.fn: list[int | None] = []
        for owner, data, kinds in rows:
            flat = _unwords(data)
            self.src.extend(flat[0::2])
            self.dst.extend(flat[1::2])
            self.kind += kinds
            self.fn += [None if owner is None else u64(owner)] * len(kinds)
        n = len(self.kind)
        self.by_src = array("I", sorted(range(n), key=self.src.__getitem__))
        self.by_dst = array("I", sorted(range(n), key=self.dst.__getitem__))
        self.src_keys = array("Q", map(self.src.__getitem__, self.by_src))
        self.dst_keys = array("Q", map(self.dst.__getitem__, self.by_dst))

    def rows(
        self, order: array, keys: array, lo: int, hi: int, kinds: tuple[str, ...]
    ) -> list[tuple[int, int, str, int | None]]:
        """The references whose key (in `keys`, ordered by `order`) is in [lo, hi), by (src, dst)."""
        i, j = bisect.bisect_left(keys, lo), bisect.bisect_left(keys, hi)
        src, dst, kind, fn = self.src, self.dst, self.kind, self.fn
        out = [(src[x], dst[x], XREF_KINDS[kind[x]], fn[x]) for x in order[i:j]]
        if kinds:
            out = [r for r in out if r[2] in kinds]
        out.sort(key=_EDGE_ORDER)
        return out
