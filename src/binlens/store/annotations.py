"""The user's annotations and their journal: names, comments, bookmarks, types, globals, patches.

Every annotation is a row keyed by a small tuple (an address, an address and a kind, a type
name). A mutation is a list of *changes* `(kind, key, before, after)` where `before`/`after` are
the row's JSON value or None (absent). Applying `after` for every change is the edit; applying
`before` in reverse order is its undo, so undo restores exactly what was there. Each edit is one
SQLite transaction that writes the rows and its journal entry together: a crash at any moment
leaves either the whole edit (rows and journal) or none of it.

Byte patches are kept per byte (`ann_patch`), and a patch change is keyed by the written range
`(start, length)` with the patched bytes in it as its value (runs of `[address, hex]`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from binlens.store.database import ProgramDatabase, s64, u64

# SQLite integers are signed 64-bit: an address column holds `s64(address)` (addresses at and above
# 2**63 as negative numbers; below it the address itself, so no stored row changes). The store
# converts at its boundary: callers give and get unsigned addresses, rows come in address order.
_HIGH = 1 << 63
_ADDRESS_KEYED = frozenset(
    {"name", "comment", "bookmark", "global", "prototype", "function", "signature", "local_variable", "flow_override"}
)


def db_spans(start: int, end: int) -> list[tuple[int, int]]:
    """The addresses [start, end) as inclusive ranges of stored values for `BETWEEN`, in address order
    (two when the range crosses 2**63; none when it is empty)."""
    end = min(end, 1 << 64)
    out = []
    if start < min(end, _HIGH):
        out.append((max(start, 0), min(end, _HIGH) - 1))
    if max(start, _HIGH) < end:
        out.append((s64(max(start, _HIGH)), s64(end - 1)))
    return out


def in_spans(conn: sqlite3.Connection, sql: str, start: int, end: int) -> list[tuple[Any, ...]]:
    """The rows of `sql` (a query whose `{span}` is a condition `address BETWEEN ? AND ?`, whose first
    column is an address) for the addresses [start, end), that column as the address, in address
    order."""
    rows: list[tuple[Any, ...]] = []
    for lo, hi in db_spans(start, end):
        rows += [(u64(r[0]), *r[1:]) for r in conn.execute(sql.format(span="address BETWEEN ? AND ?"), (lo, hi))]
    return rows


# --- reads the API's checks and listings make (inside an edit's transaction, or on their own) ------
def name_owner(conn: sqlite3.Connection, name: str, other_than: int) -> int | None:
    """The address the user gave `name`, other than `other_than`; None when no other has it."""
    row = conn.execute("SELECT address FROM ann_name WHERE name=? AND address<>?", (name, s64(other_than))).fetchone()
    return None if row is None else u64(row[0])


def user_name_at(conn: sqlite3.Connection, va: int) -> str | None:
    """The name the user gave `va`, or None."""
    row = conn.execute("SELECT name FROM ann_name WHERE address=?", (s64(va),)).fetchone()
    return None if row is None else row[0]


def comment_rows_at(conn: sqlite3.Connection, va: int) -> dict[str, str]:
    """The user's comments at `va` by kind."""
    return dict(conn.execute("SELECT kind, text FROM ann_comment WHERE address=?", (s64(va),)).fetchall())


def comment_rows_in(conn: sqlite3.Connection, start: int, end: int) -> list[tuple[Any, ...]]:
    """(address, kind, text) of every user comment in [start, end), in address order."""
    return in_spans(conn, "SELECT address, kind, text FROM ann_comment WHERE {span}", start, end)


def bookmark_rows_at(conn: sqlite3.Connection, va: int) -> list[tuple[str, str]]:
    """(category, note) of the user's bookmarks at `va`, by category."""
    sql = "SELECT category, note FROM ann_bookmark WHERE address=? ORDER BY category"
    return conn.execute(sql, (s64(va),)).fetchall()


def flow_override_rows(conn: sqlite3.Connection) -> dict[int, str]:
    """The user's flow overrides: {instruction address: kind}."""
    return {u64(a): t for a, t in conn.execute("SELECT address, type FROM ann_flow_override")}


def local_variable_rows(conn: sqlite3.Connection, function: int) -> dict[str, dict[str, str | None]]:
    """The user's local variable edits of the function at `function`, by storage."""
    rows = conn.execute("SELECT storage, name, type FROM ann_local_variable WHERE address=?", (s64(function),))
    return {storage: {"name": name, "type": type_} for storage, name, type_ in rows}


def last_data_type_position(conn: sqlite3.Connection) -> int:
    """The highest list position of the user's data types (0 when there is none)."""
    return int(conn.execute("SELECT COALESCE(MAX(position), 0) FROM ann_data_type").fetchone()[0])


def globals_near(conn: sqlite3.Connection, va: int, size: int) -> list[tuple[Any, ...]]:
    """(address, type) of the globals that could overlap [va, va+size), other than one at `va`:
    globals never overlap each other, so only the closest one below and those inside can."""
    below = in_spans(conn, "SELECT address, type FROM ann_global WHERE {span} ORDER BY address DESC LIMIT 1", 0, va)
    return below[-1:] + in_spans(conn, "SELECT address, type FROM ann_global WHERE {span}", va + 1, va + size)


def _db_key(kind: str, key: Key) -> Key:
    return (s64(key[0]), *key[1:]) if kind in _ADDRESS_KEYED else key


MIGRATIONS = [
    """
    CREATE TABLE IF NOT EXISTS ann_name (address INTEGER PRIMARY KEY, name TEXT NOT NULL);
    CREATE INDEX IF NOT EXISTS ann_name_by_name ON ann_name(name);
    CREATE TABLE IF NOT EXISTS ann_comment (
        address INTEGER NOT NULL, kind TEXT NOT NULL, text TEXT NOT NULL, PRIMARY KEY (address, kind));
    CREATE TABLE IF NOT EXISTS ann_bookmark (
        address INTEGER NOT NULL, category TEXT NOT NULL, note TEXT NOT NULL, PRIMARY KEY (address, category));
    CREATE TABLE IF NOT EXISTS ann_data_type (
        name TEXT PRIMARY KEY, kind TEXT NOT NULL, category TEXT NOT NULL, declaration TEXT NOT NULL,
        position INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS ann_global (address INTEGER PRIMARY KEY, type TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS ann_function_prototype (address INTEGER PRIMARY KEY, prototype TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS ann_function (address INTEGER PRIMARY KEY, state TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS ann_patch (address INTEGER PRIMARY KEY, value INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS ann_journal (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT NOT NULL,
        client TEXT NOT NULL,
        method TEXT NOT NULL,
        summary TEXT NOT NULL,
        batch TEXT,
        state TEXT NOT NULL DEFAULT 'done',
        changes TEXT NOT NULL,
        undone_time TEXT,
        undone_by TEXT
    );
    CREATE INDEX IF NOT EXISTS ann_journal_state ON ann_journal(state, id);
    """,
    # Names `signature.apply` gave (the name itself is an `ann_name` row of the same edit): the score
    # of the match and the reference file it came from.
    """
    CREATE TABLE IF NOT EXISTS ann_signature (
        address INTEGER PRIMARY KEY, name TEXT NOT NULL, score REAL NOT NULL, reference TEXT NOT NULL);
    """,
    # a function's local variables as the user named and typed them, keyed by the decompiler's
    # storage (`arg:0`, `rcx`, `[bp-0x18]`), so an edit outlives re-decompilation
    """
    CREATE TABLE IF NOT EXISTS ann_local_variable (
        address INTEGER NOT NULL, storage TEXT NOT NULL, name TEXT, type TEXT, PRIMARY KEY (address, storage));
    """,
    # how the user says an instruction's flow differs from its decoding (`flow_override.patch`):
    # a call taken as a jump, a jump as a call, a call that does not return
    """
    CREATE TABLE IF NOT EXISTS ann_flow_override (address INTEGER PRIMARY KEY, type TEXT NOT NULL);
    """,
]


@dataclass(frozen=True)
class Table:
    """How one annotation kind is stored: its table, key columns and value columns."""

    table: str
    keys: tuple[str, ...]
    values: tuple[str, ...]


TABLES: dict[str, Table] = {
    "name": Table("ann_name", ("address",), ("name",)),
    "comment": Table("ann_comment", ("address", "kind"), ("text",)),
    "bookmark": Table("ann_bookmark", ("address", "category"), ("note",)),
    "data_type": Table("ann_data_type", ("name",), ("kind", "category", "declaration", "position")),
    "global": Table("ann_global", ("address",), ("type",)),
    "prototype": Table("ann_function_prototype", ("address",), ("prototype",)),
    "function": Table("ann_function", ("address",), ("state",)),
    "signature": Table("ann_signature", ("address",), ("name", "score", "reference")),
    "local_variable": Table("ann_local_variable", ("address", "storage"), ("name", "type")),
    "flow_override": Table("ann_flow_override", ("address",), ("type",)),
}
KINDS = (*TABLES, "patch")
_PATCH_BYTES = "SELECT address, value FROM ann_patch WHERE {span} ORDER BY address"

Key = tuple[Any, ...]
Value = dict[str, Any] | None
Change = tuple[str, Key, Value]  # (kind, key, after)


def now() -> str:
    """UTC time as ISO 8601 with milliseconds."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


class AnnotationStore:
    """Reads and journaled writes of one program's annotations."""

    def __init__(self, db: ProgramDatabase) -> None:
        self.db = db
        self._local = threading.local()  # .conn: the open batch transaction of this thread, .batch: its id

    # --- rows ---------------------------------------------------------------------------------
    def get(self, conn: sqlite3.Connection, kind: str, key: Key) -> Value:
        """The current value of one row, or None."""
        if kind == "patch":
            start, length = key
            rows = in_spans(conn, _PATCH_BYTES, start, start + length)
            return {"runs": _runs(rows)} if rows else None
        t = TABLES[kind]
        where = " AND ".join(f"{k}=?" for k in t.keys)
        row = conn.execute(f"SELECT {', '.join(t.values)} FROM {t.table} WHERE {where}", _db_key(kind, key)).fetchone()
        return dict(zip(t.values, row, strict=True)) if row else None

    def put(self, conn: sqlite3.Connection, kind: str, key: Key, value: Value) -> None:
        """Set one row to `value` (None deletes it)."""
        if kind == "patch":
            start, length = key
            for lo, hi in db_spans(start, start + length):
                conn.execute("DELETE FROM ann_patch WHERE address BETWEEN ? AND ?", (lo, hi))
            if value:
                rows = []
                for addr, hexbytes in value["runs"]:
                    rows += [(s64(addr + i), b) for i, b in enumerate(bytes.fromhex(hexbytes))]
                conn.executemany("INSERT INTO ann_patch(address, value) VALUES(?, ?)", rows)
            return
        t = TABLES[kind]
        where = " AND ".join(f"{k}=?" for k in t.keys)
        key = _db_key(kind, key)
        if value is None:
            conn.execute(f"DELETE FROM {t.table} WHERE {where}", key)
            return
        cols = (*t.keys, *t.values)
        updates = ", ".join(f"{c}=excluded.{c}" for c in t.values)
        conn.execute(
            f"INSERT INTO {t.table}({', '.join(cols)}) VALUES({', '.join('?' * len(cols))}) "
            f"ON CONFLICT({', '.join(t.keys)}) DO UPDATE SET {updates}",
            (*key, *(value[c] for c in t.values)),
        )

    def rows(self, kind: str, conn: sqlite3.Connection | None = None) -> list[tuple[Key, dict[str, Any]]]:
        """Every row of a kind as (key, value), in key order."""
        conn = conn or self.db.connect()
        if kind == "patch":
            rows = in_spans(conn, _PATCH_BYTES, 0, 1 << 64)
            return [((addr, len(bytes.fromhex(h))), {"runs": [[addr, h]]}) for addr, h in _runs(rows)]
        t = TABLES[kind]
        cols = (*t.keys, *t.values)
        out = []
        for row in conn.execute(f"SELECT {', '.join(cols)} FROM {t.table} ORDER BY {', '.join(t.keys)}"):
            out.append((tuple(row[: len(t.keys)]), dict(zip(t.values, row[len(t.keys) :], strict=True))))
        if kind in _ADDRESS_KEYED:  # stored signed: the addresses at and above 2**63 came first
            out = sorted(((u64(k[0]), *k[1:]), v) for k, v in out)
        return out

    # --- transactions --------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A transaction for one edit: its own, or a savepoint inside this thread's open batch."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            with self.db.transaction() as conn:
                yield conn
            return
        conn.execute("SAVEPOINT ann_edit")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK TO ann_edit")
            conn.execute("RELEASE ann_edit")
            raise
        conn.execute("RELEASE ann_edit")

    @contextmanager
    def atomic_batch(self, batch_id: str) -> Iterator[None]:
        """Run every edit of this thread inside one transaction: all of them commit, or none."""
        if getattr(self._local, "conn", None) is not None:
            raise RuntimeError("a batch is already open on this thread")
        with self.db.transaction() as conn:
            self._local.conn = conn
            self._local.batch = batch_id
            try:
                yield
            finally:
                self._local.conn = None
                self._local.batch = None

    @contextmanager
    def tagged_batch(self, batch_id: str) -> Iterator[None]:
        """Tag this thread's edits with `batch_id` (each still commits on its own)."""
        self._local.batch = batch_id
        try:
            yield
        finally:
            self._local.batch = None

    @property
    def in_atomic_batch(self) -> bool:
        """Whether this thread is inside an all_or_none batch."""
        return getattr(self._local, "conn", None) is not None

    # --- journaled edits -----------------------------------------------------------------------
    def edit(
        self,
        client: str,
        method: str,
        summary: str,
        plan: Callable[[sqlite3.Connection], list[Change]],
    ) -> int | None:
        """Run `plan` inside a transaction, apply its changes and journal them as one entry.

        `plan` reads the current state (inside the transaction, so checks and writes cannot race
        another writer) and returns the changes to make, or raises to abort. Returns the journal
        entry id, or None when nothing actually changed.
        """
        with self.transaction() as conn:
            changes: list[dict[str, Any]] = []
            for kind, key, after in plan(conn):
                before = self.get(conn, kind, key)
                if before == after:
                    continue
                self.put(conn, kind, key, after)
                changes.append({"kind": kind, "key": list(key), "before": before, "after": after})
            if not changes:
                return None
            conn.execute("UPDATE ann_journal SET state='abandoned' WHERE state='undone'")
            cur = conn.execute(
                "INSERT INTO ann_journal(time, client, method, summary, batch, changes) VALUES(?,?,?,?,?,?)",
                (now(), client, method, summary, getattr(self._local, "batch", None), _dumps(changes)),
            )
            self._local.last_edit = (self._bump(conn, {c["kind"] for c in changes}), changes)
            return int(cur.lastrowid or 0)

    def last_edit(self) -> tuple[str, list[dict[str, Any]]]:
        """(generation token, changes) of this thread's last edit that changed something."""
        return self._local.last_edit

    def undo(self, client: str, count: int) -> list[int]:
        """Undo the latest `count` live entries (newest first); returns their ids."""
        return self._step(client, count, undo=True)

    def redo(self, client: str, count: int) -> list[int]:
        """Redo the earliest `count` undone entries (oldest first); returns their ids."""
        return self._step(client, count, undo=False)

    def _step(self, client: str, count: int, *, undo: bool) -> list[int]:
        done: list[int] = []
        kinds: set[str] = set()
        with self.transaction() as conn:
            for _ in range(count):
                if undo:
                    row = conn.execute(
                        "SELECT id, changes FROM ann_journal WHERE state='done' ORDER BY id DESC LIMIT 1"
                    ).fetchone()
                else:
                    row = conn.execute(
                        "SELECT id, changes FROM ann_journal WHERE state='undone' ORDER BY id LIMIT 1"
                    ).fetchone()
                if row is None:
                    break
                changes = json.loads(row[1])
                seq = reversed(changes) if undo else changes
                for ch in seq:
                    self.put(conn, ch["kind"], tuple(ch["key"]), ch["before"] if undo else ch["after"])
                if undo:
                    conn.execute(
                        "UPDATE ann_journal SET state='undone', undone_time=?, undone_by=? WHERE id=?",
                        (now(), client, row[0]),
                    )
                else:
                    conn.execute(
                        "UPDATE ann_journal SET state='done', undone_time=NULL, undone_by=NULL WHERE id=?", (row[0],)
                    )
                done.append(int(row[0]))
                kinds.update(ch["kind"] for ch in changes)
            if done:
                self._bump(conn, kinds)
        return done

    def journal(
        self,
        position: int | None,
        limit: int,
        state: str | None = None,
        newest_first: bool = False,
        filters: dict[str, str | None] | None = None,
    ) -> list[dict[str, Any]]:
        """Journal entries after `position` (an id; None: from the start) in id order or newest first.

        `filters` match columns exactly (state, client, method, batch); a None filter matches all.
        """
        cols = ("id", "time", "client", "method", "summary", "batch", "state", "changes", "undone_time", "undone_by")
        where = ["id < ?" if newest_first else "id > ?"]
        args: list[Any] = [position if position is not None else (1 << 62 if newest_first else 0)]
        conds = dict(filters or {})
        if state:
            conds["state"] = state
        for col in ("state", "client", "method", "batch"):
            if conds.get(col) is not None:
                where.append(f"{col} = ?")
                args.append(conds[col])
        sql = f"SELECT {', '.join(cols)} FROM ann_journal WHERE {' AND '.join(where)}"
        sql += f" ORDER BY id {'DESC' if newest_first else 'ASC'} LIMIT ?"
        args.append(limit)
        out = []
        for row in self.db.connect().execute(sql, args):
            entry = dict(zip(cols, row, strict=True))
            entry["changes"] = json.loads(entry["changes"])
            out.append(entry)
        return out

    # --- change tracking for in-memory caches ---------------------------------------------------
    def generation(self, kind: str = "") -> str:
        """A token that changes whenever any annotation (or, given `kind`, one of that kind) changes, in any process."""
        key = f"annotations.generation.{kind}" if kind else "annotations.generation"
        row = self.db.connect().execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else ""

    def _bump(self, conn: sqlite3.Connection, kinds: set[str]) -> str:
        token = uuid.uuid4().hex
        self.db.set_meta("annotations.generation", token, conn)
        for kind in kinds:
            self.db.set_meta(f"annotations.generation.{kind}", token, conn)
        return token

    # --- byte patches ---------------------------------------------------------------------------
    def patched_bytes(self, start: int, length: int) -> list[tuple[int, int]]:
        """(address, byte) of every patched byte in [start, start+length)."""
        return in_spans(self.db.connect(), _PATCH_BYTES, start, start + length)


def _runs(rows: list[tuple[int, int]]) -> list[list[Any]]:
    """Group (address, byte) rows into [[start, hex], ...] runs of consecutive addresses."""
    out: list[list[Any]] = []
    start = prev = None
    buf = bytearray()
    for addr, value in rows:
        if prev is not None and addr == prev + 1:
            buf.append(value)
        else:
            if start is not None:
                out.append([start, buf.hex()])
            start, buf = addr, bytearray([value])
        prev = addr
    if start is not None:
        out.append([start, buf.hex()])
    return out


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)
