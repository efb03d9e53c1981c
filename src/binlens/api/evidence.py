"""evidence.*: retain read-only results as records with content-derived ids, in named ledgers,
and move them between machines as bundles.

A record is `{method, params, program, engine, providers, result}`; its id is `ev_` + the sha256
of its RFC 8785 (JSON Canonicalization Scheme) form, so the same question on the same bytes with
the same engine gives the same id on any machine. `created_at` is kept beside the record, outside
the id. A bundle is one canonical JSON document `{format, items: [{created_at, evidence_id,
record}], ledger}`; importing one checks every id again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import rfc8785
from pydantic import BaseModel, Field

from binlens import __version__
from binlens.analysis import ENGINE_VERSION
from binlens.api.models import Params, Result
from binlens.api.registry import (
    DESTRUCTIVE,
    MUTATION,
    READ_ONLY,
    REGISTRY,
    CallContext,
    invoke,
    lookup,
    method,
    response_size,
    response_too_large,
)
from binlens.errors import BinlensError
from binlens.store.evidence import EvidenceRow, EvidenceStore
from binlens.workspace import Workspace

BUNDLE_FORMAT = "binlens.evidence-bundle/1"
EVIDENCE_MAX_BYTES = 64 << 20  # the largest result evidence.record retains (past the response budget too)
STORE_KEY = "evidence.store"  # Workspace.extensions key of the home's EvidenceStore
_store_lock = threading.Lock()
_ID_RE = re.compile(r"^ev_[0-9a-f]{64}$")

LedgerName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="The ledger's name (letters, digits, '_', '.', '-'); ledgers persist under $BINLENS_HOME.",
    ),
]
EvidenceId = Annotated[
    str, Field(min_length=67, max_length=67, pattern=r"^ev_[0-9a-f]{64}$", description="'ev_' + 64 hex digits.")
]


def store_of(ws: Workspace) -> EvidenceStore:
    """The evidence ledgers of the workspace's home, opened on first use."""
    store = ws.extensions.get(STORE_KEY)
    if store is None:
        with _store_lock:
            store = ws.extensions.get(STORE_KEY)
            if store is None:
                ws.config.home.mkdir(parents=True, exist_ok=True)
                store = ws.extensions[STORE_KEY] = EvidenceStore(ws.config.home)
    assert isinstance(store, EvidenceStore)
    return store


def canonical(value: Any, target: str = "/params") -> bytes:
    """`value`'s RFC 8785 canonical JSON; `unsupported` for what I-JSON cannot hold exactly."""
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as err:
        raise BinlensError(
            "unsupported", f"the value cannot be canonicalised (RFC 8785): {err}", target=target
        ) from None


def evidence_id(record_bytes: bytes) -> str:
    """The id of a record from its canonical JSON: 'ev_' + sha256."""
    return "ev_" + hashlib.sha256(record_bytes).hexdigest()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- evidence.record ----------------------------------------------------------------------------
class RecordParams(Params):
    method: Annotated[str, Field(min_length=3, max_length=128, description="A read-only method, e.g. 'function.list'.")]
    params: dict[str, Any] = Field(default_factory=dict, description="That method's params.")
    ledger: LedgerName = "default"


class EvidenceSummary(Result):
    """A record without its result: what was asked, of what, by which engine, and when."""

    evidence_id: str
    ledger: str
    created_at: str
    method: str
    params: dict[str, Any]
    program: dict[str, Any] | None = Field(
        description="The program's identity (sha256, size, format, arch, ...; no file name) or null."
    )
    engine: dict[str, str]
    providers: dict[str, str | None]


class Recorded(Result):
    result: Any = Field(description="The method's result, as a call of it returns it.")
    evidence_id: str
    added: bool = Field(description="False when the ledger already held this record (its first created_at stays).")
    evidence: EvidenceSummary


def _program_identity(ws: Workspace, spec_params: type[BaseModel], params: dict[str, Any]) -> dict[str, Any] | None:
    """The identity of the program the call concerns (without the file name: ids follow the bytes)."""
    if "program" not in spec_params.model_fields:
        return None
    ref = params.get("program")
    prog = ws.program(ref if isinstance(ref, str) else None, "/params/params/program")
    ident = dict(prog.identity)
    ident.pop("file_name", None)
    return ident


def _provider_versions(spec_requires: tuple[Any, ...]) -> dict[str, str | None]:
    """The versions of the providers the method requires (those available), by id."""
    wanted = [r for r in spec_requires if r.kind in ("provider", "provider-kind")]
    if not wanted:
        return {}
    from binlens.providers import registry as providers  # (only methods that need a provider load them)

    out: dict[str, str | None] = {}
    for provider in providers.providers().values():
        if any(r.name == (provider.id if r.kind == "provider" else provider.kind) for r in wanted):
            got = provider.availability()
            if got.available:
                out[provider.id] = got.version
    return out


def _retarget(err: BinlensError) -> BinlensError:
    """An error of the recorded call, its target moved under `/params/params` (or `/params/method`)."""
    t = err.target
    if t is None:
        return err
    if t == "/method":
        t = "/params/method"
    elif t == "/params" or t.startswith("/params/"):
        t = "/params/params" + t[len("/params") :]
    return BinlensError(err.code, err.message, target=t, details=err.details)


def portable(result: Any) -> Any:
    """`result` as a record keeps it: a page's `next_cursor` is signed with the home's key, so the
    record keeps `true` in its place (there is a next page) and the id does not depend on the home."""
    if isinstance(result, dict) and isinstance(result.get("next_cursor"), str):
        return {**result, "next_cursor": True}
    return result


def build_record(ws: Workspace, name: str, params: dict[str, Any], result: Any) -> dict[str, Any]:
    """The record of a call of `name` with `params` that returned `result` (JSON-ready)."""
    spec = REGISTRY[name]
    parsed = spec.params_model.model_validate(params)
    normal = parsed.model_dump(mode="json", exclude={"program"})  # the identity names the program
    return {
        "method": name,
        "params": normal,
        "program": _program_identity(ws, spec.params_model, params),
        "engine": {"binlens": __version__, "analysis": ENGINE_VERSION},
        "providers": _provider_versions(spec.requires),
        "result": portable(result),
    }


def _summary(row: EvidenceRow, record: dict[str, Any]) -> EvidenceSummary:
    return EvidenceSummary(
        evidence_id=row.id,
        ledger=row.ledger,
        created_at=row.created_at,
        method=record["method"],
        params=record["params"],
        program=record["program"],
        engine=record["engine"],
        providers=record["providers"],
    )


@method("evidence.record", effect=MUTATION)
def evidence_record(ws: Workspace, p: RecordParams, ctx: CallContext) -> Recorded:
    """Run a read-only method and retain its result in a ledger under its content-derived evidence_id."""
    try:
        spec = lookup(p.method)
    except BinlensError as err:
        raise _retarget(err) from None
    if spec.effect != READ_ONLY or spec.domain == "evidence":
        raise BinlensError(
            "invalid_argument",
            f"{p.method} is not a read-only method; evidence.record runs read-only methods only",
            target="/params/method",
            details={"effect": spec.effect},
        )
    budget = ctx.response_budget
    try:
        # a result over the response budget is still retained (up to EVIDENCE_MAX_BYTES): the
        # answer is then `response_too_large` naming the evidence, which evidence.export can write
        limit = max(budget or 0, EVIDENCE_MAX_BYTES)
        result = invoke(ws, p.method, p.params, ctx, max_response_bytes=limit)
    except BinlensError as err:
        raise _retarget(err) from None
    record = build_record(ws, p.method, p.params, result)
    data = canonical(record, "/params/method")
    row = EvidenceRow(
        seq=0,
        ledger=p.ledger,
        id=evidence_id(data),
        method=p.method,
        program_sha256=(record["program"] or {}).get("sha256"),
        created_at=_now(),
        record=data,
    )
    [(stored, added)] = store_of(ws).add([row])
    if budget is not None:
        size = response_size(result)
        if size > budget:
            raise response_too_large(size, budget, reference={"evidence_id": stored.id, "ledger": stored.ledger})
    return Recorded(result=result, evidence_id=stored.id, added=added, evidence=_summary(stored, record))


# --- evidence.get / list / delete -----------------------------------------------------------------
class GetParams(Params):
    evidence_id: EvidenceId
    ledger: LedgerName = "default"


class Evidence(Result):
    evidence_id: str
    ledger: str
    created_at: str
    record: dict[str, Any] = Field(
        description="{method, params, program, engine, providers, result}: its RFC 8785 form hashes to the id."
    )


def missing(evidence_id: str, ledger: str, target: str) -> BinlensError:
    """The error for an id the ledger does not hold (`details.reason: missing`)."""
    return BinlensError(
        "not_found",
        f"ledger {ledger!r} holds no evidence {evidence_id}",
        target=target,
        details={"reason": "missing", "evidence_id": evidence_id, "ledger": ledger},
    )


def load_evidence(
    ws: Workspace, evidence_id: str, ledger: str = "default", target: str = "/params/evidence_id"
) -> Evidence:
    """A retained record by id (what a method that takes `{evidence_id}` in place of a live call uses)."""
    row = store_of(ws).get(ledger, evidence_id)
    if row is None:
        raise missing(evidence_id, ledger, target)
    return Evidence(evidence_id=row.id, ledger=row.ledger, created_at=row.created_at, record=json.loads(row.record))


@method("evidence.get", effect=READ_ONLY)
def evidence_get(ws: Workspace, p: GetParams) -> Evidence:
    """One retained record with its result, by evidence_id."""
    return load_evidence(ws, p.evidence_id, p.ledger)


class ListParams(Params):
    ledger: LedgerName = "default"
    method: str | None = Field(None, max_length=128, description="Only records of this method.")
    sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="Only records about the program with these bytes."
    )
    limit: int = Field(100, ge=1, le=1000, description="Items per page (1..1000).")
    cursor: str | None = Field(None, max_length=32, description="next_cursor of the previous page.")


class EvidenceItem(Result):
    evidence_id: str
    method: str
    sha256: str | None
    created_at: str
    bytes: int = Field(description="Size of the record's canonical JSON.")


class EvidenceList(Result):
    ledger: str
    total: int = Field(description="Records in the ledger (all methods and programs).")
    items: list[EvidenceItem]
    next_cursor: str | None
    ledgers: dict[str, int] = Field(description="Every ledger of this home that holds records, with its count.")


@method("evidence.list", effect=READ_ONLY)
def evidence_list(ws: Workspace, p: ListParams) -> EvidenceList:
    """The records of a ledger, oldest first (without their results), and the home's ledgers."""
    after = 0
    if p.cursor is not None:
        if not p.cursor.isdigit():
            raise BinlensError("invalid_argument", "cursor is not one evidence.list returned", target="/params/cursor")
        after = int(p.cursor)
    store = store_of(ws)
    rows = store.page(p.ledger, after, p.limit + 1, p.method, p.sha256)
    more = len(rows) > p.limit
    rows = rows[: p.limit]
    return EvidenceList(
        ledger=p.ledger,
        total=store.count(p.ledger),
        items=[
            EvidenceItem(
                evidence_id=r.id, method=r.method, sha256=r.program_sha256, created_at=r.created_at, bytes=len(r.record)
            )
            for r in rows
        ],
        next_cursor=str(rows[-1].seq) if more else None,
        ledgers=dict(store.ledgers()),
    )


class DeleteParams(Params):
    evidence_ids: list[EvidenceId] = Field(min_length=1, max_length=1000)
    ledger: LedgerName = "default"


class Deleted(Result):
    deleted: list[str]
    missing: list[str] = Field(description="Ids the ledger did not hold.")


@method("evidence.delete", effect=DESTRUCTIVE)
def evidence_delete(ws: Workspace, p: DeleteParams) -> Deleted:
    """Delete records from a ledger (ids it does not hold are reported, not an error)."""
    gone = store_of(ws).delete(p.ledger, p.evidence_ids)
    return Deleted(deleted=gone, missing=[i for i in p.evidence_ids if i not in set(gone)])


# --- evidence.export / import --------------------------------------------------------------------
class ExportParams(Params):
    path: Annotated[
        str,
        Field(
            min_length=1,
            max_length=4096,
            description="Bundle file to write (under the roots, or the home's exports folder).",
        ),
    ]
    ledger: LedgerName = "default"
    overwrite: bool = Field(False, description="Replace an existing file.")


class Exported(Result):
    path: str
    ledger: str
    count: int
    bytes: int
    sha256: str = Field(description="sha256 of the bundle file.")


def _check_path(ws: Workspace, path: str, target: str = "/params/path") -> Path:
    """The real path a bundle may be written to or read from: under the roots; on a server confined
    to its started files, in the home's `exports` folder (a relative path is taken from there)."""
    if ws.config.roots or ws.config.files is None:
        return ws.check_root(Path(path), target)
    folder = ws.config.home / "exports"
    folder.mkdir(parents=True, exist_ok=True)
    base = folder.resolve()
    p = Path(path).expanduser()
    real = (p if p.is_absolute() else base / p).resolve()
    if base not in real.parents:
        raise BinlensError(
            "invalid_argument",
            f"{path} is outside {base}: a server started on files without --root keeps bundles there "
            "(give a file name)",
            target=target,
            details={"export_dir": str(base)},
        )
    return real


def digest_mismatch(code: str, message: str, where: str, details: dict[str, Any]) -> BinlensError:
    """The refusal of a record whose canonical form does not hash to its id (`where`: its JSON
    pointer in the bundle)."""
    return BinlensError(
        code, message, target="/params/path", details={"reason": "digest_mismatch", "pointer": where, **details}
    )


def _stream_bundle(store: EvidenceStore, ledger: str, fh: Any, ctx: CallContext) -> tuple[int, Any]:
    """Write `ledger` to `fh` as one canonical JSON bundle, checking each stored id; (count, sha256)."""
    digest = hashlib.sha256()

    def put(chunk: bytes) -> None:
        digest.update(chunk)
        fh.write(chunk)

    put(b'{"format":' + canonical(BUNDLE_FORMAT) + b',"items":[')
    count = 0
    for row in store.iterate(ledger):
        ctx.check_cancelled()
        if evidence_id(row.record) != row.id:
            raise digest_mismatch(
                "conflict",
                f"the ledger's record {row.id} does not hash to its id (the ledger database was changed)",
                f"/items/{count}",
                {"evidence_id": row.id, "computed": evidence_id(row.record)},
            )
        put(
            (b"," if count else b"")
            + b'{"created_at":'
            + canonical(row.created_at)
            + b',"evidence_id":'
            + canonical(row.id)
            + b',"record":'
            + row.record
            + b"}"
        )
        count += 1
    put(b'],"ledger":' + canonical(ledger) + b"}")
    return count, digest


@method("evidence.export", effect=MUTATION)
def evidence_export(ws: Workspace, p: ExportParams, ctx: CallContext) -> Exported:
    """Write a ledger as one canonical JSON bundle, streamed to a temporary file and then renamed into place."""
    target = _check_path(ws, p.path)
    if not target.parent.is_dir():
        raise BinlensError("not_found", f"folder {target.parent} does not exist", target="/params/path")
    if target.exists() and not p.overwrite:
        raise BinlensError("conflict", f"{target} exists (set overwrite to replace it)", target="/params/path")
    if target.exists() and not target.is_file():
        raise BinlensError("invalid_argument", f"{target} is not a regular file", target="/params/path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as err:
        raise BinlensError(
            "unavailable", f"cannot write in {target.parent}: {err.strerror}", target="/params/path"
        ) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            count, digest = _stream_bundle(store_of(ws), p.ledger, fh, ctx)
            size = fh.tell()
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise BinlensError("unavailable", f"cannot write {target}: {err.strerror}", target="/params/path") from None
        raise
    return Exported(path=str(target), ledger=p.ledger, count=count, bytes=size, sha256=digest.hexdigest())


class ImportParams(Params):
    path: Annotated[str, Field(min_length=1, max_length=4096, description="Bundle file written by evidence.export.")]
    ledger: LedgerName | None = Field(None, description="Ledger to add the records to (default: the bundle's).")


class Imported(Result):
    ledger: str
    count: int = Field(description="Records in the bundle.")
    added: int = Field(description="Records the ledger did not hold yet.")
    evidence_ids: list[str]


def _bad(message: str, where: str) -> BinlensError:
    return BinlensError(
        "invalid_argument",
        f"not an evidence bundle: {message}",
        target="/params/path",
        details={"reason": "invalid_bundle", "pointer": where},
    )


def _parse_bundle(raw: bytes) -> tuple[str, list[EvidenceRow]]:
    """The ledger name and records of a bundle, every id checked; refuses the whole bundle on any fault."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise _bad(f"invalid JSON ({err})", "") from None
    if not isinstance(doc, dict):
        raise _bad("the document is not an object", "")
    if doc.get("format") != BUNDLE_FORMAT:
        raise _bad(f"format is not {BUNDLE_FORMAT!r}", "/format")
    ledger = doc.get("ledger")
    if not isinstance(ledger, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", ledger):
        raise _bad("ledger is not a ledger name", "/ledger")
    items = doc.get("items")
    if not isinstance(items, list):
        raise _bad("items is not a list", "/items")
    rows = []
    for i, item in enumerate(items):
        where = f"/items/{i}"
        if not isinstance(item, dict) or set(item) != {"created_at", "evidence_id", "record"}:
            raise _bad("an item is not {created_at, evidence_id, record}", where)
        eid, created, record = item["evidence_id"], item["created_at"], item["record"]
        if not isinstance(eid, str) or not _ID_RE.match(eid):
            raise _bad("evidence_id is not 'ev_' + 64 hex digits", where + "/evidence_id")
        if not isinstance(created, str):
            raise _bad("created_at is not a string", where + "/created_at")
        if not isinstance(record, dict) or not isinstance(record.get("method"), str):
            raise _bad("record is not an object with a method", where + "/record")
        program = record.get("program")
        try:
            data = rfc8785.dumps(record)
        except rfc8785.CanonicalizationError as err:
            raise _bad(f"the record cannot be canonicalised ({err})", where + "/record") from None
        computed = evidence_id(data)
        if computed != eid:
            raise digest_mismatch(
                "invalid_argument",
                f"bundle item {i}: the record hashes to {computed}, not {eid}; the bundle was changed and is refused",
                where,
                {"evidence_id": eid, "computed": computed},
            )
        sha = program.get("sha256") if isinstance(program, dict) else None
        rows.append(EvidenceRow(0, ledger, eid, record["method"], sha if isinstance(sha, str) else None, created, data))
    return ledger, rows


@method("evidence.import", effect=MUTATION)
def evidence_import(ws: Workspace, p: ImportParams) -> Imported:
    """Add a bundle's records to a ledger after checking every id; one mismatch refuses the whole bundle."""
    source = _check_path(ws, p.path)
    try:
        size = source.stat().st_size
        if size > ws.limits.max_file_bytes:
            raise BinlensError(
                "invalid_argument",
                f"{source} is {size} bytes, over the {ws.limits.max_file_bytes}-byte input limit",
                target="/params/path",
            )
        raw = source.read_bytes()
    except FileNotFoundError:
        raise BinlensError("not_found", f"{source} does not exist", target="/params/path") from None
    except IsADirectoryError:
        raise BinlensError("invalid_argument", f"{source} is a folder", target="/params/path") from None
    except OSError as err:
        raise BinlensError("unavailable", f"cannot read {source}: {err.strerror}", target="/params/path") from None
    bundle_ledger, rows = _parse_bundle(raw)
    ledger = p.ledger or bundle_ledger
    rows = [EvidenceRow(0, ledger, r.id, r.method, r.program_sha256, r.created_at, r.record) for r in rows]
    stored = store_of(ws).add(rows) if rows else []
    return Imported(
        ledger=ledger, count=len(rows), added=sum(1 for _, new in stored if new), evidence_ids=[r.id for r in rows]
    )
