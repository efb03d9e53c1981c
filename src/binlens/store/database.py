"""The program database: one SQLite file per image, keyed by sha256, with versioned migrations.

Each component (core, annotations, analysis) has its own ordered migrations, listed in
`binlens.components.MIGRATIONS`; `meta` records the schema version each component reached and
the engine version that produced the cached analysis.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TypeVar

from binlens import __version__, components
from binlens.errors import BinlensError

_T = TypeVar("_T")
BUSY_DEADLINE_S = 30.0  # how long opening a database waits, in all, for another process's lock

Migration = str | Callable[[sqlite3.Connection], None]
# component -> its ordered migrations: those `binlens.components.MIGRATIONS` lists, loaded by the
# first open (`_migrations`), then any a test adds
_MIGRATIONS: dict[str, list[Migration]] = {}
# the table of `binlens.components` a database class migrates -> its components' migrations
_TABLES: dict[str, dict[str, list[Migration]]] = {"MIGRATIONS": _MIGRATIONS}
_loaded_tables: set[str] = set()
_listed_lock = threading.Lock()

_CORE_SCHEMA = """
    CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS image (
        sha256 TEXT PRIMARY KEY, file_name TEXT, size INTEGER, format TEXT, arch TEXT,
        slice TEXT, first_opened TEXT DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
    );
    """
CORE_MIGRATIONS: list[Migration] = [_CORE_SCHEMA]


def _migrations(table: str = "MIGRATIONS") -> dict[str, list[Migration]]:
    """Every component's migrations of the `binlens.components` table `table` (those it lists
    first and in its order, then any a test added)."""
    if table not in _loaded_tables:
        with _listed_lock:
            if table not in _loaded_tables:
                target = _TABLES.setdefault(table, {})
                listed = {name: components.load(ref) for name, ref in getattr(components, table)}
                added = {name: steps for name, steps in target.items() if name not in listed}
                target.clear()
                target.update(listed | added)
                _loaded_tables.add(table)
    return _TABLES[table]


def s64(v: int) -> int:
    """Unsigned 64-bit address -> SQLite's signed INTEGER (the addresses at and above 2**63 negative)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def u64(v: int) -> int:
    """SQLite's signed INTEGER -> unsigned 64-bit address."""
    return v + (1 << 64) if v < 0 else v


def default_home() -> Path:
    """$BINLENS_HOME, else the XDG data dir (~/.local/share/binlens)."""
    env = os.environ.get("BINLENS_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(xdg) / "binlens"


# Analysis output is bounded per input byte: a program's database may grow to this many times the
# size of its file, and to at least DB_MIN_BYTES (small files have fixed costs: schema, indexes,
# the annotations a user adds). SQLite enforces it (`PRAGMA max_page_count`); a write past it fails
# and rolls back whole, so the database keeps its last complete state.
DB_BYTES_PER_INPUT_BYTE = 100
DB_MIN_BYTES = 64 << 20


def database_byte_cap(input_size: int) -> int:
    """The most bytes the database of a `input_size`-byte file may hold."""
    return max(DB_MIN_BYTES, DB_BYTES_PER_INPUT_BYTE * input_size)


def database_path(home: Path, sha256: str, slice_name: str | None = None) -> Path:
    """Where the database of the image `sha256` (and slice) lives under `home`."""
    key = sha256 if not slice_name else f"{sha256}-{slice_name}"
    return home / "db" / f"{key}.sqlite"


class ProgramDatabase:
    """A program's SQLite database. Connections are per thread; writes go through `transaction()`."""

    # the table of `binlens.components` whose schema components this database applies
    SCHEMA = "MIGRATIONS"

    def __init__(self, path: Path, input_size: int | None = None) -> None:
        """Open (creating and migrating) the database at `path`, capped for a file of `input_size`
        bytes (None: the size recorded in its `image` row, when there is one)."""
        self.path = path
        self.max_bytes: int | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []  # every thread's connection, for `close`
        self._generation = 0  # bumped by `close`: a thread's older connection is not used again
        self._opened_lock = threading.Lock()  # (not the write lock: a reader must not wait for a writer)
        self.write_lock = threading.RLock()
        with self.write_lock:
            self._migrate()
        if input_size is None:
            row = self.connect().execute("SELECT max(size) FROM image").fetchone()
            input_size = row[0] if row and isinstance(row[0], int) else None
        if input_size is not None:
            self.max_bytes = database_byte_cap(input_size)
            with self._opened_lock:
                opened = list(self._opened)
            for conn in opened:
                self._apply_cap(conn)

    def _apply_cap(self, conn: sqlite3.Connection) -> None:
        if self.max_bytes is not None:
            (page_size,) = conn.execute("PRAGMA page_size").fetchone()
            conn.execute(f"PRAGMA max_page_count={max(1, self.max_bytes // page_size)}")

    def _at_cap(self, conn: sqlite3.Connection) -> bool:
        """Whether a write SQLite refused as full reached the cap (not the disk's end)."""
        if self.max_bytes is None:
            return False
        if conn.in_transaction:  # the refused transaction's pages are still counted
            (pages,) = conn.execute("PRAGMA page_count").fetchone()
            (page_size,) = conn.execute("PRAGMA page_size").fetchone()
            if (pages + 64) * page_size >= self.max_bytes:
                return True
        st = os.statvfs(self.path.parent)
        return st.f_bavail * st.f_frsize > 64 << 20  # the disk still has room: the cap stopped it

    def _full(self, at_cap: bool) -> BinlensError:
        """The error for a write SQLite refused as full: past the cap, or the disk itself."""
        if at_cap:
            return BinlensError(
                "unsupported",
                f"stopped: this program's database would grow past {self.max_bytes} bytes "
                f"({DB_BYTES_PER_INPUT_BYTE}x its file, at least {DB_MIN_BYTES}); "
                "the write was rolled back and the database keeps its previous state",
                details={"max_database_bytes": self.max_bytes},
            )
        return BinlensError("unavailable", f"the disk holding {self.path.parent} is full; the write was rolled back")

    def connect(self) -> sqlite3.Connection:
        """This thread's connection (WAL, foreign keys on, 5 s busy timeout)."""
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.generation != self._generation:
            conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
            # (the switch to WAL takes a lock SQLite does not wait for: another process
            # creating the same database at once makes it fail with "database is locked")
            retry_busy(lambda: conn.execute("PRAGMA journal_mode=WAL"), "open the program database")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._apply_cap(conn)
            self._local.conn, self._local.generation = conn, self._generation
            with self._opened_lock:
                self._opened.append(conn)
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """An IMMEDIATE transaction: all of it commits, or none of it does.

        Reentrant per thread: inside an open transaction (a batch, say) it becomes a savepoint,
        so a nested writer rolls back only its own part and commits with the outer transaction.
        """
        with self.write_lock:
            conn = self.connect()
            if conn.in_transaction:
                depth = getattr(self._local, "depth", 0) + 1
                self._local.depth = depth
                name = f"nested_{depth}"
                conn.execute(f"SAVEPOINT {name}")
                try:
                    yield conn
                except BaseException:
                    if conn.in_transaction:  # (SQLite may have rolled back the whole transaction itself)
                        conn.execute(f"ROLLBACK TO {name}")
                        conn.execute(f"RELEASE {name}")
                    raise
                else:
                    conn.execute(f"RELEASE {name}")
                finally:
                    self._local.depth = depth - 1
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as err:
                full = isinstance(err, sqlite3.OperationalError) and err.sqlite_errorcode == sqlite3.SQLITE_FULL
                at_cap = full and self._at_cap(conn)
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if full:
                    raise self._full(at_cap) from None
                raise

    def get_meta(self, key: str) -> str | None:
        """The `meta` value of `key`, or None."""
        row = self.connect().execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str, conn: sqlite3.Connection | None = None) -> None:
        """Set the `meta` value of `key` (on `conn`, inside its transaction, when given)."""
        (conn or self.connect()).execute(
            "INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, value),
        )

    def schema_versions(self) -> dict[str, int]:
        """The schema version each component reached."""
        rows = self.connect().execute("SELECT key, value FROM meta WHERE key LIKE 'schema.%'").fetchall()
        return {k.removeprefix("schema."): int(v) for k, v in rows}

    def _migrate(self) -> None:
        """Bring every component's schema to its last version; safe when processes open at once.

        An up-to-date database is only read. Otherwise each step runs in its own IMMEDIATE
        transaction that reads the component's version again once it holds the write lock, so a
        step another process applied meanwhile is not applied twice; a lock another process holds
        is waited for (`retry_busy`).
        """
        conn = self.connect()
        if self._up_to_date(conn):
            return
        retry_busy(lambda: self._locked(conn, _create_meta), "create the schema")
        for component, migrations in _migrations(self.SCHEMA).items():
            step = partial(self._next_step, component=component, migrations=migrations)
            while retry_busy(partial(self._locked, conn, step), f"migrate the {component} schema"):
                pass
        retry_busy(
            lambda: self._locked(conn, lambda c: self.set_meta("binlens_version", __version__, c)),
            "record the version",
        )

    def _up_to_date(self, conn: sqlite3.Connection) -> bool:
        """Whether every component is at its last version and the engine version is this one."""
        try:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone() is None:
                return False
            have = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.OperationalError as err:
            if _is_busy(err):
                return False  # (the locked path waits for the lock)
            raise
        if have.get("binlens_version") != __version__:
            return False
        return all(int(have.get(f"schema.{c}", 0)) >= len(m) for c, m in _migrations(self.SCHEMA).items())

    @staticmethod
    def _locked(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `work` in an IMMEDIATE transaction (the write lock first, then the reads)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # (a COMMIT refused as busy leaves it open: a retry begins anew)
                conn.execute("ROLLBACK")
            raise
        return out

    def _next_step(self, conn: sqlite3.Connection, component: str, migrations: list[Migration]) -> bool:
        """Apply `component`'s first missing step (read under the write lock); False when none is."""
        key = f"schema.{component}"
        row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        have = int(row[0]) if row else 0
        if have >= len(migrations):
            return False
        step = migrations[have]
        if callable(step):
            step(conn)
        else:
            for stmt in _split_sql(step):
                conn.execute(stmt)
        self.set_meta(key, str(have + 1), conn)
        return True

    def record_image(self, sha256: str, file_name: str, size: int, fmt: str, arch: str, slice_name: str | None) -> None:
        """Record the file this database describes (its first record stays)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO image(sha256, file_name, size, format, arch, slice) VALUES(?,?,?,?,?,?)",
                (sha256, file_name, size, fmt, arch, slice_name),
            )

    def defer_checkpoints(self) -> None:
        """Let this thread's commits only append to the write-ahead log: nothing copies it into the
        database until `checkpoint` (a writer that reports its commit first, then checkpoints)."""
        self.connect().execute("PRAGMA wal_autocheckpoint=0")

    def checkpoint(self) -> None:
        """Copy the write-ahead log into the database now, as far as no reader holds it back."""
        self.connect().execute("PRAGMA wal_checkpoint(PASSIVE)")

    def close(self) -> None:
        """Close the connections of every thread (the last one closed copies the write-ahead log into
        the database and removes it)."""
        with self._opened_lock:
            opened, self._opened = self._opened, []
            self._generation += 1
        for conn in opened:
            conn.close()


def _create_meta(conn: sqlite3.Connection) -> None:
    for stmt in _split_sql(_CORE_SCHEMA):
        conn.execute(stmt)


def _is_busy(err: sqlite3.OperationalError) -> bool:
    """Whether `err` is SQLite's "database is locked" / busy (another connection holds a lock)."""
    text = str(err).lower()
    return "locked" in text or "busy" in text


def retry_busy(work: Callable[[], _T], what: str, deadline_s: float = BUSY_DEADLINE_S) -> _T:
    """Run `work`, again after a growing, jittered pause while SQLite says the database is locked.

    Most waits happen inside SQLite (the 5 s busy timeout); this covers the locks it reports at
    once (changing the journal mode, a lock upgrade it refuses to wait for). Past `deadline_s`
    the caller gets `busy`.
    """
    end = time.monotonic() + deadline_s
    pause = 0.005
    while True:
        try:
            return work()
        except sqlite3.OperationalError as err:
            if not _is_busy(err):
                raise
            if time.monotonic() + pause > end:
                raise BinlensError(
                    "busy", f"could not {what}: another process holds the program database's lock; retry shortly"
                ) from None
        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 0.25)


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
