"""Many processes opening one new program database at once: every open succeeds, each migration
step runs once, and the schema ends at the versions this code declares."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

PROCESSES = 12
ROUNDS = 30


def _opener(barrier: Any, results: Any, base: str, rounds: int) -> None:
    """In a child process: each round, wait for every other opener, then open that round's new database."""
    import binlens.api  # noqa: F401 - registers every component's migrations, as the server does
    from binlens.store.database import ProgramDatabase

    for r in range(rounds):
        barrier.wait()
        try:
            db = ProgramDatabase(Path(base) / f"round{r}" / "program.sqlite")
            versions = db.schema_versions()
            db.close()
            results.put((r, None, versions))
        except Exception as err:  # noqa: BLE001 - reported to the parent, which fails the test
            results.put((r, f"{type(err).__name__}: {err}", None))


def test_concurrent_first_opens_all_succeed_and_migrate_once(tmp_path: Path) -> None:
    from binlens import components

    expected = {name: len(components.load(ref)) for name, ref in components.MIGRATIONS}
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES, timeout=120)
    results = ctx.Queue()
    procs = [ctx.Process(target=_opener, args=(barrier, results, str(tmp_path), ROUNDS)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=300) for _ in range(PROCESSES * ROUNDS)]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    errors = sorted({err for _, err, _ in outcomes if err is not None})
    failed_rounds = {r for r, err, _ in outcomes if err is not None}
    assert not errors, f"{len(failed_rounds)} of {ROUNDS} rounds had a failed open: {errors}"
    assert all(versions == expected for _, _, versions in outcomes)
    for r in range(ROUNDS):
        conn = sqlite3.connect(tmp_path / f"round{r}" / "program.sqlite")
        rows = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'schema.%'").fetchall())
        assert {k.removeprefix("schema."): int(v) for k, v in rows.items()} == expected
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        conn.close()
