"""The program database: location, WAL, per-component migrations applied once, atomic transactions."""

from __future__ import annotations

import sqlite3

import pytest

from binlens.store import database
from binlens.store.database import ProgramDatabase, database_path, default_home


def test_home_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("BINLENS_HOME", str(tmp_path / "h"))
    assert default_home() == tmp_path / "h"
    monkeypatch.delenv("BINLENS_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_home() == tmp_path / "xdg" / "binlens"
    assert database_path(tmp_path, "ab" * 32, "aarch64").name == "ab" * 32 + "-aarch64.sqlite"


def test_component_migrations_apply_once_in_order(tmp_path, monkeypatch):
    calls = []

    def step_two(conn: sqlite3.Connection) -> None:
        calls.append("two")
        conn.execute("INSERT INTO demo(v) VALUES ('from step two')")

    monkeypatch.setitem(database._MIGRATIONS, "demo", ["CREATE TABLE demo (v TEXT)", step_two])
    path = tmp_path / "x.sqlite"
    db = ProgramDatabase(path)
    assert db.schema_versions()["demo"] == 2
    assert db.connect().execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()
    ProgramDatabase(path).close()  # reopening applies nothing again
    assert calls == ["two"]
    monkeypatch.setitem(
        database._MIGRATIONS, "demo", ["CREATE TABLE demo (v TEXT)", step_two, "ALTER TABLE demo ADD w"]
    )
    db = ProgramDatabase(path)
    assert db.schema_versions()["demo"] == 3 and calls == ["two"]
    assert db.connect().execute("SELECT v FROM demo").fetchall() == [("from step two",)]


def test_failed_migration_rolls_back_and_keeps_version(tmp_path, monkeypatch):
    monkeypatch.setitem(
        database._MIGRATIONS, "bad", ["CREATE TABLE ok (v)", "CREATE TABLE t (v); SELECT nope FROM nowhere"]
    )
    with pytest.raises(sqlite3.OperationalError):
        ProgramDatabase(tmp_path / "y.sqlite")
    conn = sqlite3.connect(tmp_path / "y.sqlite")
    assert conn.execute("SELECT value FROM meta WHERE key='schema.bad'").fetchone() == ("1",)
    assert conn.execute("SELECT name FROM sqlite_master WHERE name='t'").fetchone() is None


def test_transaction_is_all_or_nothing(tmp_path):
    db = ProgramDatabase(tmp_path / "z.sqlite")
    with db.transaction() as conn:
        conn.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    with pytest.raises(RuntimeError), db.transaction() as conn:
        conn.execute("INSERT INTO kv VALUES ('a', '1')")
        raise RuntimeError("boom")
    assert db.connect().execute("SELECT count(*) FROM kv").fetchone() == (0,)


def test_nested_transaction_is_a_savepoint(tmp_path):
    db = ProgramDatabase(tmp_path / "n.sqlite")
    with db.transaction() as conn:
        conn.execute("CREATE TABLE kv (k TEXT PRIMARY KEY)")
    with db.transaction() as outer:
        outer.execute("INSERT INTO kv VALUES ('outer')")
        with pytest.raises(RuntimeError), db.transaction() as inner:
            inner.execute("INSERT INTO kv VALUES ('inner-rolled-back')")
            raise RuntimeError("inner fails")
        with db.transaction() as inner:
            inner.execute("INSERT INTO kv VALUES ('inner-kept')")
    rows = db.connect().execute("SELECT k FROM kv ORDER BY k").fetchall()
    assert rows == [("inner-kept",), ("outer",)]


def test_name_map_reverse_index_follows_every_change():
    """Program.user_names answers name -> address from an index that matches a full scan."""
    import random

    from binlens.workspace import NameMap

    rng = random.Random(7)
    names = NameMap()
    for _ in range(3000):
        va, name = rng.randrange(40), f"n{rng.randrange(12)}"
        op = rng.randrange(6)
        if op == 0:
            names.pop(va, None)
        elif op == 1 and va in names:
            del names[va]
        elif op == 2:
            names.update({va: name, va + 1: name})
        elif op == 3:
            names.setdefault(va, name)
        elif op == 4 and rng.random() < 0.02:
            names.clear()
        else:
            names[va] = name
        for probe in {name, *list(names.values())[:3]}:
            expect = [a for a, n in names.items() if n == probe]
            assert sorted(names.addresses_of(probe)) == sorted(expect)
            assert (names.address_of(probe) is None) == (not expect)


def test_close_closes_the_connections_of_every_thread(tmp_path) -> None:  # noqa: ANN001
    """A program's database opened in several threads (the server's, an analysis thread's) is
    closed whole: the write-ahead log is folded in and removed, and a later use reopens."""
    import threading

    db = ProgramDatabase(tmp_path / "p.sqlite")
    with db.transaction() as conn:
        conn.execute("CREATE TABLE t (a, b)")
        conn.execute("INSERT INTO t VALUES (1, 1)")
    other = threading.Thread(target=lambda: db.connect().execute("SELECT * FROM t").fetchall())
    other.start()
    other.join()
    db.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.sqlite"]
    assert db.connect().execute("SELECT * FROM t").fetchall() == [(1, 1)]
    db.close()
