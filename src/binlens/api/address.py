"""address.* and address_space.*: resolve addresses and names; list the mapped address space.

`address.resolve` says where an address is (segment, section, nearest symbol, file offset) and
which function contains it; `address.context` adds in one call what a person looks at next:
the name at the address, the user's comments of each kind and bookmarks there, and the data
unit or instruction there.
"""

from __future__ import annotations

from pydantic import Field

from binlens.api.analysis import NeedsAnalysis
from binlens.api.common import ProgramIdentity
from binlens.api.edits import refresh
from binlens.api.models import AddressText, HexAddress, Params, ProgramRef, Result, Selector, selector_or_address
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of, function_name
from binlens.store.analysis import AnalysisView
from binlens.store.annotations import bookmark_rows_at, comment_rows_at
from binlens.workspace import Program, Workspace


class AddressResolveParams(NeedsAnalysis):
    selector: Selector | None = Field(default=None, description="The address, or a name such as `main+0x10`.")
    address: AddressText | None = Field(default=None, description="The same as selector.address (give one of the two).")


class SymbolRef(Result):
    name: str
    address: HexAddress
    offset: int


class ContainingFunction(Result):
    """The function an address is in: its name, entry and the address's offset from the entry."""

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
    function: ContainingFunction | None = Field(
        default=None, description="The function containing the address (null outside functions)."
    )


class AddressContextParams(NeedsAnalysis):
    selector: Selector


class BookmarkAt(Result):
    category: str
    note: str


class InstructionAt(Result):
    address: HexAddress
    text: str


class AddressContext(AddressInfo):
    """Everything known at one address."""

    name: str | None = Field(description="The name at exactly this address (user, symbol or function name).")
    comments: dict[str, str] = Field(description="The user's comments here by kind (eol, pre, plate).")
    bookmarks: list[BookmarkAt]
    data: dict | None = Field(
        default=None, description="The defined data unit containing the address (as data_unit.list gives it)."
    )
    instruction: InstructionAt | None = Field(
        default=None, description="The analysed instruction containing the address (its start may be below it)."
    )


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


def _view(prog: Program, p: NeedsAnalysis, ctx: CallContext | None) -> AnalysisView | None:
    """The analysis view as the params say to wait for it; None when the analysis cannot run."""
    try:
        return analysis_of(prog).require(ctx, wait=p.wait, timeout_s=p.timeout_ms / 1000)
    except BinlensError as err:
        if err.code == "unavailable" and p.wait:  # (failed or unsupported: the symbols still answer)
            return None
        raise


def containing_function(prog: Program, view: AnalysisView | None, va: int) -> ContainingFunction | None:
    """The function containing `va`: the analysis's, else a function symbol whose extent holds it."""
    if view is not None:
        f = view.function_at(va)
        if f is None:
            return None
        return ContainingFunction(name=function_name(prog, f), address=hex(f.address), offset=va - f.address)
    for s in prog.image.symbols:
        if s.kind == "function" and s.address <= va < s.address + max(s.size, 1):
            return ContainingFunction(name=prog.name_at(s.address) or s.name, address=hex(s.address),
                                      offset=va - s.address)  # fmt: skip
    return None


def _in_code(prog: Program, va: int) -> bool:
    sec = prog.image.section_at(va)
    return prog.image.is_mapped(va) and (sec is None or sec.kind == "code")


@method("address.resolve", effect=READ_ONLY)
def address_resolve(ws: Workspace, p: AddressResolveParams, ctx: CallContext) -> AddressInfo:
    """Resolve an address or `symbol[+off]`: segment, section, nearest symbol, file offset, containing function."""
    prog = ws.program(p.program)
    va, _target = selector_or_address(prog, p.selector, p.address)
    return _resolve(prog, va, _view(prog, p, ctx) if _in_code(prog, va) else None)


def _resolve(prog: Program, va: int, view: AnalysisView | None) -> AddressInfo:
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
        function=containing_function(prog, view, va) if _in_code(prog, va) else None,
    )


def _instruction_at(prog: Program, view: AnalysisView, va: int) -> InstructionAt | None:
    """The instruction of an analysed block that contains `va`, decoded from the block's start."""
    from binlens.api.instruction import decoder, thumb_spans

    block = view.block_at(va)
    if block is None:
        return None
    dec = decoder(prog)
    thumb_spans(dec, view, [(block[1], block[2])])
    at = next((i for i in dec.instructions(block[1], block[2]) if i.address <= va < i.address + i.size), None)
    return InstructionAt(address=hex(at.address), text=at.text) if at is not None else None


@method("address.context", effect=READ_ONLY)
def address_context(ws: Workspace, p: AddressContextParams, ctx: CallContext) -> AddressContext:
    """All at one address: name, containing function, comments by kind, bookmarks, section, data unit."""
    from binlens.api.code_unit import data_unit_at

    prog = ws.program(p.program)
    refresh(prog)
    va, _target = selector_or_address(prog, p.selector, None)
    view = _view(prog, p, ctx)
    info = _resolve(prog, va, view)
    conn = prog.db.connect()
    data = data_unit_at(prog, view, va) if view is not None else None
    insn = _instruction_at(prog, view, va) if view is not None and data is None else None
    name = prog.name_at(va)
    if name is None and info.function is not None and info.function.offset == 0:
        name = info.function.name
    return AddressContext(
        **info.model_dump(exclude={"program"}),
        program=info.program,
        name=name,
        comments=comment_rows_at(conn, va),
        bookmarks=[BookmarkAt(category=c, note=n) for c, n in bookmark_rows_at(conn, va)],
        data=data.model_dump() if data is not None else None,
        instruction=insn,
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
