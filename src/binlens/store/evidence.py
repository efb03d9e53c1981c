"""The evidence ledgers: retained results, keyed by their content-derived ids, in named ledgers.

One SQLite database per home (`$BINLENS_HOME/evidence.sqlite`) holds every ledger, so a ledger
outlives the connection, the program and the server that filled it. A row keeps the record's
RFC 8785 canonical JSON exactly as its id was computed from, so an export streams the stored bytes
and anyone can check the id again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from binlens.store.database import Migration, ProgramDatabase

LEDGER_FILE = "evidence.sqlite"

MIGRATIONS: list[Migration] = [
    """
    CREATE TABLE IF NOT EXISTS evidence (
        seq INTEGER PRIMARY KEY,
        ledger TEXT NOT NULL,
        id TEXT NOT NULL,
        method TEXT NOT NULL,
        program_sha256 TEXT,
        created_at TEXT NOT NULL,
        record BLOB NOT NULL,
        UNIQUE (ledger, id)
    );
    CREATE INDEX IF NOT EXISTS evidence_by_method ON evidence (ledger, method, seq);
    """
]


@dataclass(frozen=True)
class EvidenceRow:
    """One retained record: its ledger position, id, summary columns and canonical JSON bytes."""

    seq: int
    ledger: str
    id: str
    method: str
    program_sha256: str | None
    created_at: str
    record: bytes


_COLUMNS = "seq, ledger, id, method, program_sha256, created_at, record"


def _row(r: tuple[Any, ...]) -> EvidenceRow:
    seq, ledger, id_, method, sha, created, record = r
    return EvidenceRow(seq, ledger, id_, method, sha, created, bytes(record))


class LedgerDatabase(ProgramDatabase):
    """The database of a home's evidence ledgers (its schema: `components.LEDGER_MIGRATIONS`)."""

    SCHEMA = "LEDGER_MIGRATIONS"


class EvidenceStore:
    """The ledgers of one home: add, read, list, delete retained records."""

    def __init__(self, home: Path) -> None:
        """Open (creating and migrating) the ledgers' database under `home`."""
        self.db = LedgerDatabase(home / LEDGER_FILE)

    def add(self, rows: list[EvidenceRow]) -> list[tuple[EvidenceRow, bool]]:
        """Add `rows` in one transaction (all or none); a record its ledger already holds keeps its
        first `created_at`. Each row as stored, with whether it was added now."""
        out = []
        with self.db.transaction() as conn:
            for row in rows:
                cur = conn.execute(
                    "INSERT OR IGNORE INTO evidence (ledger, id, method, program_sha256, created_at, record) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (row.ledger, row.id, row.method, row.program_sha256, row.created_at, row.record),
                )
                stored = self._get(conn, row.ledger, row.id)
                assert stored is not None
                out.append((stored, cur.rowcount == 1))
        return out

    @staticmethod
    def _get(conn: sqlite3.Connection, ledger: str, evidence_id: str) -> EvidenceRow | None:
        r = conn.execute(f"SELECT {_COLUMNS} FROM evidence WHERE ledger=? AND id=?", (ledger, evidence_id)).fetchone()
        return None if r is None else _row(r)

    def get(self, ledger: str, evidence_id: str) -> EvidenceRow | None:
        """The record `evidence_id` of `ledger`, or None."""
        return self._get(self.db.connect(), ledger, evidence_id)

    def page(
        self, ledger: str, after: int, limit: int, method: str | None = None, sha256: str | None = None
    ) -> list[EvidenceRow]:
        """Up to `limit` records of `ledger` after position `after`, oldest first, filtered by
        method and program."""
        sql = f"SELECT {_COLUMNS} FROM evidence WHERE ledger=? AND seq>?"
        args: list[object] = [ledger, after]
        if method is not None:
            sql += " AND method=?"
            args.append(method)
        if sha256 is not None:
            sql += " AND program_sha256=?"
            args.append(sha256)
        sql += " ORDER BY seq LIMIT ?"
        args.append(limit)
        return [_row(r) for r in self.db.connect().execute(sql, args)]

    def count(self, ledger: str) -> int:
        """How many records `ledger` holds."""
        (n,) = self.db.connect().execute("SELECT COUNT(*) FROM evidence WHERE ledger=?", (ledger,)).fetchone()
        return int(n)

    def ledgers(self) -> list[tuple[str, int]]:
        """Every ledger that holds a record, with its count, by name."""
        rows = self.db.connect().execute("SELECT ledger, COUNT(*) FROM evidence GROUP BY ledger ORDER BY ledger")
        return [(str(name), int(n)) for name, n in rows]

    def iterate(self, ledger: str, batch: int = 256) -> Iterator[EvidenceRow]:
        """Every record of `ledger`, oldest first, read a batch at a time (an export streams them)."""
        after = 0
        while True:
            rows = self.page(ledger, after, batch)
            yield from rows
            if len(rows) < batch:
                return
            after = rows[-1].seq

    def delete(self, ledger: str, ids: list[str]) -> list[str]:
        """Delete the records `ids` of `ledger` in one transaction; the ids that were there."""
        gone = []
        with self.db.transaction() as conn:
            for evidence_id in ids:
                if conn.execute("DELETE FROM evidence WHERE ledger=? AND id=?", (ledger, evidence_id)).rowcount:
                    gone.append(evidence_id)
        return gone

    def close(self) -> None:
        """Close the database's connections."""
        self.db.close()
