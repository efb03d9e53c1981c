"""Function fingerprints in the program database (`docs/COMPARE.md`), and the bulk reads of the
stored analysis that computing them needs.

`fp_run` records which analysis the stored fingerprints were computed from (`analysis_key`: the
engine version, the run's finish time and the functions' extents, hashed): when the analysis runs
again or a function is created or deleted, the key changes and the fingerprints are computed again
on next use. One `fingerprint` row per function: the exact fingerprint (indexed, so a corpus finds
equal functions by lookup), the MinHash (32 little-endian u32 minima) and the other features as JSON.
"""

from __future__ import annotations

import json
import sqlite3
import struct
from collections.abc import Sequence

from binlens.analysis.fingerprint.model import MINHASH_BINS, Fingerprint
from binlens.store.analysis import AnalysisView, load_run, unpack_xrefs
from binlens.store.database import Migration, ProgramDatabase, s64, u64

FINGERPRINT_VERSION = "4"  # the fingerprints' own format: a new one computes them again

MIGRATIONS: list[Migration] = [
    """
    CREATE TABLE IF NOT EXISTS fp_run (
        id INTEGER PRIMARY KEY CHECK (id = 1), analysis_key TEXT NOT NULL, functions INTEGER NOT NULL,
        seconds REAL NOT NULL);
    CREATE TABLE IF NOT EXISTS fingerprint (
        address INTEGER PRIMARY KEY, exact BLOB NOT NULL, minhash BLOB NOT NULL, features TEXT NOT NULL);
    CREATE INDEX IF NOT EXISTS fingerprint_by_exact ON fingerprint(exact);
    """,
]
_MH = struct.Struct(f"<{MINHASH_BINS}I")


def analysis_key(db: ProgramDatabase, view: AnalysisView) -> str:
    """A key of the stored analysis the fingerprints come from (changes whenever it does)."""
    import hashlib  # (here: every process that opens a database imports this module, and hashlib
    # loads OpenSSL, which the analysis process does without)

    run = load_run(db)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{FINGERPRINT_VERSION}|{run.engine if run else ''}|{run.finished_at if run else ''}|".encode())
    for f in view.functions:
        h.update(struct.pack("<QQ", f.address, f.size))
    return h.hexdigest()


def stored_key(db: ProgramDatabase) -> str | None:
    """The `analysis_key` of the stored fingerprints, or None when there are none."""
    row = db.connect().execute("SELECT analysis_key FROM fp_run WHERE id=1").fetchone()
    return None if row is None else str(row[0])


def save_fingerprints(db: ProgramDatabase, key: str, fps: Sequence[Fingerprint], seconds: float) -> None:
    """Replace the stored fingerprints with `fps` (one transaction)."""
    rows = [
        (
            s64(f.address),
            f.exact,
            _MH.pack(*f.minhash),
            json.dumps(
                [
                    f.size,
                    f.name,
                    f.blocks,
                    f.edges,
                    f.loops,
                    f.instructions,
                    f.classes,
                    [str(c) for c in f.constants],
                    f.strings,
                    f.imports,
                    f.callees,
                ],
                separators=(",", ":"),
            ),
        )
        for f in fps
    ]
    with db.transaction() as conn:
        conn.execute("DELETE FROM fingerprint")
        conn.executemany("INSERT INTO fingerprint VALUES (?,?,?,?)", rows)
        conn.execute(
            "INSERT INTO fp_run VALUES (1,?,?,?) ON CONFLICT(id) DO UPDATE SET analysis_key=excluded.analysis_key, "
            "functions=excluded.functions, seconds=excluded.seconds",
            (key, len(rows), seconds),
        )


def load_fingerprints(db: ProgramDatabase) -> list[Fingerprint]:
    """Every stored fingerprint, by address."""
    out = []
    for address, exact, mh, features in db.connect().execute(
        "SELECT address, exact, minhash, features FROM fingerprint"
    ):
        size, name, blocks, edges, loops, insns, classes, consts, strings, imports, callees = json.loads(features)
        out.append(
            Fingerprint(
                address=u64(address),
                size=size,
                name=name,
                exact=bytes(exact),
                blocks=blocks,
                edges=edges,
                loops=loops,
                instructions=insns,
                classes=tuple(classes),
                constants=tuple(int(c) for c in consts),
                strings=tuple(strings),
                imports=tuple(imports),
                callees=tuple(callees),
                minhash=_MH.unpack(mh),
            )
        )
    out.sort(key=lambda f: f.address)
    return out


def functions_with_exact(db: ProgramDatabase, exact: bytes) -> list[int]:
    """The entries of the functions whose exact fingerprint is `exact`."""
    rows = db.connect().execute("SELECT address FROM fingerprint WHERE exact=?", (exact,)).fetchall()
    return sorted(u64(a) for (a,) in rows)


def all_calls(db: ProgramDatabase) -> dict[int, list[int]]:
    """Every function's callees in call-site order."""
    out: dict[int, list[int]] = {}
    for fn, _site, callee in db.connect().execute("SELECT function, site, callee FROM call ORDER BY function, site"):
        out.setdefault(u64(fn), []).append(u64(callee))
    return out


def all_function_refs(db: ProgramDatabase) -> dict[int, list[tuple[int, int, str]]]:
    """Every function's references (src, dst, kind), by source."""
    out: dict[int, list[tuple[int, int, str]]] = {}
    conn: sqlite3.Connection = db.connect()
    for fn, data, kinds in conn.execute("SELECT function, data, kinds FROM xref_pack WHERE function IS NOT NULL"):
        out.setdefault(u64(fn), []).extend(unpack_xrefs(data, kinds))
    for refs in out.values():
        refs.sort()
    return out


def all_blocks(db: ProgramDatabase) -> dict[int, tuple[bytes, str]]:
    """Every function's packed blocks (`store.analysis.unpack_blocks` reads them)."""
    return {u64(a): (d, t) for a, d, t in db.connect().execute("SELECT address, data, terms FROM func_blocks")}


def all_edges(db: ProgramDatabase) -> dict[int, tuple[bytes | None, str | None]]:
    """Every function's packed CFG edges (`store.analysis.unpack_edges` reads them)."""
    return {u64(a): (d, k) for a, d, k in db.connect().execute("SELECT address, edges, edge_kinds FROM func")}
