"""The corpus store (docs/CORPUS.md) on SQLite and on a real PostgreSQL server: whole and
idempotent writes (also when a writer is killed midway, and under a race), function search across
optimisation levels, string and import search, failures, removal."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from binlens.corpus.records import BinaryRecord, FileFailure
from binlens.corpus.store import CorpusStore, open_store
from binlens.errors import BinlensError
from corpus_support import record_of

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("cmp_v1.c", "sample.c", "strings.c", "decompile.c", "callbacks.c")


@pytest.fixture(scope="module")
def records(compile_c, tmp_path_factory) -> dict[tuple[str, str], BinaryRecord]:
    """Corpus records of the fixture programs at -O2, and of two of them at -O1 and -O3."""
    from binlens.api import REGISTRY  # noqa: F401 - registers the domains
    from binlens.workspace import Config, Workspace

    ws = Workspace(Config(home=tmp_path_factory.mktemp("records-home")))
    out = {(src, "-O2"): record_of(ws, compile_c(src, opt="-O2")) for src in SOURCES}
    for opt in ("-O1", "-O3"):
        for src in ("cmp_v1.c", "sample.c"):
            out[(src, opt)] = record_of(ws, compile_c(src, opt=opt))
    return out


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str | None:
    """The store to test: None (SQLite under the test's home) or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return None
    server = request.getfixturevalue("postgres_server")
    return server.database("t" + uuid.uuid4().hex[:12])


@pytest.fixture()
def store(store_url, tmp_path):
    s = open_store(store_url, tmp_path / "home")
    yield s
    s.close()


def _count(store: CorpusStore, table: str) -> int:
    return int(store.db.read(f"SELECT COUNT(*) FROM {table}")[0][0])


def test_adding_the_same_binary_twice_adds_nothing(store, records):
    rec = records[("cmp_v1.c", "-O2")]
    assert store.add_binary("lab", rec) is True
    tables = ("corpus_binary", "corpus_function", "corpus_band", "corpus_binary_string", "corpus_string")
    before = {t: _count(store, t) for t in tables}
    assert store.add_binary("lab", rec) is False
    assert {t: _count(store, t) for t in tables} == before
    info = store.info("lab")
    assert (info.binaries, info.functions) == (1, len(rec.functions))
    assert info.strings == len(set(rec.strings)) and info.imports == len(set(rec.imports))
    assert store.indexed("lab") == {rec.sha256}
    assert store.corpora() == ["lab"]
    # another corpus holds its own copy; the strings table keeps each value once
    assert store.add_binary("other", rec) is True
    assert _count(store, "corpus_string") == before["corpus_string"]


def test_a_binary_in_another_fingerprint_format_is_stale_then_replaced(store, records):
    """Fingerprints of another format are not compared with the current ones: the binary is left
    out of `indexed` and of searches, and adding it again replaces it whole."""
    rec = records[("cmp_v1.c", "-O2")]
    assert store.add_binary("lab", rec) is True
    same = next(f for f in rec.functions if f.name == "parse_header")
    assert store.search_function("lab", same, limit=1)[0].similarity == 1.0
    store.db.write(lambda tx: tx.execute("UPDATE corpus_binary SET fingerprints = ?", ("old",)))
    assert store.indexed("lab") == set() and store.stale("lab") == 1
    assert store.search_function("lab", same, limit=5) == []
    tables = ("corpus_binary", "corpus_function", "corpus_band", "corpus_binary_string")
    before = {t: _count(store, t) for t in tables}
    assert store.add_binary("lab", rec) is True
    assert {t: _count(store, t) for t in tables} == before  # replaced, not added beside
    assert store.indexed("lab") == {rec.sha256} and store.stale("lab") == 0
    assert store.search_function("lab", same, limit=1)[0].similarity == 1.0


def test_search_function_finds_the_same_function_at_other_optimisation_levels(store, records):
    for src in SOURCES:
        store.add_binary("lab", records[(src, "-O2")])
    o2 = records[("cmp_v1.c", "-O2")]
    names = {f.name for f in o2.functions}
    found = total = 0
    for opt in ("-O1", "-O3"):
        for f in records[("cmp_v1.c", opt)].functions:
            if f.name not in names or f.name.endswith("@plt") or f.instructions < 8:
                continue
            hits = store.search_function("lab", f, limit=10)
            assert all(a.similarity >= b.similarity for a, b in zip(hits, hits[1:], strict=False))
            total += 1
            found += any(h.name == f.name and h.sha256 == o2.sha256 for h in hits)
    assert total >= 10
    assert found / total >= 0.8, (found, total)
    # an identical function scores 1.0 and comes first
    same = next(f for f in o2.functions if f.name == "parse_header")
    top = store.search_function("lab", same, limit=3)[0]
    assert (top.similarity, top.name, top.sha256, top.address) == (1.0, "parse_header", o2.sha256, same.address)
    # min_similarity bounds every hit
    assert all(h.similarity >= 0.9 for h in store.search_function("lab", same, limit=50, min_similarity=0.9))


@pytest.fixture(scope="module")
def inline_records(compile_c, tmp_path_factory) -> dict[str, BinaryRecord]:
    """Corpus records of inline_ctx.c: with its helpers kept as calls (-O2 -fno-inline), and at -O2
    and -O3 (the helpers inlined into the public functions)."""
    from binlens.api import REGISTRY  # noqa: F401 - registers the domains
    from binlens.workspace import Config, Workspace

    ws = Workspace(Config(home=tmp_path_factory.mktemp("inline-home")))
    out = {"calls": record_of(ws, compile_c("inline_ctx.c", opt="-O2", extra=("-fno-inline",)))}
    for opt in ("-O2", "-O3"):
        out[opt] = record_of(ws, compile_c("inline_ctx.c", opt=opt))
    return out


def test_search_function_finds_a_function_whose_callees_another_build_inlined(store, records, inline_records):
    """A public function whose helper one build inlines and another keeps as a call resembles the
    helper more than its own small other build; the stored function's inlined view (itself with
    its callees merged) finds it and ranks it first."""
    calls = inline_records["calls"]
    for src in SOURCES:
        store.add_binary("lab", records[(src, "-O2")])
    store.add_binary("lab", calls)
    first = top10 = total = 0
    for opt in ("-O2", "-O3"):
        for name in ("table_get", "read_record", "checksum_block", "densest_row", "total_weight"):
            f = next(f for f in inline_records[opt].functions if f.name == name)
            hits = store.search_function("lab", f, limit=10)
            ok = [h.name == name and h.sha256 == calls.sha256 for h in hits]
            total += 1
            first += bool(ok and ok[0])
            top10 += any(ok)
    assert (top10, total) == (10, 10)
    assert first >= 8, first


def test_search_function_with_its_programs_context_finds_builds_that_inlined_its_callees(
    store, records, inline_records
):
    """The other way round: a small function whose helper the stored build inlined is found by
    its own inlined view, built from `context` (its program's functions)."""
    calls = inline_records["calls"]
    for src in SOURCES:
        store.add_binary("lab", records[(src, "-O2")])
    for opt in ("-O2", "-O3"):
        store.add_binary("lab", inline_records[opt])
    inlining = {inline_records[opt].sha256 for opt in ("-O2", "-O3")}
    first = {True: 0, False: 0}
    both = 0
    for name in ("read_record", "checksum_block", "densest_row"):  # (total_weight: one jump, as small as a stub)
        f = next(f for f in calls.functions if f.name == name)
        for with_context in (True, False):
            context = calls.functions if with_context else ()
            tails = calls.tail_calls.get(f.address, ()) if with_context else ()
            hits = store.search_function("lab", f, limit=10, context=context, tail_calls=tails)
            ok = [h.name == name and h.sha256 in inlining for h in hits]
            first[with_context] += bool(ok and ok[0])
            both += with_context and sum(ok) == 2
    assert first == {True: 3, False: 0}, first  # without context its helper's code is not its own
    assert both == 3  # the -O2 and the -O3 build both in the top 10


def test_string_and_import_search(store, records):
    for src in SOURCES:
        store.add_binary("lab", records[(src, "-O2")])
    cmp = records[("cmp_v1.c", "-O2")]
    hits = store.search_string("lab", "bad header", limit=10)
    assert [h.sha256 for h in hits] == [cmp.sha256]
    assert hits[0].matches == ("bad header: %s\n",)
    assert store.search_string("lab", "bad header: %s\n", mode="exact")[0].sha256 == cmp.sha256
    assert store.search_string("lab", "bad header", mode="exact") == []
    everyone = store.search_import("lab", "__libc_start_main", limit=10)
    assert len(everyone) == len(SOURCES)
    assert len(store.search_import("lab", "__libc_start_main", limit=2)) == 2
    fprintf = {h.sha256 for h in store.search_import("lab", "fprintf")}
    assert fprintf == {r.sha256 for k, r in records.items() if k[1] == "-O2" and "fprintf" in r.imports}
    assert store.search_import("lab", "libc_start", mode="substring")[0].matches == ("__libc_start_main",)
    with pytest.raises(BinlensError) as e:
        store.search_string("lab", "x", mode="regex")
    assert e.value.target == "/params/mode"


def test_unknown_corpus_and_bad_names(store):
    with pytest.raises(BinlensError) as e:
        store.info("nope")
    assert (e.value.code, e.value.target) == ("not_found", "/params/corpus")
    with pytest.raises(BinlensError) as e:
        store.create("../x")
    assert (e.value.code, e.value.target) == ("invalid_argument", "/params/corpus")
    assert store.indexed("nope") == set()


def test_failures_are_recorded_and_cleared_when_the_file_succeeds(store, records):
    rec = records[("sample.c", "-O2")]
    store.add_failure("lab", FileFailure(rec.path, rec.sha256, "timeout", "analysis took too long"))
    store.add_failure("lab", FileFailure("/nowhere/x", None, "unreadable", "no such file"))
    store.add_failure("lab", FileFailure(rec.path, rec.sha256, "analysis_failed", "again"))
    assert [(f.path, f.code) for f in store.failures("lab")] == [
        ("/nowhere/x", "unreadable"),
        (rec.path, "analysis_failed"),
    ]
    assert store.info("lab").failures == 2
    store.add_binary("lab", rec)
    assert [f.path for f in store.failures("lab")] == ["/nowhere/x"]


def test_remove_deletes_the_corpus_and_values_no_corpus_uses(store, records):
    a, b = records[("cmp_v1.c", "-O2")], records[("strings.c", "-O2")]
    store.add_binary("one", a)
    store.add_binary("two", b)
    info = store.remove("one")
    assert info.binaries == 1 and store.corpora() == ["two"]
    with pytest.raises(BinlensError):
        store.info("one")
    assert _count(store, "corpus_function") == len(b.functions)
    assert _count(store, "corpus_string") == len(set(b.strings))
    assert store.search_string("two", "bad header") == []
    store.remove("two")
    for table in ("corpus_band", "corpus_binary_import", "corpus_import_name", "corpus_failure"):
        assert _count(store, table) == 0, table


_WRITER = """
import pickle, sys, time
from pathlib import Path
import binlens.corpus.store as store_mod
from binlens.corpus.store import open_store
url, home, rec_file, pause = sys.argv[1] or None, Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "pause"
rec = pickle.loads(Path(rec_file).read_bytes())
if pause:
    real = store_mod.band_keys
    def band_keys(*args):  # (called once the binary and its functions are written, uncommitted)
        print("inside", flush=True)
        time.sleep(600)
        return real(*args)
    store_mod.band_keys = band_keys
store = open_store(url, home)
print("added" if store.add_binary("lab", rec) else "present", flush=True)
"""


def _writer(url: str | None, home: Path, rec_file: Path, pause: bool) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    args = [sys.executable, "-c", _WRITER, url or "", str(home), str(rec_file), "pause" if pause else "go"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_a_writer_killed_inside_add_binary_leaves_nothing_and_a_rerun_completes(store_url, tmp_path, records):
    rec = records[("cmp_v1.c", "-O2")]
    rec_file = tmp_path / "rec.pickle"
    rec_file.write_bytes(pickle.dumps(rec))
    home = tmp_path / "home"
    proc = _writer(store_url, home, rec_file, pause=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "inside", proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    with open_store(store_url, home) as store:
        deadline = time.monotonic() + 60  # (PostgreSQL ends the killed client's session when it sees the socket close)
        while _count(store, "corpus_function") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert store.indexed("lab") == set()
        for table in ("corpus_binary", "corpus_function", "corpus_band", "corpus_binary_string"):
            assert _count(store, table) == 0, table
    rerun = _writer(store_url, home, rec_file, pause=False)
    out, err = rerun.communicate(timeout=120)
    assert out.strip() == "added", err
    with open_store(store_url, home) as store:
        info = store.info("lab")
        assert (info.binaries, info.functions) == (1, len(rec.functions))
        assert _count(store, "corpus_band") > 0


def test_concurrent_writers_of_one_binary_add_it_once(store_url, tmp_path, records):
    rec = records[("sample.c", "-O2")]
    rec_file = tmp_path / "rec.pickle"
    rec_file.write_bytes(pickle.dumps(rec))
    home = tmp_path / "home"
    open_store(store_url, home).close()  # (the schema first: the race is the binary's)
    procs = [_writer(store_url, home, rec_file, pause=False) for _ in range(3)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert sorted(o.strip() for o, _e in outs) == ["added", "present", "present"], outs
    with open_store(store_url, home) as store:
        assert store.info("lab").functions == len(rec.functions)
        assert _count(store, "corpus_function") == len(rec.functions)


def test_bad_store_urls_are_clear_errors(tmp_path, postgres_server):
    with pytest.raises(BinlensError) as e:
        open_store("mysql://x", tmp_path, target="/options/corpus_store")
    assert (e.value.code, e.value.target) == ("invalid_argument", "/options/corpus_store")
    closed = f"postgresql://binlens@127.0.0.1:{postgres_server.port + 1}/postgres?connect_timeout=3"
    with pytest.raises(BinlensError) as e:
        open_store(closed, tmp_path)
    assert e.value.code == "unavailable" and e.value.target == "/corpus_store"


def test_odd_strings_are_kept_and_found(store, records):
    from dataclasses import replace

    long = "é" * 3000  # 6,000 bytes of UTF-8: past what a PostgreSQL index entry holds
    odd = ("nul\x00inside", "lone \udcff surrogate", long, "plain")
    rec = replace(records[("sample.c", "-O2")], strings=odd, imports=("imp\x00ort",), path="/odd/\udcfe/path")
    assert store.add_binary("lab", rec)
    assert store.search_string("lab", "nul\x00inside", mode="exact")[0].matches == ("nul\\x00inside",)
    assert store.search_string("lab", "surrogate")[0].matches == ("lone ? surrogate",)
    hit = store.search_string("lab", "éé")[0]
    assert hit.matches == ("é" * 500,) and hit.file == "/odd/?/path"
    assert store.search_import("lab", "imp\x00ort")[0].sha256 == rec.sha256
    store.add_failure("lab", FileFailure("/x\x00y", None, "unreadable", "bad \udcff name"))
    assert [(f.path, f.message) for f in store.failures("lab")] == [("/x\\x00y", "bad ? name")]


def test_a_store_file_that_cannot_be_opened_is_unavailable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(BinlensError) as e:
        open_store(f"sqlite://{blocker}/sub/corpus.sqlite", tmp_path, target="/options/corpus_store")
    assert (e.value.code, e.value.target) == ("unavailable", "/options/corpus_store")
    not_sqlite = tmp_path / "junk.sqlite"
    not_sqlite.write_bytes(b"\x00junk" * 1000)
    with pytest.raises(BinlensError) as e:
        open_store(f"sqlite://{not_sqlite}", tmp_path)
    assert e.value.code == "unavailable" and "junk.sqlite" in e.value.message


def test_features_blobs_of_format_1_read_back_without_a_context(records):
    """A function stored before the inlining context (features format 1: no callee list) reads
    back as the same fingerprint, with no callees."""
    from binlens.corpus.codec import decode_stored, encode_features, pack_minhash

    fp = next(f for f in records[("cmp_v1.c", "-O2")].functions if f.name == "parse_header")
    current = encode_features(fp, [3, -2])
    assert current[0] == 2 and encode_features(fp).endswith(b"\x00")
    old = b"\x01" + encode_features(fp)[1:-1]  # format 1: the same values, no callee count
    args = (fp.address, fp.name, fp.exact, pack_minhash(fp.minhash))
    assert decode_stored(100, *args, current) == (decode_stored(100, *args, old)[0], (103, 98))
    assert decode_stored(100, *args, old)[1] == ()
    with pytest.raises(ValueError):
        decode_stored(100, *args, b"\x09" + old[1:])
