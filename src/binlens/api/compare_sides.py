"""The sides of a comparison: a live program (a handle or a file opened under the roots) or retained
evidence of `compare.fingerprints` (an `evidence_id` in a ledger, or the record inline), and the
`compare.fingerprints` method whose result such evidence retains.

A side given as evidence needs nothing but the record: its fingerprints (and, for one function, its
normalised blocks) are what `compare.programs` and `compare.functions` read of a live side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, ValidationError, model_validator

from binlens.analysis.fingerprint.insns import ModelFeatures, ModelInstruction
from binlens.analysis.fingerprint.model import Fingerprint
from binlens.analysis.fingerprint.program import address_test
from binlens.api.common import ProgramIdentity
from binlens.api.evidence import EvidenceId, LedgerName, canonical, evidence_id, load_evidence
from binlens.api.fingerprints import fingerprints
from binlens.api.instruction import decoder
from binlens.api.models import Params, ProgramRef, Result, Selector
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of, function_name
from binlens.store.analysis import AnalysisView, FunctionRow
from binlens.store.secret import home_key
from binlens.workspace import CURSOR_KEY_FILE, Program, Workspace


class PathRef(Params):
    """A program named by its file, opened under the roots (or the already open one)."""

    path: Annotated[str, Field(min_length=1, max_length=4096, description="File to open (under the roots).")]
    slice: str | None = Field(None, description="Architecture slice of a universal Mach-O.")


class EvidenceRef(Params):
    """Retained evidence of `compare.fingerprints` in place of a live side: by id in a ledger, or the
    record inline (with its id, the record is checked against it)."""

    evidence_id: EvidenceId | None = None
    ledger: LedgerName = "default"
    record: dict[str, Any] | None = Field(
        None, description="The record as evidence.get returns it ({method, params, program, engine, ...})."
    )

    @model_validator(mode="after")
    def _one(self) -> EvidenceRef:
        if self.evidence_id is None and self.record is None:
            raise ValueError("give evidence_id or record")
        return self


ProgramSpec = ProgramRef | PathRef


class NeedsTwo(Params):
    """Waiting for the two programs' analyses."""

    wait: bool = Field(True, description="Wait for the analyses if they are not done yet; false: 'unavailable'.")
    timeout_ms: int = Field(600000, ge=100, le=3600000, description="How long to wait for each analysis.")


def open_side(ws: Workspace, spec: ProgramSpec | None, target: str) -> Program:
    """The program a side names: a handle (None: the only open one), or a file opened under the roots."""
    if spec is None or isinstance(spec, str):
        return ws.program(spec, target)
    try:
        return ws.open(spec.path, spec.slice)
    except BinlensError as err:
        where = err.target or ""
        if where.startswith("/params/"):
            where = target + "/" + where[len("/params/") :]
        raise BinlensError(err.code, err.message, target=where or target, details=err.details) from None


def side_view(prog: Program, p: NeedsTwo, ctx: CallContext | None) -> AnalysisView:
    """The program's analysis, waited for as the params say."""
    return analysis_of(prog).require(ctx, wait=p.wait, timeout_s=p.timeout_ms / 1000)


# --- compare.fingerprints ------------------------------------------------------------------------
class FingerprintItem(Result):
    """One function's fingerprint as JSON (numbers that can pass 2**53 as hex text)."""

    address: str
    name: str = Field(description="The function's name as function.list shows it.")
    symbol: str | None = Field(description="The name matching uses: its symbol or export, `<import>@plt`.")
    size: int
    exact: str = Field(description="The exact fingerprint (hex).")
    blocks: int
    edges: int
    loops: int
    instructions: int
    classes: list[int]
    constants: list[str] = Field(description="Immediates that are not addresses (hex).")
    strings: list[str]
    imports: list[str]
    callees: list[str]
    minhash: list[int]


class BlockTokens(Result):
    """One block of a function: its instructions normalised (addresses masked, hex) and as shown."""

    start: str
    tokens: list[str]
    lines: list[str]


class FingerprintsParams(NeedsTwo):
    program: ProgramRef | None = None
    selector: Selector | None = Field(
        None, description="One function (its fingerprint and normalised blocks); omitted: every function."
    )


class FingerprintsResult(Result):
    functions: list[FingerprintItem] = Field(description="By address; one with a selector.")
    blocks: list[BlockTokens] | None = Field(description="The selected function's blocks; null without a selector.")


def fingerprint_item(prog: Program, row: FunctionRow, fp: Fingerprint) -> FingerprintItem:
    """A fingerprint as `compare.fingerprints` lists it."""
    return FingerprintItem(
        address=hex(fp.address),
        name=function_name(prog, row),
        symbol=fp.name,
        size=fp.size,
        exact=fp.exact.hex(),
        blocks=fp.blocks,
        edges=fp.edges,
        loops=fp.loops,
        instructions=fp.instructions,
        classes=list(fp.classes),
        constants=[hex(c) for c in fp.constants],
        strings=list(fp.strings),
        imports=list(fp.imports),
        callees=[hex(c) for c in fp.callees],
        minhash=list(fp.minhash),
    )


def item_fingerprint(item: FingerprintItem) -> Fingerprint:
    """The fingerprint a `compare.fingerprints` item stands for."""
    return Fingerprint(
        address=int(item.address, 16),
        size=item.size,
        name=item.symbol,
        exact=bytes.fromhex(item.exact),
        blocks=item.blocks,
        edges=item.edges,
        loops=item.loops,
        instructions=item.instructions,
        classes=tuple(item.classes),
        constants=tuple(int(c, 16) for c in item.constants),
        strings=tuple(item.strings),
        imports=tuple(item.imports),
        callees=tuple(int(c, 16) for c in item.callees),
        minhash=tuple(item.minhash),
    )


def block_tokens(prog: Program, view: AnalysisView, fn: int) -> list[BlockTokens]:
    """Each block of a function: normalised instruction tokens (masked bytes, hex) and shown lines."""
    dec = decoder(prog)
    ident = prog.image.identity
    out = []
    for start, end, _n, _t in view.blocks(fn):
        insns: list[ModelInstruction] = list(dec.instructions(start, end))

        def decoded(_s: int, _e: int, insns: list[ModelInstruction] = insns) -> list[ModelInstruction]:
            return insns

        feats = ModelFeatures(decoded, address_test(ident.image_base, prog.image.is_mapped))
        tokens = [f[0].hex() for f in feats(start, end)]
        shown = [f"{i.address:#x}: {i.mnemonic} {i.operands}".rstrip() for i in insns][: len(tokens)]
        out.append(BlockTokens(start=hex(start), tokens=tokens, lines=shown))
    return out


def select_row(prog: Program, view: AnalysisView, sel: Selector, target: str) -> FunctionRow:
    """The function a selector names (at or around an address, or by name)."""
    what = "name" if sel.name is not None else "address"
    va = prog.resolve(sel.name if sel.name is not None else sel.address or "", f"{target}/selector/{what}")
    f = view.function_at(va)
    if f is None:
        raise BinlensError("not_found", f"no function at or around {hex(va)}", target=f"{target}/selector/{what}")
    return f


@method("compare.fingerprints", effect=READ_ONLY, long_running=True)
def compare_fingerprints(ws: Workspace, p: FingerprintsParams, ctx: CallContext) -> FingerprintsResult:
    """The function fingerprints compare.* works from; retained with evidence.record, a side of a comparison.

    Without a selector: every function (unpaged, so that the record is whole; evidence.record keeps
    a result past the response budget). With one: that function and its normalised blocks.
    """
    prog = ws.program(p.program)
    view = side_view(prog, p, ctx)
    fps = fingerprints(prog, view)
    if p.selector is None:
        items = [fingerprint_item(prog, view.by_address[f.address], f) for f in fps]
        return FingerprintsResult(functions=items, blocks=None)
    row = select_row(prog, view, p.selector, "/params")
    fp = next(f for f in fps if f.address == row.address)
    return FingerprintsResult(functions=[fingerprint_item(prog, row, fp)], blocks=block_tokens(prog, view, row.address))


# --- a side ----------------------------------------------------------------------------------------
class EvidenceIdentity(Result):
    """A side given as retained evidence: the evidence and the program identity it records."""

    evidence_id: str
    program: dict[str, Any] = Field(description="The recorded program identity (sha256, size, format, arch, ...).")


@dataclass
class Side:
    """One side of a comparison: a live program with its analysis, or retained fingerprints."""

    key: str  # what the side's content is (a fingerprint run, an evidence id): caches and cursors
    sha256: str
    prog: Program | None = None
    view: AnalysisView | None = None
    record: FingerprintsResult | None = None
    evidence: EvidenceIdentity | None = None

    def fingerprints(self) -> list[Fingerprint]:
        """The side's fingerprints by address."""
        if self.record is not None:
            return [item_fingerprint(i) for i in self.record.functions]
        assert self.prog is not None and self.view is not None
        return fingerprints(self.prog, self.view)

    def identity(self) -> ProgramIdentity | EvidenceIdentity:
        """Who the side is, as results carry it."""
        if self.evidence is not None:
            return self.evidence
        assert self.prog is not None
        return ProgramIdentity(**self.prog.identity)


def live_side(prog: Program, view: AnalysisView) -> Side:
    """A live program as a side."""
    fingerprints(prog, view)
    return Side(key=repr(prog.extensions["fingerprints"][0]), sha256=prog.image.identity.sha256, prog=prog, view=view)


def evidence_side(ws: Workspace, ref: EvidenceRef, target: str, *, one: bool) -> Side:
    """Retained `compare.fingerprints` evidence as a side: of one function (`one`) or of every one."""
    if ref.record is not None:
        record = ref.record
        got = evidence_id(canonical(record, f"{target}/record"))
        if ref.evidence_id is not None and got != ref.evidence_id:
            raise BinlensError(
                "invalid_argument",
                f"the record hashes to {got}, not {ref.evidence_id}",
                target=f"{target}/record",
                details={"reason": "digest_mismatch", "evidence_id": ref.evidence_id, "computed": got},
            )
        eid = got
    else:
        assert ref.evidence_id is not None
        record = load_evidence(ws, ref.evidence_id, ref.ledger, f"{target}/evidence_id").record
        eid = ref.evidence_id
    where = f"{target}/record" if ref.record is not None else f"{target}/evidence_id"
    if record.get("method") != "compare.fingerprints":
        raise BinlensError(
            "invalid_argument",
            f"a side given as evidence is a record of compare.fingerprints, not {record.get('method')!r}",
            target=where,
        )
    try:
        result = FingerprintsResult.model_validate(record.get("result"))
    except ValidationError as err:
        msg = f"the record's result is not that of compare.fingerprints: {err.error_count()} errors"
        raise BinlensError("invalid_argument", msg, target=where) from None
    if one and (result.blocks is None or len(result.functions) != 1):
        raise BinlensError(
            "invalid_argument",
            "the evidence is of every function; compare.functions needs one (a selector)",
            target=where,
        )
    if not one and result.blocks is not None:
        raise BinlensError(
            "invalid_argument", "the evidence is of one function; compare.programs needs every one", target=where
        )
    program = record.get("program") if isinstance(record.get("program"), dict) else {}
    assert isinstance(program, dict)
    sha = str(program.get("sha256") or eid)
    return Side(key=eid, sha256=sha, record=result, evidence=EvidenceIdentity(evidence_id=eid, program=program))


def cursor_key(ws: Workspace) -> bytes:
    """The home's key that signs page cursors (that of every program opened under it)."""
    return home_key(ws.config.home, CURSOR_KEY_FILE)
