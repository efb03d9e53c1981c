"""Decompiled functions cached in the program database.

A row is keyed by the function, the provider and its version; it holds the digest of everything
the provider was given (the function's and its callees' regions, their names and prototypes, the
globals it refers to, the user's local variables, the request format). A lookup hits only when
the digest of what would be sent now matches, so an annotation edit invalidates exactly the
results whose input it changed, and an undo that restores the input makes the stored result
current again only if it is still the stored one.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from binlens.store.database import ProgramDatabase, s64

MIGRATIONS = [
    """
    CREATE TABLE IF NOT EXISTS decompiled (
        address INTEGER NOT NULL,
        provider TEXT NOT NULL,
        version TEXT NOT NULL,
        inputs TEXT NOT NULL,
        result TEXT NOT NULL,
        PRIMARY KEY (address, provider, version));
    """,
]


def cached(db: ProgramDatabase, address: int, provider: str, version: str, inputs: str) -> dict[str, Any] | None:
    """The stored result of decompiling `address` with exactly `inputs` (a digest), or None."""
    row = (
        db.connect()
        .execute(
            "SELECT inputs, result FROM decompiled WHERE address=? AND provider=? AND version=?",
            (s64(address), provider, version),
        )
        .fetchone()
    )
    if row is None or row[0] != inputs:
        return None
    try:
        value = json.loads(row[1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def store(db: ProgramDatabase, address: int, provider: str, version: str, inputs: str, result: dict[str, Any]) -> None:
    """Keep `result` as the current decompilation of `address` (one row per function and provider version)."""
    text = json.dumps(result, separators=(",", ":"))
    try:
        with db.transaction() as conn:
            conn.execute(
                "INSERT INTO decompiled(address, provider, version, inputs, result) VALUES(?,?,?,?,?) "
                "ON CONFLICT(address, provider, version) DO UPDATE SET inputs=excluded.inputs, result=excluded.result",
                (s64(address), provider, version, inputs, text),
            )
    except sqlite3.OperationalError as err:  # a busy database costs a cache entry, never the answer
        if "locked" not in str(err) and "busy" not in str(err) and "readonly" not in str(err):
            raise
