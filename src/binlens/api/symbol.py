"""symbol.*: symbols, imports and exports of a program."""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import Field

from binlens.api.models import HexAddress, Listing, Page, Params, ProgramRef, Result, Scan, ScanReport, Selector
from binlens.api.pages import page_by_offset, scan_bounds
from binlens.api.registry import READ_ONLY, method
from binlens.errors import BinlensError
from binlens.workspace import Program, Workspace

SymbolKind = Literal["function", "object", "import", "export", "other"]


class SymbolItem(Result):
    name: str
    raw_name: str
    address: HexAddress
    size: int
    kind: SymbolKind
    binding: str | None = None
    source: str
    library: str | None = None
    user_name: str | None = Field(None, description="The user's name for this address (symbol.patch), if any.")


class SymbolListParams(Params):
    program: ProgramRef | None = None
    kind: SymbolKind | None = Field(None, description="Only symbols of this kind.")
    name: str | None = Field(None, max_length=1024, description="Glob on the (demangled or raw) name.")
    page: Page = Page()
    scan: Scan = Scan()


class SymbolGetParams(Params):
    program: ProgramRef | None = None
    selector: Selector


def all_symbols(prog: Program) -> list[SymbolItem]:
    """Every symbol, import and export, in address order (cached per program)."""
    cached = prog.extensions.get("symbol.items")
    if cached is not None:
        return cached
    img = prog.image
    items = [
        SymbolItem(
            name=s.name,
            raw_name=s.raw_name,
            address=hex(s.address),
            size=s.size,
            kind=s.kind,
            binding=s.binding,
            source=s.source,
        )
        for s in img.symbols
    ]
    items += [
        SymbolItem(
            name=i.name,
            raw_name=i.raw_name,
            address=hex(i.stub if i.stub is not None else i.slot),
            size=0,
            kind="import",
            source="import",
            library=i.library,
        )
        for i in img.imports
    ]
    items += [
        SymbolItem(name=e.name, raw_name=e.raw_name, address=hex(e.address), size=0, kind="export", source="export")
        for e in img.exports
    ]
    items.sort(key=lambda s: (int(s.address, 16), s.kind, s.name))
    prog.extensions["symbol.items"] = items
    return items


@method("symbol.list", effect=READ_ONLY)
def symbol_list(ws: Workspace, p: SymbolListParams) -> Listing[SymbolItem]:
    """List symbols, imports and exports in address order, filtered by kind and name glob."""
    prog = ws.program(p.program)
    refresh_names(prog)
    items = all_symbols(prog)
    if p.kind:
        items = [s for s in items if s.kind == p.kind]
    if p.name:
        items = [s for s in items if fnmatch.fnmatchcase(s.name, p.name) or fnmatch.fnmatchcase(s.raw_name, p.name)]
    start, end = scan_bounds(prog, p.scan)
    if p.scan.range is not None:
        items = [s for s in items if start <= int(s.address, 16) < end]
    out, cursor = page_by_offset(prog, p, items, p.page)
    report = ScanReport(
        complete=cursor is None,
        stop_reason="limit" if cursor else "range_end",
        scanned_to=out[-1].address if cursor and out else None,
    )
    return Listing[SymbolItem](items=[with_user_name(prog, s) for s in out], next_cursor=cursor, scan=report)


def refresh_names(prog: Program) -> None:
    """Pick up renames made by other processes (the annotation layer's hook, when loaded)."""
    refresh = prog.extensions.get("annotations.refresh")
    if refresh is not None:
        refresh()


def with_user_name(prog: Program, item: SymbolItem) -> SymbolItem:
    """The item with the user's name for its address (items are cached, so this copies)."""
    user = prog.user_names.get(int(item.address, 16))
    return item.model_copy(update={"user_name": user}) if user is not None else item


@method("symbol.get", effect=READ_ONLY)
def symbol_get(ws: Workspace, p: SymbolGetParams) -> SymbolItem:
    """One symbol by address or name."""
    prog = ws.program(p.program)
    refresh_names(prog)
    items = all_symbols(prog)
    if p.selector.name is not None:
        hits = [s for s in items if p.selector.name in (s.name, s.raw_name)]
        renamed = prog.user_names.addresses_of(p.selector.name)
        hits = hits or [s for s in items if renamed and int(s.address, 16) == renamed[0]]
        if not hits:
            raise BinlensError("not_found", f"no symbol named {p.selector.name!r}", target="/params/selector/name")
        return with_user_name(prog, hits[0])
    va = prog.resolve(p.selector.address or "", "/params/selector/address")
    hits = [s for s in items if int(s.address, 16) == va]
    if not hits:
        raise BinlensError("not_found", f"no symbol at {hex(va)}", target="/params/selector/address")
    return with_user_name(prog, hits[0])
