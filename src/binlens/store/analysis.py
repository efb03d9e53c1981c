"""The analysis cache in the program database: save a ProgramAnalysis, read it back by query.

Rows are tagged with the engine version (`analysis_run.engine`); a different version means the
cache is stale and the analysis runs again. Addresses are stored as signed 64-bit integers
(SQLite's INTEGER), mapped back to unsigned on read.
"""

from __future__ import annotations

import bisect
import sqlite3
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter

from binlens.analysis.model import ProgramAnalysis
from binlens.store.database import ProgramDatabase, register_migrations

ANALYSIS_MIGRATIONS = [
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
]
register_migrations("analysis", ANALYSIS_MIGRATIONS)
_TABLES = ("func", "block", "call", "xref", "string")
_FUNC_COLUMNS = "address, size, symbol, thunk, sources, noreturn, blocks, instructions, mode"
_EDGE_PAIR = attrgetter("src", "dst")
_EDGE_ORDER = itemgetter(0, 1)


def pack_edges(edges: list) -> tuple[bytes | None, str | None]:
    """(`func.edges`, `func.edge_kinds`) for a function's CFG edges; (None, None) when it has none."""
    if not edges:
        return None, None
    flat = array("Q", chain.from_iterable(map(_EDGE_PAIR, edges)))
    if sys.byteorder == "big":
        flat.byteswap()
    return flat.tobytes(), ",".join(e.kind for e in edges)


def unpack_edges(blob: bytes | None, kinds: str | None) -> list[tuple[int, int, str]]:
    """(src, dst, kind) from `pack_edges`, in stored order."""
    if not blob or not kinds:
        return []
    flat = array("Q")
    flat.frombytes(blob)
    if sys.byteorder == "big":
        flat.byteswap()
    return list(zip(flat[0::2], flat[1::2], kinds.split(","), strict=True))


def s64(v: int) -> int:
    """Unsigned 64-bit address -> SQLite's signed INTEGER."""
    return v - (1 << 64) if v >= 1 << 63 else v


def u64(v: int) -> int:
    """SQLite's signed INTEGER -> unsigned 64-bit address."""
    return v + (1 << 64) if v < 0 else v


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


# The secondary indexes of the analysis tables, as the migration creates them. A full save drops
# them, bulk-inserts, and builds them again: one sort per index instead of a B-tree insert per row
# (the save of libc's analysis went from ~0.8 s to ~0.4 s).
_INDEXES = (
    ("block_by_start", "block(start)"),
    ("call_by_function", "call(function)"),
    ("call_by_callee", "call(callee)"),
    ("xref_by_dst", "xref(dst)"),
    ("xref_by_src", "xref(src)"),
    ("xref_by_function", "xref(function)"),
)
_HIGH = 1 << 63


def _signer(a: ProgramAnalysis) -> Callable[[int], int]:
    """`s64`, or the identity when no address of `a` reaches 2**63 (the usual case: no call per value)."""
    highest = max(
        (
            max(map(attrgetter("address"), a.functions), default=0),
            max(map(attrgetter("dst"), a.xrefs), default=0),
            max(map(attrgetter("src"), a.xrefs), default=0),
            max((callee for f in a.functions for _site, callee in f.calls), default=0),
        )
    )
    return s64 if highest >= _HIGH else int


def save_analysis(db: ProgramDatabase, a: ProgramAnalysis) -> None:
    """Replace the stored analysis with `a`, atomically."""
    sg = _signer(a)
    refs = Counter(map(attrgetter("dst"), a.xrefs))
    n_blocks = sum(len(f.blocks) for f in a.functions)
    n_insns = sum(b.instruction_count for f in a.functions for b in f.blocks)
    with db.transaction() as conn:
        for name, _on in _INDEXES:
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        for t in _TABLES:
            conn.execute(f"DELETE FROM {t}")  # noqa: S608 - fixed table names
        conn.executemany(
            f"INSERT INTO func ({_FUNC_COLUMNS}, edges, edge_kinds) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                (
                    sg(f.address),
                    f.size,
                    f.symbol_name,
                    f.thunk_name,
                    ",".join(f.sources),
                    int(f.noreturn),
                    len(f.blocks),
                    sum(b.instruction_count for b in f.blocks),
                    f.mode,
                    *pack_edges(f.edges),
                )
                for f in a.functions
            ),
        )
        for f in a.functions:  # one executemany per function: no Python generator frame per row
            fa = sg(f.address)
            if f.blocks:
                conn.executemany(
                    "INSERT OR IGNORE INTO block VALUES (?,?,?,?,?)",
                    [(fa, sg(b.start), sg(b.end), b.instruction_count, b.terminator) for b in f.blocks],
                )
            if f.calls:
                conn.executemany("INSERT INTO call VALUES (?,?,?)", [(fa, sg(site), sg(c)) for site, c in f.calls])
        starts, ends, fns = _owner_spans(a.functions)
        right = bisect.bisect_right
        conn.executemany(  # the owner lookup inlined: one bisect per reference, no call frame
            "INSERT INTO xref VALUES (?,?,?,?)",
            (
                (
                    sg(x.src),
                    sg(x.dst),
                    x.kind,
                    sg(fns[i]) if (i := right(starts, x.src) - 1) >= 0 and x.src < ends[i] else None,
                )
                for x in a.xrefs
            ),
        )
        conn.executemany(
            "INSERT INTO string VALUES (?,?,?,?,?,?)",
            ((sg(s.address), s.size, s.encoding, s.text, s.section, refs.get(s.address, 0)) for s in a.strings),
        )
        for name, on in _INDEXES:
            conn.execute(f"CREATE INDEX {name} ON {on}")
        conn.execute("DELETE FROM analysis_run")
        conn.execute(
            "INSERT INTO analysis_run VALUES (1,?,?,?,?,?,?,?,?,?,?,?)",
            (
                a.engine_version,
                "done",
                len(a.functions),
                n_blocks,
                n_insns,
                len(a.xrefs),
                len(a.strings),
                a.code_bytes,
                a.covered_bytes,
                a.stats.get("seconds", 0.0),
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            ),
        )


def _owner_spans(functions: list) -> tuple[list[int], list[int], list[int]]:
    """(starts, ends, functions) of the distinct block starts, sorted: who owns an address."""
    spans = sorted((b.start, b.end, f.address) for f in functions for b in f.blocks)
    starts: list[int] = []
    ends: list[int] = []
    fns: list[int] = []
    for st, en, fn in spans:
        if starts and starts[-1] == st:
            continue
        starts.append(st)
        ends.append(en)
        fns.append(fn)
    return starts, ends, fns


def _owner_index(functions: list) -> Callable[[int], int | None]:
    starts, ends, fns = _owner_spans(functions)

    def owner(va: int) -> int | None:
        i = bisect.bisect_right(starts, va) - 1
        return s64(fns[i]) if i >= 0 and va < ends[i] else None

    return owner


def replace_functions(
    db: ProgramDatabase, remove: set[int], functions: list, xrefs: list, sources: dict[int, tuple[str, ...]]
) -> None:
    """Replace some functions (and the rows that hang off them) after a local re-analysis."""
    ids = [s64(a) for a in remove | {f.address for f in functions}]
    owner = _owner_index(functions)
    marks = ",".join("?" * len(ids))
    with db.transaction() as conn:
        conn.execute(f"DELETE FROM func WHERE address IN ({marks})", ids)  # noqa: S608 - placeholders only
        for table in ("block", "call", "xref"):
            conn.execute(f"DELETE FROM {table} WHERE function IN ({marks})", ids)  # noqa: S608
        conn.executemany(
            f"INSERT OR REPLACE INTO func ({_FUNC_COLUMNS}, edges, edge_kinds) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                (
                    s64(f.address),
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
            ),
        )
        conn.executemany(
            "INSERT OR IGNORE INTO block VALUES (?,?,?,?,?)",
            (
                (s64(f.address), s64(b.start), s64(b.end), b.instruction_count, b.terminator)
                for f in functions
                for b in f.blocks
            ),
        )
        conn.executemany(
            "INSERT INTO call VALUES (?,?,?)",
            ((s64(f.address), s64(site), s64(callee)) for f in functions for site, callee in f.calls),
        )
        conn.executemany(
            "INSERT INTO xref VALUES (?,?,?,?)", ((s64(x.src), s64(x.dst), x.kind, owner(x.src)) for x in xrefs)
        )
        conn.execute("UPDATE string SET refs = (SELECT COUNT(*) FROM xref WHERE xref.dst = string.address)")
        conn.execute(
            "UPDATE analysis_run SET functions = (SELECT COUNT(*) FROM func), "
            "blocks = (SELECT COALESCE(SUM(blocks), 0) FROM func), "
            "instructions = (SELECT COALESCE(SUM(instructions), 0) FROM func), "
            "xrefs = (SELECT COUNT(*) FROM xref) WHERE id = 1"
        )


def load_run(db: ProgramDatabase) -> RunInfo | None:
    """The stored run, or None when nothing was analysed yet."""
    row = db.connect().execute("SELECT * FROM analysis_run WHERE id=1").fetchone()
    if row is None:
        return None
    keys = ("functions", "blocks", "instructions", "xrefs", "strings")
    return RunInfo(row[1], row[2], dict(zip(keys, row[3:8], strict=True)), row[8], row[9], row[10], row[11])


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
    """Read access to a stored analysis (functions in memory; blocks, edges, xrefs by query)."""

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

    def _q(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        return self.db.connect().execute(sql, args).fetchall()

    def function_at(self, va: int) -> FunctionRow | None:
        """The function starting at `va`, else the one with a block containing `va`."""
        f = self.by_address.get(va)
        if f is not None:
            return f
        rows = self._q(
            "SELECT function FROM block WHERE start <= ? AND end > ? ORDER BY start DESC LIMIT 1", (s64(va), s64(va))
        )
        if rows:
            return self.by_address.get(u64(rows[0][0]))
        return None

    def blocks(self, fn: int) -> list[tuple[int, int, int, str]]:
        """(start, end, instructions, terminator) of a function's blocks, by address."""
        rows = self._q(
            "SELECT start, end, instructions, terminator FROM block WHERE function=? ORDER BY start", (s64(fn),)
        )
        return sorted((u64(s), u64(e), n, t) for s, e, n, t in rows)

    def blocks_in(self, start: int, end: int) -> list[tuple[int, int]]:
        """Distinct (start, end) of blocks that start in [start, end), by address."""
        hi = min(end, (1 << 63) - 1)
        rows = self._q(
            "SELECT DISTINCT start, end FROM block WHERE start >= ? AND start < ? ORDER BY start",
            (s64(start) if start < 1 << 63 else 0, hi),
        )
        return [(u64(s), u64(e)) for s, e in rows]

    def block_at(self, va: int) -> tuple[int, int, int] | None:
        """(function, start, end) of a block containing `va`."""
        rows = self._q(
            "SELECT function, start, end FROM block WHERE start <= ? AND end > ? ORDER BY start DESC LIMIT 1",
            (s64(va), s64(va)),
        )
        return (u64(rows[0][0]), u64(rows[0][1]), u64(rows[0][2])) if rows else None

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
        return self._xrefs("dst = ?", (s64(va),), kinds)

    def xrefs_from(self, va: int, kinds: tuple[str, ...] = ()) -> list[tuple[int, int, str, int | None]]:
        return self._xrefs("src = ?", (s64(va),), kinds)

    def xrefs_between(self, start: int, end: int) -> list[tuple[int, int, str, int | None]]:
        """The references made from addresses in [start, end)."""
        return self._xrefs("src >= ? AND src < ?", (s64(start), s64(end)), ())

    def xrefs_from_function(self, fn: int, kinds: tuple[str, ...] = ()) -> list[tuple[int, int, str, int | None]]:
        return self._xrefs("function = ?", (s64(fn),), kinds)

    def _xrefs(self, where: str, args: tuple, kinds: tuple[str, ...]) -> list[tuple[int, int, str, int | None]]:
        sql = f"SELECT src, dst, kind, function FROM xref WHERE {where}"  # noqa: S608 - fixed fragments
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args = args + tuple(kinds)
        rows = self._q(sql + " ORDER BY src, dst", args)
        return [(u64(s), u64(d), k, u64(f) if f is not None else None) for s, d, k, f in rows]

    def strings(self) -> list[tuple[int, int, str, str, str | None, int]]:
        rows = self._q("SELECT address, size, encoding, text, section, refs FROM string ORDER BY address")
        return [(u64(a), n, e, t, s, r) for a, n, e, t, s, r in rows]
