"""address.* and address_space.*: resolve addresses and names; list the mapped address space."""

from __future__ import annotations

from pydantic import Field

from binlens.api.common import ProgramIdentity
from binlens.api.models import AddressText, HexAddress, Params, ProgramRef, Result, Selector, selector_or_address
from binlens.api.registry import READ_ONLY, method
from binlens.workspace import Workspace


class AddressResolveParams(Params):
    program: ProgramRef | None = None
    selector: Selector | None = Field(default=None, description="The address, or a name such as `main+0x10`.")
    address: AddressText | None = Field(default=None, description="The same as selector.address (give one of the two).")


class SymbolRef(Result):
    name: str
    address: HexAddress
    offset: int


class AddressInfo(Result):
    program: ProgramIdentity
    address: HexAddress
    mapped: bool
    file_offset: int | None
    segment: str | None
    section: str | None
    perms: str | None
    symbol: SymbolRef | None


class AddressSpaceListParams(Params):
    program: ProgramRef | None = None


class AddressSpace(Result):
    name: str
    start: HexAddress
    end: HexAddress
    size: int
    file_backed_bytes: int
    file_offset: int | None


class AddressSpaceList(Result):
    items: list[AddressSpace]
    next_cursor: str | None = None


@method("address.resolve", effect=READ_ONLY)
def address_resolve(ws: Workspace, p: AddressResolveParams) -> AddressInfo:
    """Resolve an address or `symbol[+off]`: segment, section, nearest symbol and file offset."""
    prog = ws.program(p.program)
    va, _target = selector_or_address(prog, p.selector, p.address)
    img = prog.image
    seg = img.segment_at(va)
    sec = img.section_at(va)
    near = prog.nearest_symbol(va)
    sym = None
    if near is not None and (seg is None or near[0].address >= seg.va):
        sym = SymbolRef(name=near[0].name, address=hex(near[0].address), offset=near[1])
    return AddressInfo(
        program=ProgramIdentity(**prog.identity),
        address=hex(va),
        mapped=img.is_mapped(va),
        file_offset=img.va_to_offset(va),
        segment=seg.name if seg else None,
        section=sec.name if sec else None,
        perms=(sec.perms if sec else seg.perms if seg else None),
        symbol=sym,
    )


@method("address_space.list", effect=READ_ONLY)
def address_space_list(ws: Workspace, p: AddressSpaceListParams) -> AddressSpaceList:
    """List the mapped virtual address ranges and which of their bytes come from the file."""
    prog = ws.program(p.program)
    items = []
    for r in prog.image.regions:
        seg = prog.image.segment_at(r.va)
        items.append(
            AddressSpace(
                name=seg.name if seg else "",
                start=hex(r.va),
                end=hex(r.va + r.vsize),
                size=r.vsize,
                file_backed_bytes=r.fsize,
                file_offset=r.offset if r.fsize else None,
            )
        )
    return AddressSpaceList(items=items)


# address.symbolize lives in its own module; importing it here registers it with its namespace
from binlens.api import address_symbolize as _symbolize  # noqa: E402, F401
