"""function_call.* and callgraph.*: who calls whom."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from binlens.analysis.model import function_display_name
from binlens.api.analysis import NeedsAnalysis, need_view, select_function
from binlens.api.function import FunctionItem, function_item
from binlens.api.models import HexAddress, Listing, Page, Result, Selector
from binlens.api.pages import page_by_offset
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.jobs.state import name_for_address
from binlens.store.analysis import AnalysisView
from binlens.workspace import Program, Workspace


class CallItem(Result):
    site: HexAddress = Field(description="Address of the call instruction.")
    caller: HexAddress
    caller_name: str
    callee: HexAddress
    callee_name: str | None
    callee_is_import: bool = Field(description="The callee is an import's slot (a call through the IAT/GOT).")


class FunctionCallListParams(NeedsAnalysis):
    selector: Selector
    direction: Literal["callers", "callees"] = Field("callees", description="Calls to the function, or made by it.")
    page: Page = Page()


def _is_import(prog: Program, va: int) -> bool:
    return any(imp.slot == va for imp in prog.image.imports)


@method("function_call.list", effect=READ_ONLY)
def function_call_list(ws: Workspace, p: FunctionCallListParams, ctx: CallContext) -> Listing[CallItem]:
    """The call sites that call a function (callers) or that it makes (callees), by site address."""
    prog, view = need_view(ws, p, ctx)
    f = select_function(prog, view, p.selector)
    fname = name_for_address(prog, f.address) or function_display_name(f.address)
    items = []
    if p.direction == "callees":
        for site, callee in view.callees(f.address):
            items.append(
                CallItem(
                    site=hex(site),
                    caller=hex(f.address),
                    caller_name=fname,
                    callee=hex(callee),
                    callee_name=name_for_address(prog, callee),
                    callee_is_import=_is_import(prog, callee),
                )
            )
    else:
        for caller, site in view.callers(f.address):
            items.append(
                CallItem(
                    site=hex(site),
                    caller=hex(caller),
                    caller_name=name_for_address(prog, caller) or function_display_name(caller),
                    callee=hex(f.address),
                    callee_name=fname,
                    callee_is_import=False,
                )
            )
    out, cursor = page_by_offset(prog, p, items, p.page)
    return Listing[CallItem](items=out, next_cursor=cursor)


class CallgraphParams(NeedsAnalysis):
    selector: Selector
    depth: int = Field(1, ge=1, le=3, description="How many calls away from the function (1..3).")
    direction: Literal["both", "callers", "callees"] = "both"


class CallgraphNode(Result):
    address: HexAddress
    name: str
    depth: int
    is_import: bool = False


class CallgraphEdge(Result):
    caller: HexAddress
    callee: HexAddress
    sites: int


class Callgraph(Result):
    root: FunctionItem
    nodes: list[CallgraphNode]
    edges: list[CallgraphEdge]


def _walk(view: AnalysisView, root: int, depth: int, up: bool) -> tuple[dict[int, int], dict[tuple[int, int], int]]:
    seen = {root: 0}
    edges: dict[tuple[int, int], int] = {}
    frontier = [root]
    for d in range(1, depth + 1):
        nxt = []
        for fn in frontier:
            pairs = [(c, fn) for c, _site in view.callers(fn)] if up else [(fn, c) for _site, c in view.callees(fn)]
            for caller, callee in pairs:
                edges[(caller, callee)] = edges.get((caller, callee), 0) + 1
                other = caller if up else callee
                if other not in seen:
                    seen[other] = d
                    if other in view.by_address:
                        nxt.append(other)
        frontier = nxt
    return seen, edges


@method("callgraph.get", effect=READ_ONLY)
def callgraph_get(ws: Workspace, p: CallgraphParams, ctx: CallContext) -> Callgraph:
    """The call graph around a function: callers and/or callees up to `depth` calls away."""
    prog, view = need_view(ws, p, ctx)
    f = select_function(prog, view, p.selector)
    nodes: dict[int, int] = {f.address: 0}
    edges: dict[tuple[int, int], int] = {}
    for up in (True, False):
        if p.direction == ("callees" if up else "callers"):
            continue
        seen, es = _walk(view, f.address, p.depth, up)
        for va, d in seen.items():
            nodes[va] = min(d, nodes.get(va, d))
        edges.update(es)
    return Callgraph(
        root=function_item(prog, f),
        nodes=[
            CallgraphNode(
                address=hex(va),
                name=name_for_address(prog, va) or function_display_name(va),
                depth=d,
                is_import=va not in view.by_address and _is_import(prog, va),
            )
            for va, d in sorted(nodes.items())
        ],
        edges=[CallgraphEdge(caller=hex(a), callee=hex(b), sites=n) for (a, b), n in sorted(edges.items())],
    )
