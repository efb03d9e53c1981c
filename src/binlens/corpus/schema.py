"""The corpus store's schema: one list of migration steps for SQLite and PostgreSQL.

Steps are written once; `{pk}`, `{blob}` and `{norowid}` become each database's spelling (SQLite's
INTEGER PRIMARY KEY rowid, BLOB and WITHOUT ROWID tables; PostgreSQL's BIGSERIAL, BYTEA and plain
tables). `corpus_schema` holds how many steps were applied; `migrate` applies the missing ones, each
in one transaction with the version bump, under a lock (SQLite's write lock, a PostgreSQL advisory
lock), so processes opening one store at once apply each step once.

Tables (see docs/CORPUS.md): `corpus` (names), `corpus_binary` (one row per binary per corpus,
unique by sha256), `corpus_function` (exact fingerprint, MinHash blob, features blob),
`corpus_band` (the LSH band keys -> function), `corpus_string`/`corpus_import_name` (each distinct
value once, shared by every corpus) with the `corpus_binary_string`/`corpus_binary_import` links,
and `corpus_failure` (files that could not be indexed, by path).
"""

from __future__ import annotations

from binlens.corpus.dialect import Database, Tx

MIGRATIONS: list[str] = [
    """
    CREATE TABLE corpus (id {pk}, name TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL);
    CREATE TABLE corpus_binary (
        id {pk}, corpus_id BIGINT NOT NULL, sha256 TEXT NOT NULL, path TEXT NOT NULL,
        size BIGINT NOT NULL, format TEXT NOT NULL, arch TEXT NOT NULL, bits INTEGER NOT NULL,
        functions INTEGER NOT NULL, seconds REAL NOT NULL, added_at TEXT NOT NULL,
        UNIQUE (corpus_id, sha256));
    CREATE TABLE corpus_function (
        id {pk}, binary_id BIGINT NOT NULL, corpus_id BIGINT NOT NULL, address BIGINT NOT NULL,
        name TEXT, exact {blob} NOT NULL, minhash {blob} NOT NULL, features {blob} NOT NULL);
    CREATE INDEX corpus_function_by_exact ON corpus_function (corpus_id, exact);
    CREATE INDEX corpus_function_by_binary ON corpus_function (binary_id);
    CREATE TABLE corpus_band (
        band BIGINT NOT NULL, function_id BIGINT NOT NULL, PRIMARY KEY (band, function_id)) {norowid};
    CREATE TABLE corpus_string (id {pk}, value TEXT NOT NULL UNIQUE);
    CREATE TABLE corpus_binary_string (
        binary_id BIGINT NOT NULL, string_id BIGINT NOT NULL, PRIMARY KEY (binary_id, string_id)) {norowid};
    CREATE INDEX corpus_binary_string_by_string ON corpus_binary_string (string_id);
    CREATE TABLE corpus_import_name (id {pk}, value TEXT NOT NULL UNIQUE);
    CREATE TABLE corpus_binary_import (
        binary_id BIGINT NOT NULL, import_id BIGINT NOT NULL, PRIMARY KEY (binary_id, import_id)) {norowid};
    CREATE INDEX corpus_binary_import_by_import ON corpus_binary_import (import_id);
    CREATE TABLE corpus_failure (
        corpus_id BIGINT NOT NULL, path TEXT NOT NULL, sha256 TEXT, code TEXT NOT NULL,
        message TEXT NOT NULL, at TEXT NOT NULL, PRIMARY KEY (corpus_id, path));
    """,
]

_SPELLING = {
    "sqlite": {"pk": "INTEGER PRIMARY KEY", "blob": "BLOB", "norowid": "WITHOUT ROWID"},
    "postgresql": {"pk": "BIGSERIAL PRIMARY KEY", "blob": "BYTEA", "norowid": ""},
}
_LOCK_KEY = 0x62696E6C656E73  # the PostgreSQL advisory lock the migrations take ("binlens")


def migrate(db: Database) -> int:
    """Apply the missing migration steps; the schema version after."""
    db.write(_create_version_table)
    while True:
        version, applied = db.write(_next_step)
        if not applied:
            return version


def _create_version_table(tx: Tx) -> None:
    if tx.kind == "postgresql":
        tx.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK_KEY,))
    tx.execute("CREATE TABLE IF NOT EXISTS corpus_schema (version INTEGER NOT NULL)")
    if not tx.execute("SELECT version FROM corpus_schema"):
        tx.execute("INSERT INTO corpus_schema (version) VALUES (0)")


def _next_step(tx: Tx) -> tuple[int, bool]:
    kind = tx.kind
    if kind == "postgresql":
        tx.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK_KEY,))
    version = int(tx.execute("SELECT version FROM corpus_schema")[0][0])
    if version >= len(MIGRATIONS):
        return version, False
    for statement in MIGRATIONS[version].format(**_SPELLING[kind]).split(";"):
        if statement.strip():
            tx.execute(statement)
    tx.execute("UPDATE corpus_schema SET version = ?", (version + 1,))
    return version + 1, True
