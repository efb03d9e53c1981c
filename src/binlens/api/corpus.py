"""corpus.*: the corpus store (docs/CORPUS.md): its corpora, and searching them by function
similarity, string and import.

The store is the server's `--corpus-store` (a PostgreSQL URL, shared by every server and indexer
that names it), else SQLite at `$BINLENS_HOME/corpus.sqlite`; it is opened on first use and opened
again after its server was unreachable. `corpus index` (the CLI, on Ray) fills it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, model_validator

from binlens.analysis.fingerprint.model import Fingerprint
from binlens.api.analysis import NeedsAnalysis, select_function
from binlens.api.evidence import EvidenceId, LedgerName, load_evidence
from binlens.api.fingerprints import fingerprints
from binlens.api.models import HexAddress, Params, Result, Selector
from binlens.api.registry import DESTRUCTIVE, READ_ONLY, CallContext, method
from binlens.corpus.fingerprints import tail_calls
from binlens.corpus.records import BinaryRecord, CorpusInfo
from binlens.corpus.store import MAX_LIMIT, CorpusStore, open_store
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of
from binlens.store.analysis import AnalysisView
from binlens.workspace import Program, Workspace

STORE_KEY = "corpus.store"  # Workspace.extensions key of the open CorpusStore
_lock = threading.Lock()
_T = TypeVar("_T")

CorpusName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="The corpus's name (letters, digits, '_', '.', '-'), as `binlens corpus index --corpus` gave it.",
    ),
]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"Most results (1..{MAX_LIMIT}).")]


def corpus_store(ws: Workspace) -> CorpusStore:
    """The server's corpus store, opened (and its schema migrated) on first use."""
    store = ws.extensions.get(STORE_KEY)
    if store is None:
        with _lock:
            store = ws.extensions.get(STORE_KEY)
            if store is None:
                store = ws.extensions[STORE_KEY] = open_store(
                    ws.config.corpus_store, ws.config.home, target="/params/corpus"
                )
    assert isinstance(store, CorpusStore)
    return store


def _using(ws: Workspace, work: Callable[[CorpusStore], _T]) -> _T:
    """`work` on the store; a store found unreachable is dropped, so the next call connects again."""
    store = corpus_store(ws)
    try:
        return work(store)
    except BinlensError as err:
        if err.code == "unavailable":
            with _lock:
                if ws.extensions.get(STORE_KEY) is store:
                    del ws.extensions[STORE_KEY]
            with contextlib.suppress(Exception):  # (a connection already gone may refuse to close)
                store.close()
            if err.target is None:
                raise BinlensError(err.code, err.message, target="/params/corpus", details=err.details) from None
        raise


def binary_record(prog: Program, view: AnalysisView, seconds: float = 0.0) -> BinaryRecord:
    """The corpus record of an open, analysed program: its identity, every function's fingerprint
    (computed and kept in its database on first use), its distinct strings and imported names."""
    ident = prog.image.identity
    return BinaryRecord(
        sha256=ident.sha256,
        path=str(prog.path),
        size=ident.size,
        format=ident.format.lower(),
        arch=ident.arch,
        bits=ident.bits,
        functions=fingerprints(prog, view),
        strings=sorted({text for _a, _n, _e, text, _s, _r in view.strings()}),
        imports=sorted({i.name for i in prog.image.imports}),
        seconds=seconds,
        tail_calls=tail_calls(prog.db, view),
    )


class CorpusSummary(Result):
    name: str
    binaries: int
    functions: int
    strings: int = Field(description="Distinct strings of its binaries.")
    imports: int = Field(description="Distinct imported names of its binaries.")
    failures: int = Field(description="Files the indexer could not index (see corpus.get).")
    created_at: str
    updated_at: str = Field(description="When a binary or a failure was last added.")


def _summary(info: CorpusInfo) -> CorpusSummary:
    return CorpusSummary(
        name=info.name,
        binaries=info.binaries,
        functions=info.functions,
        strings=info.strings,
        imports=info.imports,
        failures=info.failures,
        created_at=info.created_at,
        updated_at=info.updated_at,
    )


class StoreInfo(Result):
    kind: Literal["sqlite", "postgresql"]
    location: str = Field(description="The SQLite file, or the PostgreSQL URL without its password.")
    schema_version: int


def _store_info(store: CorpusStore) -> StoreInfo:
    kind: Literal["sqlite", "postgresql"] = "postgresql" if store.kind == "postgresql" else "sqlite"
    return StoreInfo(kind=kind, location=store.db.where, schema_version=store.schema_version)


# --- corpus.list / get / remove ---------------------------------------------------------------------
class ListParams(Params):
    pass


class CorpusList(Result):
    store: StoreInfo
    items: list[CorpusSummary]


@method("corpus.list", effect=READ_ONLY)
def corpus_list(ws: Workspace, p: ListParams) -> CorpusList:
    """The corpora of the corpus store, by name, with their counts."""

    def work(store: CorpusStore) -> CorpusList:
        return CorpusList(store=_store_info(store), items=[_summary(store.info(n)) for n in store.corpora()])

    return _using(ws, work)


class GetParams(Params):
    corpus: CorpusName
    failures_limit: int = Field(20, ge=0, le=1000, description="Most failed files listed (by path).")


class FailureItem(Result):
    path: str
    sha256: str | None
    code: str
    message: str


class CorpusDetail(CorpusSummary):
    store: StoreInfo
    state: Literal["empty", "indexed", "indexed_with_failures"] = Field(
        description="empty: nothing indexed; indexed_with_failures: some files could not be indexed."
    )
    failed_files: list[FailureItem]
    stale: int = Field(
        description="Binaries stored in an older fingerprint format: searches pass over them until "
        "`binlens corpus index` analyses them again."
    )


@method("corpus.get", effect=READ_ONLY)
def corpus_get(ws: Workspace, p: GetParams) -> CorpusDetail:
    """One corpus: its counts, build state and the files it could not index."""

    def work(store: CorpusStore) -> CorpusDetail:
        info = store.info(p.corpus)
        failed = store.failures(p.corpus, p.failures_limit) if p.failures_limit else []
        state: Literal["empty", "indexed", "indexed_with_failures"] = (
            "indexed_with_failures" if info.failures else "indexed" if info.binaries else "empty"
        )
        return CorpusDetail(
            **_summary(info).model_dump(),
            store=_store_info(store),
            state=state,
            failed_files=[FailureItem(path=f.path, sha256=f.sha256, code=f.code, message=f.message) for f in failed],
            stale=store.stale(p.corpus),
        )

    return _using(ws, work)


class RemoveParams(Params):
    corpus: CorpusName


class Removed(Result):
    removed: CorpusSummary = Field(description="The corpus's counts before it was removed.")


@method("corpus.remove", effect=DESTRUCTIVE)
def corpus_remove(ws: Workspace, p: RemoveParams) -> Removed:
    """Delete a corpus from the store with everything indexed in it (the binaries' program databases stay)."""
    return Removed(removed=_summary(_using(ws, lambda store: store.remove(p.corpus))))


# --- corpus.search_function ------------------------------------------------------------------------
class SearchFunctionParams(NeedsAnalysis):
    corpus: CorpusName
    selector: Selector | None = Field(
        None, description="A function of the served program: its fingerprint is searched for."
    )
    evidence_id: EvidenceId | None = Field(
        None,
        description="Retained evidence of a function.* call (function.get, ...) whose result names a function "
        "by `address`; its program must be open here.",
    )
    ledger: LedgerName = "default"
    limit: Limit = 10
    min_similarity: float = Field(0.0, ge=0.0, le=1.0, description="Only functions at least this similar.")

    @model_validator(mode="after")
    def _one_query(self) -> SearchFunctionParams:
        if (self.selector is None) == (self.evidence_id is None):
            raise ValueError("give exactly one of 'selector' or 'evidence_id'")
        return self


class QueryFunction(Result):
    program: str
    address: HexAddress
    name: str | None


class FunctionMatch(Result):
    sha256: str
    file: str = Field(description="Where the indexer found the binary.")
    address: HexAddress
    function: str = Field(description="Its name in the binary, else sub_<address>.")
    similarity: float = Field(description="0..1; 1.0: the same exact fingerprint (the same code).")


class FunctionMatches(Result):
    query: QueryFunction
    items: list[FunctionMatch]


def _evidence_function(ws: Workspace, p: SearchFunctionParams) -> tuple[Program, int]:
    """The open program and the function address a retained function.* record names."""
    assert p.evidence_id is not None
    record = load_evidence(ws, p.evidence_id, p.ledger).record
    target = "/params/evidence_id"
    method_name = str(record.get("method", ""))
    result = record.get("result")
    address = result.get("address") if isinstance(result, dict) else None
    if not method_name.startswith("function.") or not isinstance(address, str):
        raise BinlensError(
            "invalid_argument",
            f"evidence {p.evidence_id} records {method_name or 'a call'}, not a function (use the evidence of "
            "function.get or another function.* call whose result has an address)",
            target=target,
        )
    sha = (record.get("program") or {}).get("sha256")
    for prog in list(ws.programs.values()):
        if prog.image.identity.sha256 == sha:
            return prog, int(address, 16)
    raise BinlensError(
        "not_found",
        f"the evidence is about program sha256 {sha}, which is not open here: open it with program.open first",
        target=target,
        details={"sha256": sha},
    )


def _query(
    ws: Workspace, p: SearchFunctionParams, ctx: CallContext
) -> tuple[Program, Fingerprint, list[Fingerprint], list[int]]:
    """The program, the fingerprint of the function searched for, all its program's and the
    functions it tail-jumps to (the query's inlining context)."""
    if p.evidence_id is not None:
        prog, va = _evidence_function(ws, p)
        view = analysis_of(prog).require(ctx, wait=p.wait, timeout_s=p.timeout_ms / 1000)
        row = view.function_at(va)
        if row is None:
            raise BinlensError("not_found", f"no function at {hex(va)} in this analysis", target="/params/evidence_id")
    else:
        assert p.selector is not None
        prog = ws.program(p.program)
        view = analysis_of(prog).require(ctx, wait=p.wait, timeout_s=p.timeout_ms / 1000)
        row = select_function(prog, view, p.selector)
    fps = fingerprints(prog, view)
    for fp in fps:
        if fp.address == row.address:
            tails = [d for _s, d, _k, _f in view.xrefs_from_function(fp.address, ("tail_call",)) if d != fp.address]
            return prog, fp, fps, tails
    raise BinlensError("not_found", f"the function at {hex(row.address)} has no fingerprint", target="/params/selector")


@method("corpus.search_function", effect=READ_ONLY)
def corpus_search_function(ws: Workspace, p: SearchFunctionParams, ctx: CallContext) -> FunctionMatches:
    """The corpus's functions most like one function of a served program, most similar first.

    Exact fingerprints (the same code) score 1.0; the others are candidates sharing a band of the
    function's MinHash (or of its view with its callees inlined), scored for builds at other
    optimisation levels, each as itself or with its callees inlined (docs/CORPUS.md)."""
    prog, fp, fps, tails = _query(ws, p, ctx)
    hits = _using(ws, lambda store: store.search_function(p.corpus, fp, p.limit, p.min_similarity, fps, tails))
    return FunctionMatches(
        query=QueryFunction(program=prog.handle, address=hex(fp.address), name=fp.name),
        items=[
            FunctionMatch(
                sha256=h.sha256,
                file=h.file,
                address=hex(h.address),
                function=h.name or f"sub_{h.address:x}",
                similarity=h.similarity,
            )
            for h in hits
        ],
    )


# --- corpus.search_string / search_import ---------------------------------------------------------
Mode = Literal["substring", "exact"]


class SearchStringParams(Params):
    corpus: CorpusName
    text: Annotated[str, Field(min_length=1, max_length=1000, description="The string searched for.")]
    mode: Mode = Field("substring", description="substring: strings containing `text`; exact: equal to it.")
    limit: Limit = 20


class SearchImportParams(Params):
    corpus: CorpusName
    name: Annotated[str, Field(min_length=1, max_length=1000, description="The imported symbol's name.")]
    mode: Mode = Field("exact", description="exact: imports named `name`; substring: names containing it.")
    limit: Limit = 20


class BinaryMatch(Result):
    sha256: str
    file: str
    matches: list[str] = Field(description="The matching strings or imports of this binary (at most 20).")


class BinaryMatches(Result):
    items: list[BinaryMatch] = Field(description="Binaries in the order they were indexed.")


def _binaries(hits: Any) -> BinaryMatches:
    return BinaryMatches(items=[BinaryMatch(sha256=h.sha256, file=h.file, matches=list(h.matches)) for h in hits])


@method("corpus.search_string", effect=READ_ONLY)
def corpus_search_string(ws: Workspace, p: SearchStringParams) -> BinaryMatches:
    """The corpus's binaries holding a string that contains (or equals) `text`."""
    return _binaries(_using(ws, lambda store: store.search_string(p.corpus, p.text, p.limit, p.mode)))


@method("corpus.search_import", effect=READ_ONLY)
def corpus_search_import(ws: Workspace, p: SearchImportParams) -> BinaryMatches:
    """The corpus's binaries importing a symbol by `name` (or a name containing it)."""
    return _binaries(_using(ws, lambda store: store.search_import(p.corpus, p.name, p.limit, p.mode)))
