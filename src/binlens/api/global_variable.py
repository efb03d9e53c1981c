"""global_variable.*: typed data at an address, its value decoded from the (patched) bytes."""

from __future__ import annotations

import sqlite3
from typing import Annotated, Any

from pydantic import Field

from binlens.api.edits import EditResult, edit, name_change, overlay, parse_type, refresh, store, types
from binlens.api.models import HexAddress, Listing, Page, Params, ProgramRef, Result, Scan, Selector
from binlens.api.pages import page_by_address
from binlens.api.registry import DESTRUCTIVE, MUTATION, READ_ONLY, CallContext, method
from binlens.api.symbol_edit import selected_address
from binlens.cdecl import DeclarationError
from binlens.cdecl.decode import decode
from binlens.errors import BinlensError
from binlens.store.annotations import Change, globals_near
from binlens.workspace import Program, Workspace

TypeText = Annotated[str, Field(min_length=1, max_length=1024, description="A C type name: 'int', 'char [16]'.")]
NameText = Annotated[str, Field(min_length=1, max_length=1024)]
MAX_GLOBAL = 1 << 20


class GlobalItem(Result):
    """A typed global and its decoded value."""

    address: HexAddress
    name: str | None
    type: str
    size: int
    section: str | None
    value: Any = Field(description="The bytes decoded through the type (patches applied); null if unreadable.")
    patched: bool = False


class GlobalEdited(EditResult):
    """A global after an edit (null after a delete)."""

    global_variable: GlobalItem | None


class GlobalRef(Params):
    """The global at an address."""

    program: ProgramRef | None = None
    selector: Selector


class GlobalWrite(GlobalRef):
    """Type (and optionally name) the data at an address."""

    type: TypeText
    name: NameText | None = Field(None, description="Also name the address (a rename shown everywhere).")


class GlobalPatch(GlobalRef):
    """A new type and/or name for a global."""

    type: TypeText | None = None
    name: NameText | None = None


class GlobalListParams(Params):
    """Paging and range of global_variable.list."""

    program: ProgramRef | None = None
    page: Page = Page()
    scan: Scan = Scan()


def item(prog: Program, va: int, type_text: str) -> GlobalItem:
    """A global's record with its value decoded now."""
    sec = prog.image.section_at(va)
    try:
        t = types(prog).parse_type_name(type_text)
    except DeclarationError:
        return GlobalItem(address=hex(va), name=prog.name_at(va), type=type_text, size=0, section=None, value=None)
    size = t.size or 0
    value, patched = None, False
    try:
        data, patched = overlay(prog, va, size)
        value = decode(t, data, prog.image.identity.endian)
    except BinlensError:
        pass
    return GlobalItem(
        address=hex(va),
        name=prog.name_at(va),
        type=t.spelling,
        size=size,
        section=sec.name if sec else None,
        value=value,
        patched=patched,
    )


def global_item_at(prog: Program, va: int) -> GlobalItem | None:
    """The user's global starting at `va` with its decoded value, or None (one indexed lookup)."""
    row = store(prog).get(prog.db.connect(), "global", (va,))
    return None if row is None else item(prog, va, row["type"])


def global_at(prog: Program, va: int) -> tuple[str, int] | None:
    """(type, size) of the user's global starting at `va`, for the listing to show its data."""
    row = store(prog).get(prog.db.connect(), "global", (va,))
    if row is None:
        return None
    try:
        t = types(prog).parse_type_name(row["type"])
    except DeclarationError:
        return None
    return t.spelling, t.size or 0


def _write(ws: Workspace, p: GlobalRef, ctx: CallContext, method_name: str, must_exist: bool | None) -> GlobalEdited:
    prog = ws.program(p.program)
    refresh(prog)
    va = selected_address(prog, p.selector)
    type_text: str | None = getattr(p, "type", None)
    new_name: str | None = getattr(p, "name", None)
    spelling, size = None, 0
    if type_text is not None:
        t = parse_type(prog, type_text, "/params/type")
        if t.size is None or t.size == 0 or t.kind == "function":
            raise BinlensError(
                "invalid_argument", f"{t.spelling} has no size; a global needs a complete type", target="/params/type"
            )
        if t.size > MAX_GLOBAL:
            raise BinlensError("invalid_argument", f"{t.spelling} is over {MAX_GLOBAL} bytes", target="/params/type")
        if prog.image.read(va, t.size) is None:
            raise BinlensError(
                "invalid_argument", f"{hex(va)}..{hex(va + t.size)} is not entirely mapped", target="/params/selector"
            )
        spelling, size = t.spelling, t.size

    def plan(conn: sqlite3.Connection) -> list[Change]:
        current = store(prog).get(conn, "global", (va,))
        if must_exist is False and current is not None:
            raise BinlensError("conflict", f"a global is already defined at {hex(va)}", target="/params/selector")
        if must_exist is True and current is None:
            raise BinlensError("not_found", f"no global at {hex(va)}", target="/params/selector")
        changes: list[Change] = []
        if type_text is None and new_name is None and must_exist is not True:
            return changes
        if spelling is not None:
            _no_overlap(prog, conn, va, size)
            changes.append(("global", (va,), {"type": spelling}))
        elif must_exist is True and getattr(p, "type", "absent") == "absent":
            changes.append(("global", (va,), None))  # delete
        if new_name is not None:
            changes.append(name_change(prog, conn, va, new_name, "/params/name"))
        return changes

    entry = edit(prog, ctx, method_name, f"{method_name.split('.')[1]} global at {hex(va)}", plan)
    row = store(prog).get(prog.db.connect(), "global", (va,))
    return GlobalEdited(journal_id=entry, global_variable=item(prog, va, row["type"]) if row else None)


def _no_overlap(prog: Program, conn: sqlite3.Connection, va: int, size: int) -> None:
    for addr, type_text in globals_near(conn, va, size):
        other = global_at(prog, addr)
        osize = other[1] if other else 1
        if addr < va + size and va < addr + osize:
            raise BinlensError(
                "conflict",
                f"{hex(va)}..{hex(va + size)} overlaps the global at {hex(addr)} ({type_text})",
                target="/params/selector",
                details={"address": hex(addr)},
            )


@method("global_variable.get", effect=READ_ONLY)
def global_variable_get(ws: Workspace, p: GlobalRef) -> GlobalItem:
    """A typed global: name, type, size and its value decoded from the bytes."""
    prog = ws.program(p.program)
    refresh(prog)
    va = selected_address(prog, p.selector)
    row = store(prog).get(prog.db.connect(), "global", (va,))
    if row is None:
        raise BinlensError(
            "not_found", f"no global at {hex(va)} (type one with global_variable.create)", target="/params/selector"
        )
    return item(prog, va, row["type"])


@method("global_variable.list", effect=READ_ONLY)
def global_variable_list(ws: Workspace, p: GlobalListParams) -> Listing[GlobalItem]:
    """List the user's typed globals in address order with their values."""
    prog = ws.program(p.program)
    refresh(prog)
    rows = store(prog).rows("global")
    keys = [(k[0], v["type"]) for k, v in rows]
    pagekeys, cursor, report = page_by_address(prog, p, keys, lambda kv: kv[0], p.page, p.scan)
    return Listing[GlobalItem](items=[item(prog, va, t) for va, t in pagekeys], next_cursor=cursor, scan=report)


@method("global_variable.create", effect=MUTATION)
def global_variable_create(ws: Workspace, p: GlobalWrite, ctx: CallContext) -> GlobalEdited:
    """Type the data at an address (and optionally name it); `conflict` if a global is there or overlaps."""
    return _write(ws, p, ctx, "global_variable.create", False)


@method("global_variable.upsert", effect=MUTATION)
def global_variable_upsert(ws: Workspace, p: GlobalWrite, ctx: CallContext) -> GlobalEdited:
    """Type the data at an address, replacing any global there."""
    return _write(ws, p, ctx, "global_variable.upsert", None)


@method("global_variable.patch", effect=MUTATION)
def global_variable_patch(ws: Workspace, p: GlobalPatch, ctx: CallContext) -> GlobalEdited:
    """Change a global's type and/or name; `not_found` if there is no global at the address."""
    if p.type is None and p.name is None:
        raise BinlensError("invalid_argument", "give a new type or name", target="/params")
    return _write(ws, p, ctx, "global_variable.patch", True)


@method("global_variable.delete", effect=DESTRUCTIVE)
def global_variable_delete(ws: Workspace, p: GlobalRef, ctx: CallContext) -> GlobalEdited:
    """Remove a global's type (a name given to the address stays; clear it with symbol.patch)."""
    return _write(ws, p, ctx, "global_variable.delete", True)
