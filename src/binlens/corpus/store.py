"""The corpus store (`docs/CORPUS.md`): binaries, their functions' fingerprints, strings and imports,
by corpus name, in SQLite (`$BINLENS_HOME/corpus.sqlite`) or PostgreSQL (by URL, shared by a team
and by many indexing workers).

Writes are whole: `add_binary` puts a binary, its functions, their LSH bands, its strings and imports
in one transaction, and the `(corpus, sha256)` unique constraint with ON CONFLICT DO NOTHING makes a
second add of the same binary (by a rerun, or by a racing worker) add nothing. A binary stored in
another fingerprint format (`FINGERPRINT_VERSION`) is stale: searches pass over it, `indexed` leaves
it out so the indexer analyses it again, and that add replaces it.

Function search: the query's exact fingerprint is looked up (similarity 1.0); its MinHash's band
keys select candidates (the functions sharing most bands, of their own or of their inlined view,
first, at most `_candidates(limit)`; with the query's program as context, its inlined view's keys
too), which are scored with `ranking.corpus_similarity()` on their stored features, each as the
best of itself, its inlined view and the query's (`ranking.py`).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from binlens.analysis.fingerprint.model import Fingerprint
from binlens.corpus.codec import (
    BANDS,
    band_keys,
    decode_fingerprint,
    decode_stored,
    encode_features,
    pack_minhash,
    stored_form,
)
from binlens.corpus.dialect import Database, Row, Tx, open_postgresql, open_sqlite
from binlens.corpus.ranking import candidate_score, inline_callees, inlined, may_have_inlined, query_view
from binlens.corpus.records import BinaryHit, BinaryRecord, CorpusInfo, FileFailure, FunctionHit
from binlens.corpus.schema import migrate
from binlens.errors import BinlensError, invalid, not_found
from binlens.store.fingerprints import FINGERPRINT_VERSION

STORE_FILE = "corpus.sqlite"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
MAX_LIMIT = 1000
MAX_VALUE_BYTES = 1000  # longer strings and paths are kept cut to this (a unique index bounds its keys)
MATCHES_PER_BINARY = 20  # the matching strings or imports a BinaryHit lists at most
SEARCH_MODES = ("substring", "exact")


def open_store(url: str | None, home: Path, *, target: str = "/corpus_store") -> CorpusStore:
    """The corpus store: SQLite under `home` when `url` is None (or a `sqlite:///path` URL),
    PostgreSQL for a `postgresql://` URL. The schema is created or migrated on open. A bad URL or an
    unreachable server is a BinlensError whose target is `target`."""
    if url is None or url == "" or url.startswith("sqlite:///"):
        path = home / STORE_FILE if not url else Path(url.removeprefix("sqlite://"))
        try:
            db = open_sqlite(path)
        except (OSError, sqlite3.Error) as err:
            raise BinlensError("unavailable", f"could not open the corpus store {path}: {err}", target=target) from err
        return _opened(db, target)
    if url.startswith(("postgresql://", "postgres://")):
        return _opened(open_postgresql(url, target), target)
    raise invalid(
        "the corpus store is a postgresql://user@host/db URL, a sqlite:///path URL, or nothing "
        "(SQLite under $BINLENS_HOME)",
        target,
    )


def _opened(db: Database, target: str) -> CorpusStore:
    """The store over `db`, its schema migrated; a failure closes it and names `target`."""
    try:
        return CorpusStore(db)
    except BinlensError as err:
        db.close()
        raise BinlensError(err.code, err.message, target=err.target or target, details=err.details) from None


def clean(text: str) -> str:
    """`text` as both databases can keep and index it: NUL written `\\x00` (PostgreSQL text refuses
    it), a lone surrogate as `?` (UTF-8 has none), at most `MAX_VALUE_BYTES` bytes of UTF-8 (a
    PostgreSQL index entry holds about 2,700)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    data = text.encode("utf-8", "replace")
    return data[:MAX_VALUE_BYTES].decode("utf-8", "ignore")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _s64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _u64(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


def check_name(name: object, target: str = "/params/corpus") -> str:
    """`name` when it is a valid corpus name (letters, digits, `_.-`, at most 64), else invalid."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise invalid("a corpus name is 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit", target)
    return name


class CorpusStore:
    """Named corpora of binaries in one database."""

    def __init__(self, db: Database) -> None:
        """Use `db`, creating or migrating its schema."""
        self.db = db
        self.kind = db.kind
        self.schema_version = migrate(db)

    # -- corpora ---------------------------------------------------------------------------

    def create(self, name: str) -> None:
        """Create the corpus `name` unless it exists."""
        check_name(name)
        self.db.write(lambda tx: self._ensure(tx, name))

    def _ensure(self, tx: Tx, name: str) -> int:
        tx.execute("INSERT INTO corpus (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING", (name, _now()))
        return int(tx.execute("SELECT id FROM corpus WHERE name = ?", (name,))[0][0])

    def _id(self, name: str, target: str = "/params/corpus") -> int:
        check_name(name, target)
        rows = self.db.read("SELECT id FROM corpus WHERE name = ?", (name,))
        if not rows:
            raise not_found(f"no corpus named {name!r} in {self.db.where}", target, corpus=name)
        return int(rows[0][0])

    def corpora(self) -> list[str]:
        """The corpora's names, sorted."""
        return [str(r[0]) for r in self.db.read("SELECT name FROM corpus ORDER BY name")]

    def info(self, name: str) -> CorpusInfo:
        """The corpus's counts (binaries, functions, distinct strings and imports, failures) and times."""
        cid = self._id(name)
        created = str(self.db.read("SELECT created_at FROM corpus WHERE id = ?", (cid,))[0][0])
        binaries, functions, last_added = self.db.read(
            "SELECT COUNT(*), COALESCE(SUM(functions), 0), MAX(added_at) FROM corpus_binary WHERE corpus_id = ?",
            (cid,),
        )[0]
        strings = self.db.read(
            "SELECT COUNT(DISTINCT l.string_id) FROM corpus_binary_string l "
            "JOIN corpus_binary b ON b.id = l.binary_id WHERE b.corpus_id = ?",
            (cid,),
        )[0][0]
        imports = self.db.read(
            "SELECT COUNT(DISTINCT l.import_id) FROM corpus_binary_import l "
            "JOIN corpus_binary b ON b.id = l.binary_id WHERE b.corpus_id = ?",
            (cid,),
        )[0][0]
        failures, last_failed = self.db.read(
            "SELECT COUNT(*), MAX(at) FROM corpus_failure WHERE corpus_id = ?", (cid,)
        )[0]
        updated = max(t for t in (created, last_added, last_failed) if t)
        return CorpusInfo(
            name, int(binaries), int(functions), int(strings), int(imports), int(failures), created, str(updated)
        )

    def indexed(self, name: str) -> set[str]:
        """The sha256 of every binary the corpus holds in the current fingerprint format (empty for
        a corpus not created yet)."""
        rows = self.db.read(
            "SELECT b.sha256 FROM corpus_binary b JOIN corpus c ON c.id = b.corpus_id "
            "WHERE c.name = ? AND b.fingerprints = ?",
            (check_name(name), FINGERPRINT_VERSION),
        )
        return {str(r[0]) for r in rows}

    def stale(self, name: str) -> int:
        """How many of the corpus's binaries hold fingerprints of another format (indexing again
        replaces them; searches pass over them)."""
        cid = self._id(name)
        rows = self.db.read(
            "SELECT COUNT(*) FROM corpus_binary WHERE corpus_id = ? AND fingerprints <> ?", (cid, FINGERPRINT_VERSION)
        )
        return int(rows[0][0])

    def remove(self, name: str) -> CorpusInfo:
        """Delete the corpus and everything in it (one transaction); its counts before."""
        before = self.info(name)
        cid = self._id(name)

        def work(tx: Tx) -> None:
            binaries = "SELECT id FROM corpus_binary WHERE corpus_id = ?"
            tx.execute(
                "DELETE FROM corpus_band WHERE function_id IN (SELECT id FROM corpus_function WHERE corpus_id = ?)",
                (cid,),
            )
            tx.execute("DELETE FROM corpus_function WHERE corpus_id = ?", (cid,))
            tx.execute(f"DELETE FROM corpus_binary_string WHERE binary_id IN ({binaries})", (cid,))
            tx.execute(f"DELETE FROM corpus_binary_import WHERE binary_id IN ({binaries})", (cid,))
            tx.execute("DELETE FROM corpus_binary WHERE corpus_id = ?", (cid,))
            tx.execute("DELETE FROM corpus_failure WHERE corpus_id = ?", (cid,))
            tx.execute("DELETE FROM corpus WHERE id = ?", (cid,))
            # values no corpus links any more (each value is kept once for every corpus)
            tx.execute(
                "DELETE FROM corpus_string WHERE NOT EXISTS "
                "(SELECT 1 FROM corpus_binary_string l WHERE l.string_id = corpus_string.id)"
            )
            tx.execute(
                "DELETE FROM corpus_import_name WHERE NOT EXISTS "
                "(SELECT 1 FROM corpus_binary_import l WHERE l.import_id = corpus_import_name.id)"
            )

        self.db.write(work)
        return before

    # -- writing -----------------------------------------------------------------------------

    def add_binary(self, name: str, record: BinaryRecord) -> bool:
        """Add one binary with its functions, bands, strings and imports in one transaction
        (creating the corpus if needed); False, adding nothing, when the corpus holds its sha256
        already in the current fingerprint format (in another, it is replaced). A failure recorded
        for its path or sha256 is cleared."""
        check_name(name)
        functions = list(record.functions)
        strings = sorted({clean(s) for s in record.strings})
        imports = sorted({clean(s) for s in record.imports})
        path = clean(record.path)
        # each function's inlining context (indexes into `functions`) and its inlined view
        position = {fp.address: i for i, fp in enumerate(functions)}
        by_address = {fp.address: fp for fp in functions}
        tails = record.tail_calls
        context = [
            [position[c.address] for c in inline_callees(fp, by_address, tails.get(fp.address, ()))] for fp in functions
        ]
        views = [inlined(fp, [functions[j] for j in ctx]) for fp, ctx in zip(functions, context, strict=True)]

        def work(tx: Tx) -> bool:
            cid = self._ensure(tx, name)
            tx.execute(
                "DELETE FROM corpus_failure WHERE corpus_id = ? AND (path = ? OR sha256 = ?)",
                (cid, path, record.sha256),
            )
            old = tx.execute(
                "SELECT id FROM corpus_binary WHERE corpus_id = ? AND sha256 = ? AND fingerprints <> ?",
                (cid, record.sha256, FINGERPRINT_VERSION),
            )
            if old:  # stored in another fingerprint format: replaced
                _delete_binary(tx, int(old[0][0]))
            rows = tx.execute(
                "INSERT INTO corpus_binary (corpus_id, sha256, path, size, format, arch, bits, functions, "
                "seconds, added_at, fingerprints) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (corpus_id, sha256) DO NOTHING RETURNING id",
                (
                    cid,
                    record.sha256,
                    path,
                    record.size,
                    record.format,
                    record.arch,
                    record.bits,
                    len(functions),
                    float(record.seconds),
                    _now(),
                    FINGERPRINT_VERSION,
                ),
            )
            if not rows:
                return False
            bid = int(rows[0][0])
            ids = tx.new_ids("corpus_function", len(functions))
            tx.insert_many(
                "corpus_function",
                ("id", "binary_id", "corpus_id", "address", "name", "exact", "minhash", "features"),
                [
                    (
                        fid,
                        bid,
                        cid,
                        _s64(fp.address),
                        _name(fp.name),
                        fp.exact,
                        pack_minhash(fp.minhash),
                        encode_features(fp, [ids[j] - fid for j in context[i]]),
                    )
                    for i, (fid, fp) in enumerate(zip(ids, functions, strict=True))
                ],
            )
            bands = {(key, fid) for fid, fp in zip(ids, functions, strict=True) for key in band_keys(fp.minhash, cid)}
            for fid, view in zip(ids, views, strict=True):
                if view is not None:
                    bands.update((key, fid) for key in band_keys(view.minhash, cid, first_band=BANDS))
            tx.insert_many("corpus_band", ("band", "function_id"), sorted(bands))
            sids = tx.intern("corpus_string", strings)
            tx.insert_many("corpus_binary_string", ("binary_id", "string_id"), [(bid, sids[s]) for s in strings])
            iids = tx.intern("corpus_import_name", imports)
            tx.insert_many("corpus_binary_import", ("binary_id", "import_id"), [(bid, iids[s]) for s in imports])
            return True

        return self.db.write(work)

    def add_failure(self, name: str, failure: FileFailure) -> None:
        """Record (or replace) why the file at `failure.path` could not be indexed."""
        check_name(name)

        def work(tx: Tx) -> None:
            cid = self._ensure(tx, name)
            tx.execute(
                "INSERT INTO corpus_failure (corpus_id, path, sha256, code, message, at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (corpus_id, path) DO UPDATE SET sha256 = excluded.sha256, code = excluded.code, "
                "message = excluded.message, at = excluded.at",
                (cid, clean(failure.path), failure.sha256, failure.code, clean(failure.message), _now()),
            )

        self.db.write(work)

    def failures(self, name: str, limit: int | None = None) -> list[FileFailure]:
        """The files the corpus could not index, by path (the first `limit` when given)."""
        cid = self._id(name)
        sql = "SELECT path, sha256, code, message FROM corpus_failure WHERE corpus_id = ? ORDER BY path"
        params: tuple[int, ...] = (cid,)
        if limit is not None:
            sql += " LIMIT ?"
            params = (cid, limit)
        return [FileFailure(str(p), s, str(c), str(m)) for p, s, c, m in self.db.read(sql, params)]

    # -- searching ---------------------------------------------------------------------------

    def search_function(
        self,
        name: str,
        fp: Fingerprint,
        limit: int = 10,
        min_similarity: float = 0.0,
        context: Sequence[Fingerprint] = (),
        tail_calls: Sequence[int] = (),
    ) -> list[FunctionHit]:
        """The corpus's functions most similar to `fp`, best first: exact-fingerprint matches
        (1.0), then band candidates scored by `corpus_similarity()` (each as the better of itself
        and its inlined view, and of `fp`'s inlined view when `context`, the other functions of
        `fp`'s program, gives it one; `tail_calls`: the functions `fp` tail-jumps to), those at
        `min_similarity` or above."""
        cid = self._id(name)
        limit = max(1, min(int(limit), MAX_LIMIT))
        query = stored_form(fp)
        view_of_query = query_view(fp, context, tail_calls)
        cols = "f.id, f.address, f.name, f.exact, f.minhash, f.features, b.sha256, b.path"
        join = "FROM corpus_function f JOIN corpus_binary b ON b.id = f.binary_id"
        exact = self.db.read(
            f"SELECT {cols} {join} WHERE f.corpus_id = ? AND f.exact = ? AND b.fingerprints = ? ORDER BY f.id LIMIT ?",
            (cid, fp.exact, FINGERPRINT_VERSION, limit),
        )
        hits: dict[int, FunctionHit] = {int(r[0]): _hit(r, 1.0) for r in exact}
        if len(hits) < limit:
            ids = [i for i in self.candidate_ids(cid, fp, limit, view_of_query) if i not in hits]
            rows = self._rows(f"SELECT {cols} {join} WHERE b.fingerprints = ? AND f.id IN", ids, (FINGERPRINT_VERSION,))
            found = {int(r[0]): (r, *decode_stored(int(r[0]), _u64(int(r[1])), r[2], r[3], r[4], r[5])) for r in rows}
            wanted = {fid: calls for fid, (_r, f, calls) in found.items() if calls and may_have_inlined(query, f)}
            callees = self._callees(sorted({c for calls in wanted.values() for c in calls}))
            for fid, (r, stored, _calls) in found.items():
                view = inlined(stored, [callees[c] for c in wanted.get(fid, ()) if c in callees])
                score = candidate_score(query, stored, view, view_of_query)
                if score >= min_similarity:
                    hits[fid] = _hit(r, score)
        ranked = sorted(hits.values(), key=lambda h: (-h.similarity, h.sha256, h.address))
        return [h for h in ranked if h.similarity >= min_similarity][:limit]

    def _rows(self, head: str, ids: Sequence[int], params: tuple[object, ...] = ()) -> list[Row]:
        """`head` (a SELECT ending `... IN`) over `ids`, 500 at a time."""
        out: list[Row] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            out += self.db.read(f"{head} ({', '.join('?' for _ in chunk)})", (*params, *chunk))
        return out

    def _callees(self, ids: Sequence[int]) -> dict[int, Fingerprint]:
        """The stored functions `ids` (inlining contexts' callees) as fingerprints, by id."""
        rows = self._rows("SELECT id, exact, minhash, features FROM corpus_function WHERE id IN", ids)
        return {int(r[0]): decode_fingerprint(0, None, r[1], r[2], r[3]) for r in rows}

    def candidate_ids(self, cid: int, fp: Fingerprint, limit: int, view: Fingerprint | None = None) -> list[int]:
        """The ids of the functions of corpus `cid` sharing LSH bands with `fp` (their own bands or
        their inlined view's) or with `fp`'s inlined `view` (their own bands), most shared first,
        at most `_candidates(limit)`."""
        keys = band_keys(fp.minhash, cid) + band_keys(fp.minhash, cid, first_band=BANDS)
        if view is not None:
            keys = list(dict.fromkeys(keys + band_keys(view.minhash, cid)))
        if not keys:
            return []
        marks = ", ".join("?" for _ in keys)
        cand = self.db.read(
            f"SELECT function_id FROM corpus_band WHERE band IN ({marks}) "
            "GROUP BY function_id ORDER BY COUNT(*) DESC, function_id LIMIT ?",
            (*keys, _candidates(limit)),
        )
        return [int(r[0]) for r in cand]

    def search_string(self, name: str, text: str, limit: int = 10, mode: str = "substring") -> list[BinaryHit]:
        """The corpus's binaries holding a string equal to `text` (`exact`) or containing it
        (`substring`), first indexed first, each with at most `MATCHES_PER_BINARY` matches."""
        return self._search_values(name, text, limit, mode, "corpus_string", "corpus_binary_string", "string_id")

    def search_import(self, name: str, symbol: str, limit: int = 10, mode: str = "exact") -> list[BinaryHit]:
        """The corpus's binaries importing `symbol` (`exact`) or a name containing it (`substring`)."""
        return self._search_values(name, symbol, limit, mode, "corpus_import_name", "corpus_binary_import", "import_id")

    def _search_values(
        self, name: str, text: str, limit: int, mode: str, values: str, links: str, column: str
    ) -> list[BinaryHit]:
        cid = self._id(name)
        if mode not in SEARCH_MODES:
            raise invalid(f"mode is one of {', '.join(SEARCH_MODES)}", "/params/mode")
        if not text:
            raise invalid("the text searched for is empty", "/params/text")
        limit = max(1, min(int(limit), MAX_LIMIT))
        text = clean(text)
        if mode == "exact":
            cond = "v.value = ?"
        else:
            cond = "strpos(v.value, ?) > 0" if self.kind == "postgresql" else "instr(v.value, ?) > 0"
        join = f"FROM {links} l JOIN {values} v ON v.id = l.{column} JOIN corpus_binary b ON b.id = l.binary_id"
        binaries = self.db.read(
            f"SELECT b.id, b.sha256, b.path {join} WHERE b.corpus_id = ? AND {cond} "
            "GROUP BY b.id, b.sha256, b.path ORDER BY b.id LIMIT ?",
            (cid, text, limit),
        )
        if not binaries:
            return []
        marks = ", ".join("?" for _ in binaries)
        rows = self.db.read(
            f"SELECT binary_id, value FROM (SELECT l.binary_id, v.value, ROW_NUMBER() OVER "
            f"(PARTITION BY l.binary_id ORDER BY v.value) AS n FROM {links} l JOIN {values} v ON v.id = l.{column} "
            f"WHERE l.binary_id IN ({marks}) AND {cond}) m WHERE n <= ?",
            (*[b[0] for b in binaries], text, MATCHES_PER_BINARY),
        )
        matches: dict[int, list[str]] = {}
        for bid, value in rows:
            matches.setdefault(int(bid), []).append(str(value))
        return [BinaryHit(str(sha), str(path), tuple(matches.get(int(bid), ()))) for bid, sha, path in binaries]

    def close(self) -> None:
        """Close the store's connection."""
        self.db.close()

    def __enter__(self) -> CorpusStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _delete_binary(tx: Tx, bid: int) -> None:
    """Delete one binary's rows: its functions' bands, its functions, its string and import links."""
    tx.execute(
        "DELETE FROM corpus_band WHERE function_id IN (SELECT id FROM corpus_function WHERE binary_id = ?)", (bid,)
    )
    tx.execute("DELETE FROM corpus_function WHERE binary_id = ?", (bid,))
    tx.execute("DELETE FROM corpus_binary_string WHERE binary_id = ?", (bid,))
    tx.execute("DELETE FROM corpus_binary_import WHERE binary_id = ?", (bid,))
    tx.execute("DELETE FROM corpus_binary WHERE id = ?", (bid,))


def _name(name: str | None) -> str | None:
    return None if name is None else clean(name)


def _candidates(limit: int) -> int:
    """How many band candidates a search scores for `limit` results."""
    return max(200, 20 * limit)


def _hit(r: Row, score: float) -> FunctionHit:
    return FunctionHit(str(r[6]), str(r[7]), _u64(int(r[1])), r[2], score)


def total_bytes(store: CorpusStore) -> int:
    """The store's size on disk in bytes (the SQLite file with its WAL, or the PostgreSQL database)."""
    if store.kind == "postgresql":
        return int(store.db.read("SELECT pg_database_size(current_database())")[0][0])
    path = Path(store.db.where)
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
