"""The analysis save: same facts back, indexes rebuilt, CFG edges packed per function, old databases upgraded."""

from __future__ import annotations

import sqlite3
import tempfile
from array import array

import pytest

from binlens.analysis import ENGINE_VERSION, analyze
from binlens.loader.parse_elf import parse_elf
from binlens.store import analysis as store
from binlens.store import analysis_save
from binlens.store.database import CORE_MIGRATIONS, ProgramDatabase

INDEXES = {"call_by_function", "call_by_callee", "xref_pack_by_function"}


def _analysis(path):  # noqa: ANN001, ANN202
    return analyze(parse_elf(path.read_bytes(), path.name))


def _indexes(db: ProgramDatabase) -> set[str]:
    rows = db.connect().execute("SELECT name FROM sqlite_master WHERE type='index' AND sql IS NOT NULL")
    return {r[0] for r in rows}


def test_saved_analysis_reads_back_whole(tmp_path, compile_c):
    a = _analysis(compile_c("sample.c", "-O2", strip=True))
    db = ProgramDatabase(tmp_path / "a.sqlite")
    for _ in range(2):  # the second save replaces the first
        analysis_save.save_analysis(db, a)
        view = store.AnalysisView(db)
        assert [f.address for f in view.functions] == [f.address for f in a.functions]
        for f in a.functions:
            assert view.edges(f.address) == sorted(((e.src, e.dst, e.kind) for e in f.edges), key=lambda t: t[:2])
            assert view.blocks(f.address) == sorted(
                (b.start, b.end, b.instruction_count, b.terminator) for b in f.blocks
            )
            assert view.callees(f.address) == f.call_pairs()
        xrefs = {(x.src, x.dst, x.kind) for x in a.xrefs}
        assert {(s, d, k) for f in a.functions for s, d, k, _fn in view.xrefs_from_function(f.address)} <= xrefs
        # every reference, found by its source and by its destination, with the function it is made from
        owner = {b.start: f.address for f in reversed(a.functions) for b in f.blocks}
        for x in a.xrefs:
            assert (x.src, x.dst, x.kind) in {r[:3] for r in view.xrefs_to(x.dst)}
            assert (x.src, x.dst, x.kind) in {r[:3] for r in view.xrefs_from(x.src)}
            block = view.block_at(x.src)
            fn = {r[3] for r in view.xrefs_from(x.src)}
            assert fn == {owner[block[1]] if block else None}
        assert sorted(r[:3] for r in view.xrefs_between(0, 1 << 64)) == sorted(xrefs)
        blocks = sorted({(b.start, b.end) for f in a.functions for b in f.blocks})
        assert view.blocks_in(0, 1 << 64) == blocks
        for f in a.functions:
            assert view.function_at(f.address).address == f.address
            for b in f.blocks:
                assert view.block_at(b.start)[1:] == (b.start, b.end) and view.block_at(b.end - 1)[2] == b.end
        assert _indexes(db) >= INDEXES
        run = store.load_run(db)
        assert run.counts["functions"] == len(a.functions) and run.counts["xrefs"] == len(a.xrefs)
    assert db.connect().execute("SELECT name FROM sqlite_master WHERE name='edge'").fetchone() is None


def test_edges_pack_round_trip_with_high_addresses():
    class E:  # the shape of analysis.model.Edge
        def __init__(self, src: int, dst: int, kind: str) -> None:
            self.src, self.dst, self.kind = src, dst, kind

    edges = [E(0xFFFF_FFFF_FFFF_F000, 0x10, "jump"), E(1, (1 << 64) - 1, "conditional_taken")]
    assert store.unpack_edges(*store.pack_edges(edges)) == [(e.src, e.dst, e.kind) for e in edges]
    assert store.pack_edges([]) == (None, None) and store.unpack_edges(None, None) == []


def test_an_old_database_is_upgraded_and_its_analysis_runs_again(tmp_path):
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(CORE_MIGRATIONS[0])
    conn.executescript(store.ANALYSIS_MIGRATIONS[0])
    conn.execute("INSERT INTO meta VALUES ('schema.analysis', '1')")
    conn.execute("INSERT INTO func VALUES (4096, 16, 'main', NULL, 'symbol', 0, 1, 4, NULL)")
    conn.execute("INSERT INTO edge VALUES (4096, 4096, 4100, 'jump')")
    conn.execute(
        "INSERT INTO analysis_run VALUES (1, ?, 'done', 1, 1, 4, 0, 0, 16, 16, 0.1, '2026-11-30T00:00:00Z')",
        (ENGINE_VERSION,),
    )
    conn.close()
    db = ProgramDatabase(path)
    assert db.schema_versions()["analysis"] == len(store.ANALYSIS_MIGRATIONS)
    assert store.load_run(db) is None  # the cached analysis is dropped: it runs again and fills the new columns
    assert db.connect().execute("SELECT name FROM sqlite_master WHERE name='edge'").fetchone() is None
    cols = [r[1] for r in db.connect().execute("PRAGMA table_info(func)")]
    assert cols[-2:] == ["edges", "edge_kinds"]
    tables = {r[0] for r in db.connect().execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"xref_pack", "func_blocks"} <= tables and not {"block", "xref"} & tables


def test_rows_made_a_batch_at_a_time_are_the_rows_of_all(compile_c):
    """`streamed_function_rows` (the analysis process's way: a batch of functions at a time) gives
    the very rows `function_rows` gives for all the functions at once, whatever the batch size."""
    a = _analysis(compile_c("sample.c", "-O2", strip=True))
    whole = analysis_save.function_rows(a.functions)
    assert len(a.functions) > 8 and len(whole.calls) > 0
    for batch, blocks in ((1, 8192), (3, 8192), (7, 8192), (len(a.functions), 8192), (10_000, 8192), (10_000, 5)):
        rows = analysis_save.streamed_function_rows(iter(a.functions), batch, blocks=blocks)
        assert rows.func == whole.func and rows.blocks == whole.blocks and rows.calls == whole.calls
        assert rows.counts == whole.counts and rows.spans == whole.spans
    spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the test
    cut = analysis_save.streamed_function_rows(iter(a.functions), 10_000, spool=spool, blocks=5)
    assert cut.spooled > 1  # (the block count, not the function count, cut the batches)
    empty = analysis_save.streamed_function_rows(iter([]))
    assert empty.func == [] and len(empty.calls) == 0 and empty.counts == (0, 0, 0)


def test_spooled_rows_save_as_the_rows_held(tmp_path, compile_c):
    """`streamed_function_rows` with a spool (the forked child's way: each batch written to a file and let go) keeps
    only counts and spans; merged with held rows and saved, the database is the one the held rows
    give, table by table."""

    a = _analysis(compile_c("sample.c", "-O2", strip=True))
    fs = a.functions
    cut = len(fs) // 2
    strings_refs = (a.xrefs, a.strings)
    figures = analysis_save.run_figures(a)
    held = analysis_save.function_rows(fs)
    tables = {}
    for how in ("held", "spooled"):
        if how == "held":
            rows = analysis_save.function_rows(fs)
        else:
            spool = tempfile.TemporaryFile()  # noqa: SIM115 - read back by the save below
            first = analysis_save.streamed_function_rows(iter(fs[:cut]), batch=2, spool=spool)
            assert first.func == [] and len(first.calls) == 0 and first.spooled == (cut + 1) // 2
            assert first.counts == analysis_save.function_rows(fs[:cut]).counts
            first.spool = spool
            rows = analysis_save.merge_function_rows(first, analysis_save.function_rows(fs[cut:]))
            assert rows.counts == held.counts and rows.spans == held.spans
        refs = analysis_save.reference_rows(*strings_refs, rows.spans)
        db = ProgramDatabase(tmp_path / f"{how}.sqlite")
        analysis_save.write_analysis(db, figures, rows, refs)
        conn = db.connect()
        tables[how] = {
            t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr)  # noqa: S608 - fixed names
            for t in ("func", "func_blocks", "call", "xref_pack", "string")
        }
        db.close()
    assert tables["spooled"] == tables["held"] and all(tables["held"].values())
    with pytest.raises(ValueError, match="first"):
        analysis_save.merge_function_rows(held, first)


def test_merged_spans_are_those_of_all_the_functions_at_once():
    """`merge_function_rows` joins two runs of owner spans, merging only where they interleave (a
    chunk shared across the split): the result is `owner_spans`' pick over both, on random runs."""
    import random

    from binlens.store.analysis_save import FunctionRows, merge_function_rows

    rng = random.Random(7)

    def run(lo: int, n: int) -> tuple[list[int], list[int], list[int]]:
        starts = sorted(rng.sample(range(lo, lo + 4 * n), n))
        return starts, [s + rng.randrange(1, 9) for s in starts], [rng.randrange(lo, lo + 50) for _ in starts]

    for _ in range(300):
        a, b = run(0, rng.randrange(0, 30)), run(rng.randrange(0, 150), rng.randrange(0, 30))
        best: dict[int, tuple[int, int]] = {}
        for st, en, fn in sorted([*zip(*a, strict=True), *zip(*b, strict=True)]):
            best.setdefault(st, (en, fn))
        rows = merge_function_rows(
            FunctionRows([], [], array("q"), (0, 0, 0), a), FunctionRows([], [], array("q"), (0, 0, 0), b)
        )
        assert rows.spans == (list(best), [v[0] for v in best.values()], [v[1] for v in best.values()])
