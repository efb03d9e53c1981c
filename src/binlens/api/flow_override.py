"""flow_override.*: say how an instruction's flow differs from its decoding, as Ghidra's flow overrides.

An override is an annotation (`ann_flow_override`, journaled and undoable like every edit) and
a change to the analysis: after the edit, and after its undo or redo, the engine re-analyses the
functions holding the instruction locally (`ProgramAnalysisState.reanalyse_flow`, as
`function.create` does), so their blocks, CFG edges, calls and references follow it. The kinds
(`analysis/discovery/overrides.py`): `branch` (a call taken as a jump), `call` (a jump taken as a
call), `call_return` (a call that does not come back), `return` (a jump taken as a return);
`none` removes the override.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

from pydantic import Field

from binlens.analysis.discovery.overrides import APPLIES_TO
from binlens.api.analysis import NeedsAnalysis
from binlens.api.code_unit import flow_overrides
from binlens.api.edits import EditResult, edit, engine, refresh, settle_analysis
from binlens.api.instruction import decoder, thumb_spans
from binlens.api.models import HexAddress, Listing, Page, Params, ProgramRef, Result, Scan, Selector
from binlens.api.pages import page_by_address
from binlens.api.registry import MUTATION, READ_ONLY, CallContext, method
from binlens.api.symbol_edit import selected_address
from binlens.errors import BinlensError
from binlens.jobs.state import name_for_address
from binlens.store.annotations import Change
from binlens.workspace import Program, Workspace

OverrideKind = Literal["branch", "call", "call_return", "return"]


class FlowOverrideItem(Result):
    """One instruction's flow override."""

    address: HexAddress
    type: OverrideKind = Field(
        description="branch: call as jump; call: jump as call; call_return: call that does not return; "
        "return: jump as return"
    )
    instruction: str | None = Field(description="The instruction's text (null if it no longer decodes).")
    flow: str | None = Field(description="The instruction's own flow, without the override.")
    function: HexAddress | None = Field(description="The (first) function holding the instruction.")
    function_name: str | None = None


class FlowOverrideListParams(Params):
    program: ProgramRef | None = None
    page: Page = Page()
    scan: Scan = Scan()


class FlowOverridePatchParams(NeedsAnalysis):
    selector: Selector = Field(description="The call or jump instruction.")
    type: OverrideKind | Literal["none"] = Field(
        description="branch: a call taken as a jump; call: a jump taken as a call; call_return: a call that "
        "does not return; return: a jump taken as a return; none: remove the override"
    )


class FlowOverridePatched(EditResult):
    """The override after the edit and the functions re-analysed."""

    override: FlowOverrideItem | None = Field(description="The override now in place (null after none).")
    reanalysed: list[HexAddress] = Field(description="Entries of the functions re-analysed for it.")


def _decoded(prog: Program, va: int) -> tuple[str, str] | None:
    """(text, flow) of the instruction at `va`, or None if none decodes there."""
    dec = decoder(prog)
    st = engine(prog)
    view = getattr(st, "view", None)
    if view is not None:
        thumb_spans(dec, view, [(va, va + 16)])
    insns = dec.instructions(va, va + 16)
    if not insns or insns[0].address != va:
        return None
    return insns[0].text, insns[0].flow


def _item(prog: Program, va: int, kind: OverrideKind) -> FlowOverrideItem:
    decoded = _decoded(prog, va)
    view = getattr(engine(prog), "view", None)
    fns = view.functions_containing(va) if view is not None else []
    fn = fns[0] if fns else None
    return FlowOverrideItem(
        address=hex(va),
        type=kind,
        instruction=decoded[0] if decoded else None,
        flow=decoded[1] if decoded else None,
        function=hex(fn) if fn is not None else None,
        function_name=(name_for_address(prog, fn) or f"sub_{fn:x}") if fn is not None else None,
    )


@method("flow_override.list", effect=READ_ONLY)
def flow_override_list(ws: Workspace, p: FlowOverrideListParams) -> Listing[FlowOverrideItem]:
    """The user's flow overrides in address order, with each instruction and its function."""
    prog = ws.program(p.program)
    refresh(prog)
    rows = sorted(flow_overrides(prog).items())
    out, cursor, report = page_by_address(prog, p, rows, lambda r: r[0], p.page, p.scan)
    return Listing[FlowOverrideItem](
        items=[_item(prog, va, kind) for va, kind in out],  # type: ignore[arg-type]
        next_cursor=cursor,
        scan=report,
    )


@method("flow_override.patch", effect=MUTATION)
def flow_override_patch(ws: Workspace, p: FlowOverridePatchParams, ctx: CallContext) -> FlowOverridePatched:
    """Override a call's or jump's flow (or remove it, type none); the engine re-analyses its functions."""
    prog = ws.program(p.program)
    refresh(prog)
    analysis = engine(prog)
    if analysis is None or not hasattr(analysis, "reanalyse_flow"):
        raise BinlensError("unavailable", "flow overrides need the analysis engine, which is not attached")
    settle_analysis(prog, ctx, p.timeout_ms / 1000)
    va = selected_address(prog, p.selector)
    view = analysis.require(ctx, wait=p.wait, timeout_s=p.timeout_ms / 1000)
    decoded = _decoded(prog, va)
    if decoded is None:
        raise BinlensError("invalid_argument", f"no instruction decodes at {hex(va)}", target="/params/selector")
    text, flow = decoded
    if p.type != "none" and flow not in APPLIES_TO[p.type]:
        wants = ", ".join(APPLIES_TO[p.type])
        raise BinlensError(
            "invalid_argument",
            f"{text!r} is a {flow} instruction; a {p.type} override applies to {wants}",
            target="/params/type",
            details={"flow": flow},
        )
    if p.type != "none" and not view.functions_containing(va):
        raise BinlensError(
            "not_found", f"no analysed function holds {hex(va)} (define one first)", target="/params/selector"
        )

    def plan(conn: sqlite3.Connection) -> list[Change]:
        return [("flow_override", (va,), None if p.type == "none" else {"type": p.type})]

    verb = "remove the flow override" if p.type == "none" else f"override the flow ({p.type})"
    entry = edit(prog, ctx, "flow_override.patch", f"{verb} at {hex(va)}", plan)
    redone = analysis.reanalyse_flow(va, ctx) if entry is not None else []
    return FlowOverridePatched(
        journal_id=entry,
        override=_item(prog, va, p.type) if p.type != "none" else None,
        reanalysed=[hex(f) for f in redone],
    )
