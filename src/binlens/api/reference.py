"""reference.*: cross-references to or from an address."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from binlens.analysis.model import XREF_KINDS
from binlens.api.analysis import NeedsAnalysis, need_view
from binlens.api.models import AddressText, HexAddress, Listing, Page, Result
from binlens.api.pages import page_by_offset
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import name_for_address
from binlens.workspace import Workspace

XrefKind = Literal[XREF_KINDS]  # type: ignore[valid-type]  # the engine's tuple, spelled once; pydantic reads it


class ReferenceItem(Result):
    from_address: HexAddress
    to_address: HexAddress
    kind: str = Field(description="call, jump, jump_table, tail_call, read, write, offset, pointer or string")
    function: HexAddress | None = Field(None, description="Function containing the referencing instruction.")
    function_name: str | None = None
    to_name: str | None = None


class ReferenceListParams(NeedsAnalysis):
    address: AddressText = Field(description="The address (or name) references go to or come from.")
    direction: Literal["to", "from"] = Field("to", description="References to the address, or made from it.")
    scope: Literal["address", "function"] = Field(
        "address", description="'function' with direction 'from': every reference made inside the function."
    )
    kind: list[XrefKind] | None = Field(None, max_length=len(XREF_KINDS), description="Only these kinds.")
    page: Page = Page()


@method("reference.list", effect=READ_ONLY)
def reference_list(ws: Workspace, p: ReferenceListParams, ctx: CallContext) -> Listing[ReferenceItem]:
    """Cross-references to or from an address (or from a whole function), filtered by kind."""
    prog, view = need_view(ws, p, ctx)
    va = prog.resolve(p.address, "/params/address")
    kinds = tuple(p.kind or ())
    if p.direction == "to":
        rows = view.xrefs_to(va, kinds)
    elif p.scope == "function":
        f = view.function_at(va)
        if f is None:
            raise BinlensError("not_found", f"no function at or around {hex(va)}", target="/params/address")
        rows = view.xrefs_from_function(f.address, kinds)
    else:
        rows = view.xrefs_from(va, kinds)
    names: dict[int, str | None] = {}

    def name(a: int) -> str | None:
        if a not in names:
            names[a] = name_for_address(prog, a)
        return names[a]

    items = [
        ReferenceItem(
            from_address=hex(s),
            to_address=hex(d),
            kind=k,
            function=hex(f) if f is not None else None,
            function_name=name(f) if f is not None else None,
            to_name=name(d),
        )
        for s, d, k, f in rows
    ]
    out, cursor = page_by_offset(prog, p, items, p.page)
    return Listing[ReferenceItem](items=out, next_cursor=cursor)
