"""symbol.patch: rename (or un-rename) the symbol at an address; the name shows everywhere."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from binlens.api.edits import EditResult, edit, name_change, original_name, refresh
from binlens.api.models import HexAddress, Params, ProgramRef, Selector
from binlens.api.registry import MUTATION, CallContext, method
from binlens.errors import BinlensError
from binlens.workspace import Program, Workspace

NameText = Annotated[str, Field(min_length=1, max_length=1024)]


class SymbolPatchParams(Params):
    """Rename the address a selector names."""

    program: ProgramRef | None = None
    selector: Selector = Field(description="The address (or current name) to rename.")
    name: NameText | None = Field(description="The new name; null removes the user name (the original shows again).")


class SymbolPatched(EditResult):
    """The name at an address after a rename."""

    address: HexAddress
    name: str | None = Field(description="The name shown at the address now.")
    previous_name: str | None
    original_name: str | None = Field(description="The name from the file or the analysis, without user renames.")


def selected_address(prog: Program, selector: Selector) -> int:
    """The address a selector names (by address, or by a name that resolves)."""
    if selector.name is not None:
        va, target = prog.resolve(selector.name, "/params/selector/name"), "/params/selector/name"
    else:
        va, target = prog.resolve(selector.address or "", "/params/selector/address"), "/params/selector/address"
    return storable(va, target)


def storable(va: int, target: str) -> int:
    """`va`, if annotations can be keyed by it: a 64-bit address (the store keeps those at and above
    2**63 as SQLite's negative integers, `store.database.s64`)."""
    if not 0 <= va < 1 << 64:
        raise BinlensError("invalid_argument", f"{hex(va)} is not a 64-bit address", target=target)
    return va


@method("symbol.patch", effect=MUTATION)
def symbol_patch(ws: Workspace, p: SymbolPatchParams, ctx: CallContext) -> SymbolPatched:
    """Rename the symbol at an address (any address may get a name); a name used elsewhere is a conflict."""
    prog = ws.program(p.program)
    refresh(prog)
    va = selected_address(prog, p.selector)
    previous = prog.name_at(va)
    entry = edit(
        prog,
        ctx,
        "symbol.patch",
        f"rename {hex(va)} to {p.name}" if p.name else f"remove the user name at {hex(va)}",
        lambda conn: [name_change(prog, conn, va, p.name, "/params/name")],
    )
    return SymbolPatched(
        journal_id=entry,
        address=hex(va),
        name=prog.name_at(va),
        previous_name=previous,
        original_name=original_name(prog, va),
    )
