"""journal.*: the history of every annotation edit, with undo and redo."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.edits import client_of, database_busy, refresh, store, sync_engine_functions
from binlens.api.models import Listing, Page, Params, ProgramRef, Result
from binlens.api.registry import DESTRUCTIVE, READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.workspace import Workspace

EntryState = Literal["done", "undone", "abandoned"]


class JournalChange(Result):
    """One row's value before and after an edit."""

    kind: str = Field(
        description="name, comment, bookmark, data_type, global, prototype, function, flow_override or patch"
    )
    key: list[Any]
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class JournalEntry(Result):
    """One journaled edit."""

    id: int
    time: str
    client: str
    method: str
    summary: str
    batch: str | None
    state: EntryState = Field(description="done; undone (redo-able); abandoned (undone, then a new edit came)")
    undone_time: str | None = None
    undone_by: str | None = None
    changes: list[JournalChange] | None = None


class JournalListParams(Params):
    """Filters, order and paging of journal.list."""

    program: ProgramRef | None = None
    state: EntryState | None = None
    client: str | None = Field(None, max_length=256, description="Only this client's entries.")
    method: str | None = Field(None, max_length=128, description="Only entries made by this method.")
    batch: str | None = Field(None, max_length=64, description="Only the entries of this batch.")
    newest_first: bool = False
    include_changes: bool = Field(True, description="Include each entry's before/after values.")
    page: Page = Page()


class JournalStepParams(Params):
    """How many edits to undo or redo."""

    program: ProgramRef | None = None
    count: int = Field(1, ge=1, le=1000, description="How many entries to undo or redo.")


class JournalStepped(Result):
    """The entries undone or redone."""

    entries: list[JournalEntry] = Field(description="The entries undone (newest first) or redone (oldest first).")


def _entry(row: dict[str, Any], with_changes: bool) -> JournalEntry:
    data = dict(row)
    changes = data.pop("changes")
    return JournalEntry(**data, changes=[JournalChange(**c) for c in changes] if with_changes else None)


@method("journal.list", effect=READ_ONLY)
def journal_list(ws: Workspace, p: JournalListParams) -> Listing[JournalEntry]:
    """List journal entries (time, client, method, before/after of each change), oldest or newest first."""
    prog = ws.program(p.program)
    pos = decode_cursor(p.page.cursor, prog, query_key(p))
    if pos is not None and not isinstance(pos, int):
        raise BinlensError("invalid_argument", "bad cursor", target="/params/page/cursor")
    filters = {"client": p.client, "method": p.method, "batch": p.batch}
    rows = store(prog).journal(pos, p.page.limit + 1, p.state, p.newest_first, filters)
    more = len(rows) > p.page.limit
    rows = rows[: p.page.limit]
    cursor = encode_cursor(prog, query_key(p), rows[-1]["id"]) if more else None
    return Listing[JournalEntry](items=[_entry(r, p.include_changes) for r in rows], next_cursor=cursor)


def _step(ws: Workspace, p: JournalStepParams, ctx: CallContext, undo: bool) -> JournalStepped:
    prog = ws.program(p.program)
    st = store(prog)
    client = client_of(ctx)
    try:
        with database_busy():
            ids = st.undo(client, p.count) if undo else st.redo(client, p.count)
    finally:
        refresh(prog)
    if not ids:
        raise BinlensError("not_found", "nothing to undo" if undo else "nothing to redo", target="/params/count")
    entries = []
    for i in ids:
        row = st.journal(i - 1, 1)[0]
        entries.append(_entry(row, True))
        sync_engine_functions(prog, row["changes"], "before" if undo else "after")
    return JournalStepped(entries=entries)


@method("journal.undo", effect=DESTRUCTIVE)
def journal_undo(ws: Workspace, p: JournalStepParams, ctx: CallContext) -> JournalStepped:
    """Undo the latest edits (of any client), restoring exactly what was there before; `not_found` if none."""
    return _step(ws, p, ctx, True)


@method("journal.redo", effect=DESTRUCTIVE)
def journal_redo(ws: Workspace, p: JournalStepParams, ctx: CallContext) -> JournalStepped:
    """Redo the edits undone last (until a new edit abandons them); `not_found` if none."""
    return _step(ws, p, ctx, False)
