"""compare.*: match two programs' functions, diff two functions (port: `api/compare_port.py`).

The matching (`analysis/fingerprint/matching.py`) works on the function fingerprints each program's
database keeps (`api/fingerprints.py`); a side may be retained evidence of them
(`api/compare_sides.py`); see docs/COMPARE.md.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from binlens.analysis.fingerprint.features import similarity
from binlens.analysis.fingerprint.matching import Match, match_functions
from binlens.api.common import ProgramIdentity
from binlens.api.compare_sides import (
    BlockTokens,
    EvidenceIdentity,
    EvidenceRef,
    FingerprintItem,
    NeedsTwo,
    ProgramSpec,
    Side,
    block_tokens,
    cursor_key,
    evidence_side,
    fingerprint_item,
    item_fingerprint,
    live_side,
    open_side,
    select_row,
    side_view,
)
from binlens.api.cursor import decode_scoped, encode_scoped, query_key
from binlens.api.fingerprints import fingerprints
from binlens.api.models import Page, Params, Result, Selector
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.jobs.state import function_name
from binlens.store.analysis import AnalysisView, FunctionRow
from binlens.workspace import Program, Workspace

_MATCH_CACHE = "compare.matches"  # Workspace.extensions: the last matching, by its sides' keys


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


def side_matches(ws: Workspace, left: Side, right: Side) -> list[Match]:
    """The matched functions of two sides (live or evidence), by left address."""
    if left.prog is not None and right.prog is not None:
        assert left.view is not None and right.view is not None
        return matches(left.prog, left.view, right.prog, right.view)
    key = (left.key, right.key)
    cached = ws.extensions.get(_MATCH_CACHE)
    if cached is not None and cached[0] == key:
        return list(cached[1])
    found = match_functions(left.fingerprints(), right.fingerprints())
    ws.extensions[_MATCH_CACHE] = (key, found)
    return found


def _side(ws: Workspace, spec: ProgramSpec | EvidenceRef, p: NeedsTwo, ctx: CallContext, target: str) -> Side:
    if isinstance(spec, EvidenceRef):
        return evidence_side(ws, spec, target, one=False)
    prog = open_side(ws, spec, target)
    return live_side(prog, side_view(prog, p, ctx))


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
    left: ProgramSpec | EvidenceRef = Field(
        description="The older program: a handle, {path} opened under the roots, or compare.fingerprints evidence."
    )
    right: ProgramSpec | EvidenceRef = Field(
        description="The newer program: a handle, {path} opened under the roots, or compare.fingerprints evidence."
    )
    kinds: list[Literal["identical", "changed"]] = Field(
        ["identical", "changed"], description="Which matched pairs to list."
    )
    page: Page = Page()


class CompareProgramsResult(Result):
    left: ProgramIdentity | EvidenceIdentity
    right: ProgramIdentity | EvidenceIdentity
    counts: CompareCounts
    matched: list[MatchItem] = Field(description="Matched pairs by left address, this page's share.")
    added: list[FunctionRef] = Field(description="Functions of `right` with no match, this page's share.")
    removed: list[FunctionRef] = Field(description="Functions of `left` with no match, this page's share.")
    next_cursor: str | None = Field(None, description="The next page of all three lists; null at the end.")


def function_ref(prog: Program, f: FunctionRow) -> FunctionRef:
    """A function as compare results name it."""
    return FunctionRef(address=hex(f.address), name=function_name(prog, f), size=f.size)


def side_refs(side: Side) -> dict[int, FunctionRef]:
    """Every function of a side as compare results name it, by address."""
    if side.record is not None:
        items = side.record.functions
        return {int(i.address, 16): FunctionRef(address=i.address, name=i.name, size=i.size) for i in items}
    assert side.prog is not None and side.view is not None
    return {f.address: function_ref(side.prog, f) for f in side.view.functions}


def page_position(ws: Workspace, side: Side, cursor: str | None, qkey: str) -> int:
    """Where a page starts (cursors are bound to the left side's content and the query)."""
    key = side.prog.cursor_key if side.prog is not None else cursor_key(ws)
    pos = decode_scoped(cursor, key, side.sha256, qkey) or 0
    return pos if isinstance(pos, int) and pos >= 0 else 0


def next_page(ws: Workspace, side: Side, qkey: str, end: int) -> str:
    """The cursor of the page that starts at `end`."""
    key = side.prog.cursor_key if side.prog is not None else cursor_key(ws)
    return encode_scoped(key, side.sha256, qkey, end)


@method("compare.programs", effect=READ_ONLY, long_running=True)
def compare_programs(ws: Workspace, p: CompareProgramsParams, ctx: CallContext) -> CompareProgramsResult:
    """Match the functions of two programs (BinDiff-style): identical and changed pairs, added, removed."""
    left = _side(ws, p.left, p, ctx, "/params/left")
    right = _side(ws, p.right, p, ctx, "/params/right")
    found = side_matches(ws, left, right)
    lrefs, rrefs = side_refs(left), side_refs(right)
    lmatched = {m.left for m in found}
    rmatched = {m.right for m in found}
    added = [f for a, f in sorted(rrefs.items()) if a not in rmatched]
    removed = [f for a, f in sorted(lrefs.items()) if a not in lmatched]
    listed = [m for m in found if m.kind in p.kinds]
    qkey = query_key(p)
    pos = page_position(ws, left, p.page.cursor, qkey)
    end = pos + p.page.limit
    more = end < max(len(listed), len(added), len(removed))
    identical = sum(1 for m in found if m.kind == "identical")
    return CompareProgramsResult(
        left=left.identity(),
        right=right.identity(),
        counts=CompareCounts(
            identical=identical, changed=len(found) - identical, added=len(added), removed=len(removed)
        ),
        matched=[
            MatchItem(
                left=lrefs[m.left],
                right=rrefs[m.right],
                kind=m.kind,  # type: ignore[arg-type]  # Match.kind is one of the two
                similarity=m.similarity,
                step=m.step,
            )
            for m in listed[pos:end]
        ],
        added=added[pos:end],
        removed=removed[pos:end],
        next_cursor=next_page(ws, left, qkey, end) if more else None,
    )


# --- compare.functions ---------------------------------------------------------------------------
class FunctionSide(Params):
    program: ProgramSpec | None = Field(None, description="A handle or {path}; omitted: the only open program.")
    selector: Selector


class CompareFunctionsParams(NeedsTwo):
    left: FunctionSide | EvidenceRef = Field(
        description="{program?, selector}, or compare.fingerprints evidence of one function ({evidence_id}|{record})."
    )
    right: FunctionSide | EvidenceRef = Field(description="As `left`.")
    page: Page = Page()


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
    blocks: list[BlockDiff] = Field(description="The aligned blocks in order, this page's share.")
    next_cursor: str | None = Field(None, description="The next page of `blocks`; null at the end.")


def _instruction_diff(a: Sequence[str], b: Sequence[str], ta: Sequence[str], tb: Sequence[str]) -> list[DiffLine]:
    sm = difflib.SequenceMatcher(a=list(ta), b=list(tb), autojunk=False)
    return [DiffLine(op=op, left=list(a[i1:i2]), right=list(b[j1:j2])) for op, i1, i2, j1, j2 in sm.get_opcodes()]


def block_alignment(
    lb: Sequence[BlockTokens], rb: Sequence[BlockTokens]
) -> list[tuple[BlockTokens | None, BlockTokens | None, str]]:
    """The two functions' blocks aligned by their normalised instructions: (left, right, status)."""
    sm = difflib.SequenceMatcher(a=[tuple(b.tokens) for b in lb], b=[tuple(b.tokens) for b in rb], autojunk=False)
    out: list[tuple[BlockTokens | None, BlockTokens | None, str]] = []
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            out += [(lb[i], rb[j], "identical") for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
            continue
        pairs = min(i2 - i1, j2 - j1)
        out += [(lb[i1 + k], rb[j1 + k], "changed") for k in range(pairs)]
        out += [(b, None, "removed") for b in lb[i1 + pairs : i2]]
        out += [(None, b, "added") for b in rb[j1 + pairs : j2]]
    return out


def block_diff(left: BlockTokens | None, right: BlockTokens | None, status: str) -> BlockDiff:
    """One aligned pair of blocks with the instruction diff its status calls for."""
    if status == "identical":
        lines: list[DiffLine] = []
    elif left is not None and right is not None:
        lines = _instruction_diff(left.lines, right.lines, left.tokens, right.tokens)
    elif left is not None:
        lines = [DiffLine(op="delete", left=left.lines, right=[])]
    else:
        assert right is not None
        lines = [DiffLine(op="insert", left=[], right=right.lines)]
    return BlockDiff(
        left=left.start if left else None,
        right=right.start if right else None,
        status=status,  # type: ignore[arg-type]  # one of the four block_alignment gives
        lines=lines,
    )


def _function_side(
    ws: Workspace, spec: FunctionSide | EvidenceRef, p: NeedsTwo, ctx: CallContext, target: str
) -> tuple[Side, FingerprintItem, list[BlockTokens]]:
    """A side of compare.functions: its function's fingerprint and normalised blocks."""
    if isinstance(spec, EvidenceRef):
        side = evidence_side(ws, spec, target, one=True)
        assert side.record is not None and side.record.blocks is not None
        return side, side.record.functions[0], side.record.blocks
    prog = open_side(ws, spec.program, f"{target}/program")
    view = side_view(prog, p, ctx)
    row = select_row(prog, view, spec.selector, target)
    fp = next(f for f in fingerprints(prog, view) if f.address == row.address)
    return live_side(prog, view), fingerprint_item(prog, row, fp), block_tokens(prog, view, row.address)


@method("compare.functions", effect=READ_ONLY, long_running=True)
def compare_functions(ws: Workspace, p: CompareFunctionsParams, ctx: CallContext) -> CompareFunctionsResult:
    """Diff two functions block by block and instruction by instruction (addresses masked); paged by block."""
    lside, lf, lb = _function_side(ws, p.left, p, ctx, "/params/left")
    _rside, rf, rb = _function_side(ws, p.right, p, ctx, "/params/right")
    score = similarity(item_fingerprint(lf), item_fingerprint(rf))
    aligned = block_alignment(lb, rb)
    qkey = query_key(p)
    pos = page_position(ws, lside, p.page.cursor, qkey)
    end = pos + p.page.limit
    return CompareFunctionsResult(
        left=FunctionRef(address=lf.address, name=lf.name, size=lf.size),
        right=FunctionRef(address=rf.address, name=rf.name, size=rf.size),
        kind="identical" if score >= 1.0 else "changed",
        similarity=score,
        blocks=[block_diff(*a) for a in aligned[pos:end]],
        next_cursor=next_page(ws, lside, qkey, end) if end < len(aligned) else None,
    )
