"""compare.*: match two programs' functions, diff two functions, port annotations between programs.

The matching (`analysis/fingerprint/matching.py`) works on the function fingerprints each program's
database keeps (`api/fingerprints.py`); see docs/COMPARE.md.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field

from binlens.analysis.fingerprint.features import similarity
from binlens.analysis.fingerprint.insns import ModelFeatures, ModelInstruction
from binlens.analysis.fingerprint.matching import Match, match_functions
from binlens.analysis.fingerprint.program import address_test
from binlens.api.common import ProgramIdentity
from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.edits import edit, name_conflict, store
from binlens.api.fingerprints import fingerprints
from binlens.api.instruction import decoder
from binlens.api.models import Page, Params, ProgramRef, Result, Selector
from binlens.api.registry import MUTATION, READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of, function_name
from binlens.store.analysis import AnalysisView, FunctionRow
from binlens.store.annotations import Change, comment_rows_in, last_data_type_position
from binlens.workspace import Program, Workspace


class PathRef(Params):
    """A program named by its file, opened under the roots (or the already open one)."""

    path: Annotated[str, Field(min_length=1, max_length=4096, description="File to open (under the roots).")]
    slice: str | None = Field(None, description="Architecture slice of a universal Mach-O.")


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


def matches(left: Program, lview: AnalysisView, right: Program, rview: AnalysisView) -> list[Match]:
    """The matched functions of two programs, by left address (kept per pair of analyses)."""
    lfp, rfp = fingerprints(left, lview), fingerprints(right, rview)
    keys = (left.extensions["fingerprints"][0], right.extensions["fingerprints"][0])
    key = ("compare", right.image.identity.sha256, *keys)
    cached = left.extensions.get("compare.matches")
    if cached is not None and cached[0] == key:
        return list(cached[1])
    found = match_functions(lfp, rfp)
    left.extensions["compare.matches"] = (key, found)
    return found


# --- compare.programs ----------------------------------------------------------------------------
class FunctionRef(Result):
    address: str
    name: str
    size: int


class MatchItem(Result):
    left: FunctionRef
    right: FunctionRef
    kind: Literal["identical", "changed"]
    similarity: float = Field(description="1.0 for identical functions (equal exact fingerprints), else 0..0.99.")
    step: str = Field(description="How the pair was found: name, exact, strings, imports, callgraph or fuzzy.")


class CompareCounts(Result):
    identical: int
    changed: int
    added: int
    removed: int


class CompareProgramsParams(NeedsTwo):
    left: ProgramSpec = Field(description="The older program: a handle, or {path} opened under the roots.")
    right: ProgramSpec = Field(description="The newer program: a handle, or {path} opened under the roots.")
    kinds: list[Literal["identical", "changed"]] = Field(
        ["identical", "changed"], description="Which matched pairs to list."
    )
    page: Page = Page()


class CompareProgramsResult(Result):
    left: ProgramIdentity
    right: ProgramIdentity
    counts: CompareCounts
    matched: list[MatchItem] = Field(description="Matched pairs by left address, this page's share.")
    added: list[FunctionRef] = Field(description="Functions of `right` with no match, this page's share.")
    removed: list[FunctionRef] = Field(description="Functions of `left` with no match, this page's share.")
    next_cursor: str | None = Field(None, description="The next page of all three lists; null at the end.")


def function_ref(prog: Program, f: FunctionRow) -> FunctionRef:
    return FunctionRef(address=hex(f.address), name=function_name(prog, f), size=f.size)


@method("compare.programs", effect=READ_ONLY, long_running=True)
def compare_programs(ws: Workspace, p: CompareProgramsParams, ctx: CallContext) -> CompareProgramsResult:
    """Match the functions of two programs (BinDiff-style): identical and changed pairs, added, removed."""
    left, right = open_side(ws, p.left, "/params/left"), open_side(ws, p.right, "/params/right")
    lview, rview = side_view(left, p, ctx), side_view(right, p, ctx)
    found = matches(left, lview, right, rview)
    lmatched = {m.left for m in found}
    rmatched = {m.right for m in found}
    added = [f for f in rview.functions if f.address not in rmatched]
    removed = [f for f in lview.functions if f.address not in lmatched]
    listed = [m for m in found if m.kind in p.kinds]
    qkey = query_key(p)
    pos = decode_cursor(p.page.cursor, left, qkey) or 0
    if not isinstance(pos, int) or pos < 0:
        pos = 0
    end = pos + p.page.limit
    more = end < max(len(listed), len(added), len(removed))
    identical = sum(1 for m in found if m.kind == "identical")
    return CompareProgramsResult(
        left=ProgramIdentity(**left.identity),
        right=ProgramIdentity(**right.identity),
        counts=CompareCounts(
            identical=identical, changed=len(found) - identical, added=len(added), removed=len(removed)
        ),
        matched=[
            MatchItem(
                left=function_ref(left, lview.by_address[m.left]),
                right=function_ref(right, rview.by_address[m.right]),
                kind=m.kind,  # type: ignore[arg-type]  # Match.kind is one of the two
                similarity=m.similarity,
                step=m.step,
            )
            for m in listed[pos:end]
        ],
        added=[function_ref(right, f) for f in added[pos:end]],
        removed=[function_ref(left, f) for f in removed[pos:end]],
        next_cursor=encode_cursor(left, qkey, end) if more else None,
    )


# --- compare.functions ---------------------------------------------------------------------------
class FunctionSide(Params):
    program: ProgramSpec | None = Field(None, description="A handle or {path}; omitted: the only open program.")
    selector: Selector


class CompareFunctionsParams(NeedsTwo):
    left: FunctionSide
    right: FunctionSide


class DiffLine(Result):
    op: Literal["equal", "replace", "insert", "delete"]
    left: list[str] = Field(description="Instructions of the left block in this stretch (address: text).")
    right: list[str] = Field(description="Instructions of the right block in this stretch.")


class BlockDiff(Result):
    left: str | None = Field(description="Start of the left block; null for a block only the right has.")
    right: str | None = Field(description="Start of the right block; null for a block only the left has.")
    status: Literal["identical", "changed", "added", "removed"]
    lines: list[DiffLine] = Field(description="The instruction diff of a changed, added or removed block.")


class CompareFunctionsResult(Result):
    left: FunctionRef
    right: FunctionRef
    kind: Literal["identical", "changed"]
    similarity: float
    blocks: list[BlockDiff]


def _select(prog: Program, view: AnalysisView, sel: Selector, target: str) -> FunctionRow:
    what = "name" if sel.name is not None else "address"
    va = prog.resolve(sel.name if sel.name is not None else sel.address or "", f"{target}/selector/{what}")
    f = view.function_at(va)
    if f is None:
        raise BinlensError("not_found", f"no function at or around {hex(va)}", target=f"{target}/selector/{what}")
    return f


def _block_lines(prog: Program, view: AnalysisView, fn: int) -> list[tuple[int, list[str], list[str]]]:
    """(start, normalised instruction tokens, displayed lines) of each block of a function."""
    dec = decoder(prog)
    ident = prog.image.identity
    out = []
    for start, end, _n, _t in view.blocks(fn):
        insns: list[ModelInstruction] = list(dec.instructions(start, end))

        def decoded(_s: int, _e: int, insns: list[ModelInstruction] = insns) -> list[ModelInstruction]:
            return insns

        feats = ModelFeatures(decoded, address_test(ident.image_base, prog.image.is_mapped))
        tokens = [f[0].decode(errors="replace") for f in feats(start, end)]
        shown = [f"{i.address:#x}: {i.mnemonic} {i.operands}".rstrip() for i in insns][: len(tokens)]
        out.append((start, tokens, shown))
    return out


def _instruction_diff(a: Sequence[str], b: Sequence[str], ta: Sequence[str], tb: Sequence[str]) -> list[DiffLine]:
    sm = difflib.SequenceMatcher(a=list(ta), b=list(tb), autojunk=False)
    return [DiffLine(op=op, left=list(a[i1:i2]), right=list(b[j1:j2])) for op, i1, i2, j1, j2 in sm.get_opcodes()]


def function_diff(
    left: Program, lview: AnalysisView, lf: FunctionRow, right: Program, rview: AnalysisView, rf: FunctionRow
) -> list[BlockDiff]:
    """The block-by-block diff of two functions: blocks aligned by their normalised instructions."""
    lb, rb = _block_lines(left, lview, lf.address), _block_lines(right, rview, rf.address)
    sm = difflib.SequenceMatcher(a=[tuple(t) for _s, t, _l in lb], b=[tuple(t) for _s, t, _l in rb], autojunk=False)
    out: list[BlockDiff] = []
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            out += [
                BlockDiff(left=hex(lb[i][0]), right=hex(rb[j][0]), status="identical", lines=[])
                for i, j in zip(range(i1, i2), range(j1, j2), strict=True)
            ]
            continue
        pairs = min(i2 - i1, j2 - j1)
        for k in range(pairs):
            (ls, lt, ll), (rs, rt, rl) = lb[i1 + k], rb[j1 + k]
            out.append(
                BlockDiff(left=hex(ls), right=hex(rs), status="changed", lines=_instruction_diff(ll, rl, lt, rt))
            )
        for ls, _lt, ll in lb[i1 + pairs : i2]:
            gone = [DiffLine(op="delete", left=ll, right=[])]
            out.append(BlockDiff(left=hex(ls), right=None, status="removed", lines=gone))
        for rs, _rt, rl in rb[j1 + pairs : j2]:
            new = [DiffLine(op="insert", left=[], right=rl)]
            out.append(BlockDiff(left=None, right=hex(rs), status="added", lines=new))
    return out


@method("compare.functions", effect=READ_ONLY, long_running=True)
def compare_functions(ws: Workspace, p: CompareFunctionsParams, ctx: CallContext) -> CompareFunctionsResult:
    """Diff two functions block by block and instruction by instruction (addresses masked)."""
    left = open_side(ws, p.left.program, "/params/left/program")
    right = open_side(ws, p.right.program, "/params/right/program")
    lview, rview = side_view(left, p, ctx), side_view(right, p, ctx)
    lf = _select(left, lview, p.left.selector, "/params/left")
    rf = _select(right, rview, p.right.selector, "/params/right")
    lfp = {f.address: f for f in fingerprints(left, lview)}[lf.address]
    rfp = {f.address: f for f in fingerprints(right, rview)}[rf.address]
    score = similarity(lfp, rfp)
    return CompareFunctionsResult(
        left=function_ref(left, lf),
        right=function_ref(right, rf),
        kind="identical" if score >= 1.0 else "changed",
        similarity=score,
        blocks=function_diff(left, lview, lf, right, rview, rf),
    )


# --- compare.port_annotations --------------------------------------------------------------------
PortKind = Literal["names", "prototypes", "comments", "globals"]
_PORT_CAP = 1000  # entries listed per list (the counts are complete)


class PortParams(NeedsTwo):
    source: ProgramSpec = Field(alias="from", description="The annotated program: a handle or {path}.")
    to: ProgramSpec = Field(description="The program that receives the annotations: a handle or {path}.")
    min_similarity: float = Field(0.6, ge=0.0, le=1.0, description="Only pairs at least this similar.")
    kinds: list[PortKind] = Field(["names", "prototypes", "comments", "globals"], min_length=1)


class PortEntry(Result):
    kind: str = Field(description="name, prototype, comment, global or data_type.")
    source: str | None = Field(None, description="Address in `from`.")
    target: str | None = Field(None, description="Address in `to`.")
    value: str | None = Field(None, description="What was copied (a name, a type, a comment's text).")
    reason: str | None = Field(None, description="Why it was skipped.")


class PortResult(Result):
    journal_id: int | None = Field(description="The one journal entry of `to` that undoes it all; null: none copied.")
    matched: int = Field(description="Matched pairs at least `min_similarity` similar.")
    copied: list[PortEntry]
    skipped: list[PortEntry]
    copied_count: int
    skipped_count: int


def _data_refs(view: AnalysisView, fn: int) -> list[int]:
    """The data a function references, distinct, in order of the referencing instructions."""
    refs = view.xrefs_from_function(fn, ("read", "write", "offset", "pointer", "string"))
    return list(dict.fromkeys(d for _s, d, _k, _f in refs))


class _Porter:
    """The changes of one port, planned inside `to`'s edit transaction."""

    def __init__(self, src: Program, sview: AnalysisView, dst: Program, dview: AnalysisView, p: PortParams) -> None:
        self.src, self.sview, self.dst, self.dview, self.p = src, sview, dst, dview, p
        self.copied: list[PortEntry] = []
        self.skipped: list[PortEntry] = []
        self.pairs: list[Match] = []
        self._done_globals: set[tuple[int, int]] = set()

    def skip(self, kind: str, a: int | None, b: int | None, reason: str, value: str | None = None) -> None:
        self.skipped.append(PortEntry(kind=kind, source=_hex(a), target=_hex(b), value=value, reason=reason))

    def copy(self, kind: str, a: int | None, b: int | None, value: str | None) -> None:
        self.copied.append(PortEntry(kind=kind, source=_hex(a), target=_hex(b), value=value))

    def plan(self, conn: Any) -> list[Change]:
        """Every change of the port, reading `to`'s rows through the edit's connection."""
        self.copied, self.skipped, self._done_globals = [], [], set()
        sconn = self.src.db.connect()
        sst, dst_store = store(self.src), store(self.dst)
        changes: list[Change] = []
        named: set[str] = set()
        kinds = set(self.p.kinds)
        need_types = False
        for m in self.pairs:
            lf, rf = self.sview.by_address[m.left], self.dview.by_address[m.right]
            if "names" in kinds:
                changes += self._name(conn, sconn, lf, rf, named)
            if "prototypes" in kinds:
                proto = sst.get(sconn, "prototype", (lf.address,))
                if proto is not None:
                    if dst_store.get(conn, "prototype", (rf.address,)) is not None:
                        self.skip("prototype", lf.address, rf.address, "`to` has a prototype there")
                    else:
                        changes.append(("prototype", (rf.address,), proto))
                        self.copy("prototype", lf.address, rf.address, proto["prototype"])
                        need_types = True
            if "comments" in kinds:
                changes += self._comments(conn, sconn, m, lf, rf)
            if "globals" in kinds:
                got = self._globals(conn, sconn, lf, rf, named)
                need_types = need_types or bool(got)
                changes += got
        if need_types:
            changes += self._types(conn, sconn)
        return changes

    def _name(self, conn: Any, sconn: Any, lf: FunctionRow, rf: FunctionRow, named: set[str]) -> list[Change]:
        name = store(self.src).get(sconn, "name", (lf.address,))
        text = name["name"] if name else (lf.symbol or None)
        if not text or text == f"sub_{lf.address:x}":
            return []
        mine = store(self.dst).get(conn, "name", (rf.address,))
        if mine is not None:
            if mine["name"] != text:
                self.skip("name", lf.address, rf.address, f"the user named it {mine['name']!r}", text)
            return []
        own = rf.symbol or rf.thunk
        if own:
            if own != text:
                self.skip("name", lf.address, rf.address, f"`to` names it {own!r}", text)
            return []
        if text in named:
            self.skip("name", lf.address, rf.address, "another ported function took this name", text)
            return []
        try:
            name_conflict(self.dst, conn, rf.address, text, "/params/to")
        except BinlensError as err:
            self.skip("name", lf.address, rf.address, err.message, text)
            return []
        named.add(text)
        self.copy("name", lf.address, rf.address, text)
        return [("name", (rf.address,), {"name": text})]

    def _comments(self, conn: Any, sconn: Any, m: Match, lf: FunctionRow, rf: FunctionRow) -> list[Change]:
        out: list[Change] = []
        rows = comment_rows_in(sconn, lf.address, lf.address + max(lf.size, 1))
        for va, kind, text in rows:
            if va == lf.address:
                target = rf.address
            elif m.kind == "identical":
                target = rf.address + (va - lf.address)
            else:
                self.skip("comment", va, None, "inside a changed function (only its entry's comments move)", text)
                continue
            if store(self.dst).get(conn, "comment", (target, kind)) is not None:
                self.skip("comment", va, target, f"`to` has a {kind} comment there", text)
                continue
            out.append(("comment", (target, kind), {"text": text}))
            self.copy("comment", va, target, text)
        return out

    def _globals(self, conn: Any, sconn: Any, lf: FunctionRow, rf: FunctionRow, named: set[str]) -> list[Change]:
        sst, dst_store = store(self.src), store(self.dst)
        lrefs, rrefs = _data_refs(self.sview, lf.address), _data_refs(self.dview, rf.address)
        out: list[Change] = []
        for a, b in zip(lrefs, rrefs, strict=False):
            g = sst.get(sconn, "global", (a,))
            if g is None or (a, b) in self._done_globals:
                continue
            self._done_globals.add((a, b))
            if len(lrefs) != len(rrefs):
                self.skip("global", a, b, "the functions reference different numbers of data items", g["type"])
                continue
            if dst_store.get(conn, "global", (b,)) is not None:
                self.skip("global", a, b, "`to` has a global there", g["type"])
                continue
            out.append(("global", (b,), g))
            self.copy("global", a, b, g["type"])
            name = sst.get(sconn, "name", (a,))
            if name is not None and name["name"] not in named and dst_store.get(conn, "name", (b,)) is None:
                try:
                    name_conflict(self.dst, conn, b, name["name"], "/params/to")
                except BinlensError as err:
                    self.skip("name", a, b, err.message, name["name"])
                    continue
                named.add(name["name"])
                out.append(("name", (b,), name))
                self.copy("name", a, b, name["name"])
        return out

    def _types(self, conn: Any, sconn: Any) -> list[Change]:
        """The user's data types of `from` that `to` lacks (what ported prototypes and globals name)."""
        out: list[Change] = []
        position = last_data_type_position(conn)
        for key, value in store(self.src).rows("data_type", sconn):
            if store(self.dst).get(conn, "data_type", key) is not None:
                continue
            position += 1
            out.append(("data_type", key, {**value, "position": position}))
            self.copy("data_type", None, None, str(key[0]))
        return out


def _hex(va: int | None) -> str | None:
    return None if va is None else hex(va)


@method("compare.port_annotations", effect=MUTATION, long_running=True)
def port_annotations(ws: Workspace, p: PortParams, ctx: CallContext) -> PortResult:
    """Copy names, prototypes, comments and typed globals to the matched functions of `to` as one undoable edit."""
    src = open_side(ws, p.source, "/params/from")
    dst = open_side(ws, p.to, "/params/to")
    if src is dst:
        raise BinlensError("invalid_argument", "`from` and `to` are the same program", target="/params/to")
    sview, dview = side_view(src, p, ctx), side_view(dst, p, ctx)
    porter = _Porter(src, sview, dst, dview, p)
    porter.pairs = [m for m in matches(src, sview, dst, dview) if m.similarity >= p.min_similarity]
    summary = f"port annotations from {src.identity['file_name']} ({len(porter.pairs)} matched functions)"
    entry = edit(dst, ctx, "compare.port_annotations", summary, porter.plan)
    return PortResult(
        journal_id=entry,
        matched=len(porter.pairs),
        copied=porter.copied[:_PORT_CAP],
        skipped=porter.skipped[:_PORT_CAP],
        copied_count=len(porter.copied),
        skipped_count=len(porter.skipped),
    )
