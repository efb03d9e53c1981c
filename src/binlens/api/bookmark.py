"""bookmark.*: marked addresses with a category and a note."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from binlens.api.edits import EditResult, put_row, refresh, store
from binlens.api.models import HexAddress, Listing, Page, Params, ProgramRef, Result, Scan, Selector
from binlens.api.pages import page_by_address
from binlens.api.registry import DESTRUCTIVE, MUTATION, READ_ONLY, CallContext, method
from binlens.api.symbol_edit import selected_address
from binlens.workspace import Program, Workspace

Category = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]+$")]


class BookmarkItem(Result):
    """One bookmark: address, category and note."""

    address: HexAddress
    category: str
    note: str
    name: str | None = None


class BookmarkEdited(EditResult):
    """A bookmark after an edit (null after a delete)."""

    bookmark: BookmarkItem | None


class BookmarkRef(Params):
    """One bookmark: an address and a category."""

    program: ProgramRef | None = None
    selector: Selector
    category: Category = Field("note", description="Bookmarks are keyed by address and category.")


class BookmarkCreateParams(BookmarkRef):
    """A new bookmark."""

    note: str = Field("", max_length=65536)


class BookmarkListParams(Params):
    """Filters and paging of bookmark.list."""

    program: ProgramRef | None = None
    category: Category | None = None
    page: Page = Page()
    scan: Scan = Scan()


def _items(prog: Program) -> list[BookmarkItem]:
    return [
        BookmarkItem(address=hex(k[0]), category=k[1], note=v["note"], name=prog.name_at(k[0]))
        for k, v in store(prog).rows("bookmark")
    ]


@method("bookmark.list", effect=READ_ONLY)
def bookmark_list(ws: Workspace, p: BookmarkListParams) -> Listing[BookmarkItem]:
    """List bookmarks in address order, optionally of one category."""
    prog = ws.program(p.program)
    refresh(prog)
    items = [b for b in _items(prog) if p.category is None or b.category == p.category]
    out, cursor, report = page_by_address(prog, p, items, lambda b: int(b.address, 16), p.page, p.scan)
    return Listing[BookmarkItem](items=out, next_cursor=cursor, scan=report)


@method("bookmark.create", effect=MUTATION)
def bookmark_create(ws: Workspace, p: BookmarkCreateParams, ctx: CallContext) -> BookmarkEdited:
    """Bookmark an address in a category; `conflict` if that bookmark exists."""
    prog = ws.program(p.program)
    va = selected_address(prog, p.selector)
    entry = put_row(
        prog,
        ctx,
        "bookmark.create",
        "bookmark",
        (va, p.category),
        {"note": p.note},
        must_exist=False,
        what=f"bookmark {p.category!r} at {hex(va)}",
        target="/params/selector",
    )
    item = BookmarkItem(address=hex(va), category=p.category, note=p.note, name=prog.name_at(va))
    return BookmarkEdited(journal_id=entry, bookmark=item)


@method("bookmark.delete", effect=DESTRUCTIVE)
def bookmark_delete(ws: Workspace, p: BookmarkRef, ctx: CallContext) -> BookmarkEdited:
    """Delete a bookmark; `not_found` if there is none."""
    prog = ws.program(p.program)
    va = selected_address(prog, p.selector)
    entry = put_row(
        prog,
        ctx,
        "bookmark.delete",
        "bookmark",
        (va, p.category),
        None,
        must_exist=True,
        what=f"bookmark {p.category!r} at {hex(va)}",
        target="/params/selector",
    )
    return BookmarkEdited(journal_id=entry, bookmark=None)
