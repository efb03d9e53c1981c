"""The two databases a corpus store runs on, behind one small interface (`Database`).

SQL is written once with `?` placeholders; PostgreSQL's adapter turns them into `%s`. A write runs
as a function of a `Tx` inside one transaction, so a transient failure (SQLite busy past its
timeout, a PostgreSQL deadlock or serialization failure between concurrent writers) is retried by
running the function again on a fresh transaction. One connection per store, used under a lock:
the server's calls share it one at a time.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from binlens.errors import BinlensError

_T = TypeVar("_T")
Row = tuple[Any, ...]
_RETRIES = 8
SQLITE_BUSY_S = 60.0  # a writer waits this long for another process's transaction
STATEMENT_TIMEOUT_S = 600.0  # PostgreSQL cancels a statement running longer


class Tx:
    """One open transaction: statements, bulk inserts and id allocation."""

    def __init__(self, db: Database, cur: Any) -> None:
        self._db = db
        self._cur = cur

    @property
    def kind(self) -> str:
        """The database's kind: sqlite | postgresql."""
        return self._db.kind

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one statement; its rows (none for a statement without RETURNING or SELECT)."""
        self._cur.execute(self._db.sql(sql), tuple(params))
        return list(self._cur.fetchall()) if self._cur.description else []

    def insert_many(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
        """Insert `rows` into `table` (no conflicts expected)."""
        if not rows:
            return
        if self._db.kind == "postgresql":
            with self._cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        marks = ", ".join("?" for _ in columns)
        self._cur.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)

    def intern(self, table: str, values: Sequence[str]) -> dict[str, int]:
        """The ids of `values` in a de-duplicating `(id, value UNIQUE)` table, adding those missing."""
        if not values:
            return {}
        ordered = sorted(set(values))  # (one order for every writer: concurrent inserts wait, never deadlock)
        out: dict[str, int] = {}
        if self._db.kind == "postgresql":
            self._cur.execute(
                f"INSERT INTO {table} (value) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING", (ordered,)
            )
            self._cur.execute(f"SELECT id, value FROM {table} WHERE value = ANY(%s)", (ordered,))
            out.update((v, i) for i, v in self._cur.fetchall())
            return out
        self._cur.executemany(f"INSERT OR IGNORE INTO {table} (value) VALUES (?)", [(v,) for v in ordered])
        for start in range(0, len(ordered), 20000):
            chunk = json.dumps(ordered[start : start + 20000])
            sql = f"SELECT id, value FROM {table} WHERE value IN (SELECT value FROM json_each(?))"
            self._cur.execute(sql, (chunk,))
            out.update((v, i) for i, v in self._cur.fetchall())
        return out

    def new_ids(self, table: str, count: int) -> list[int]:
        """`count` fresh ids for rows of `table` (its `id` column)."""
        if count == 0:
            return []
        if self._db.kind == "postgresql":
            self._cur.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)", (table, count)
            )
            return [int(r[0]) for r in self._cur.fetchall()]
        # (the write lock is held from BEGIN IMMEDIATE: no other writer takes these ids)
        self._cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}")
        first = int(self._cur.fetchone()[0]) + 1
        return list(range(first, first + count))


class Database:
    """A SQLite file or a PostgreSQL server, as the corpus store uses them."""

    def __init__(self, kind: str, conn: Any, where: str) -> None:
        self.kind = kind  # sqlite | postgresql
        self.where = where  # the file or the server, for messages (no password)
        self._conn = conn
        self._lock = threading.Lock()

    def sql(self, text: str) -> str:
        """`text` in this database's placeholder style."""
        return text.replace("?", "%s") if self.kind == "postgresql" else text

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """The rows of one query (outside any write transaction)."""
        with self._lock:
            try:
                cur = self._conn.execute(self.sql(sql), tuple(params))
                return list(cur.fetchall())
            except Exception as err:  # noqa: BLE001 (the driver's errors become BinlensError)
                raise self._failure(err, "read the corpus store") from err

    def write(self, work: Callable[[Tx], _T]) -> _T:
        """Run `work` in one transaction, committed when it returns, rolled back when it raises;
        retried from the start on a transient conflict between writers."""
        with self._lock:
            for attempt in range(_RETRIES):
                try:
                    return self._write_once(work)
                except BinlensError:
                    raise
                except Exception as err:  # noqa: BLE001
                    if attempt + 1 < _RETRIES and self._transient(err):
                        time.sleep(0.05 * (attempt + 1))
                        continue
                    raise self._failure(err, "write to the corpus store") from err
        raise AssertionError("unreachable")

    def _write_once(self, work: Callable[[Tx], _T]) -> _T:
        if self.kind == "postgresql":
            with self._conn.transaction(), self._conn.cursor() as cur:
                return work(Tx(self, cur))
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            out = work(Tx(self, cur))
            cur.execute("COMMIT")
            return out
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        finally:
            cur.close()

    def _transient(self, err: Exception) -> bool:
        if self.kind == "postgresql":
            import psycopg.errors

            return isinstance(err, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure)
        text = str(err).lower()
        return isinstance(err, sqlite3.OperationalError) and ("locked" in text or "busy" in text)

    def _failure(self, err: Exception, what: str) -> BinlensError:
        code = "busy" if self._transient(err) else "unavailable" if self._gone(err) else "internal"
        return BinlensError(code, f"could not {what} ({self.where}): {err}", details={"store": self.where})

    def _gone(self, err: Exception) -> bool:
        if self.kind != "postgresql":
            return False
        import psycopg

        return isinstance(err, psycopg.OperationalError)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()


def open_sqlite(path: Path) -> Database:
    """The corpus store's SQLite file (created; WAL, so readers and one writer at a time share it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=SQLITE_BUSY_S, isolation_level=None, check_same_thread=False)
    deadline = time.monotonic() + SQLITE_BUSY_S
    while True:  # (the switch to WAL takes a lock SQLite does not wait for)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    conn.execute("PRAGMA synchronous=NORMAL")
    return Database("sqlite", conn, str(path))


def open_postgresql(url: str, target: str) -> Database:
    """A connection to the PostgreSQL server `url` names (autocommit; writes open transactions)."""
    try:
        import psycopg
    except ImportError as err:
        raise BinlensError(
            "unavailable",
            "a PostgreSQL corpus store needs psycopg: pip install 'binlens[corpus]'",
            target=target,
        ) from err
    where = _redacted(url)
    try:
        # (keepalives: a server that vanished from the network is noticed in about a minute, not
        # when the kernel gives up on the socket; the statement timeout bounds any one statement)
        conn = psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=10,
            keepalives=1,
            keepalives_idle=30,
            keepalives_interval=10,
            keepalives_count=3,
        )
        conn.execute(f"SET statement_timeout = {int(STATEMENT_TIMEOUT_S * 1000)}")
    except psycopg.Error as err:
        raise BinlensError(
            "unavailable", f"could not reach the PostgreSQL corpus store {where}: {err}".strip(), target=target
        ) from err
    return Database("postgresql", conn, where)


def _redacted(url: str) -> str:
    """`url` without its password."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "postgresql://…"
