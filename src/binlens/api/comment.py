"""comment.*: end-of-line, pre and plate comments at addresses."""

from __future__ import annotations

import fnmatch
from typing import Annotated, Literal

from pydantic import Field

from binlens.api.edits import EditResult, put_row, refresh, store
from binlens.api.models import HexAddress, Listing, Page, Params, ProgramRef, Result, Scan, Selector
from binlens.api.pages import page_by_address
from binlens.api.registry import DESTRUCTIVE, MUTATION, READ_ONLY, CallContext, method
from binlens.api.symbol_edit import selected_address
from binlens.errors import BinlensError
from binlens.workspace import Program, Workspace

CommentKind = Literal["eol", "pre", "plate"]
CommentText = Annotated[str, Field(min_length=1, max_length=65536)]


class CommentItem(Result):
    """One comment at an address."""

    address: HexAddress
    kind: CommentKind
    text: str
    name: str | None = Field(None, description="The name at the address, if any.")


class CommentEdited(EditResult):
    """A comment after an edit."""

    comment: CommentItem | None = Field(description="The comment now (null after a delete).")


class CommentRef(Params):
    """One comment: an address and a kind."""

    program: ProgramRef | None = None
    selector: Selector
    kind: CommentKind = Field("eol", description="eol (end of line), pre (above the line) or plate (a header box).")


class CommentWrite(CommentRef):
    """A comment's address, kind and text."""

    text: CommentText


class CommentListParams(Params):
    """Filters and paging of comment.list."""

    program: ProgramRef | None = None
    kind: CommentKind | None = None
    text: str | None = Field(None, max_length=1024, description="Glob on the comment text.")
    page: Page = Page()
    scan: Scan = Scan()


def _item(prog: Program, va: int, kind: CommentKind, text: str) -> CommentItem:
    return CommentItem(address=hex(va), kind=kind, text=text, name=prog.name_at(va))


def _get(prog: Program, va: int, kind: CommentKind) -> CommentItem | None:
    row = store(prog).get(prog.db.connect(), "comment", (va, kind))
    return _item(prog, va, kind, row["text"]) if row else None


@method("comment.get", effect=READ_ONLY)
def comment_get(ws: Workspace, p: CommentRef) -> CommentItem:
    """The comment of one kind at an address."""
    prog = ws.program(p.program)
    refresh(prog)
    va = selected_address(prog, p.selector)
    hit = _get(prog, va, p.kind)
    if hit is None:
        raise BinlensError("not_found", f"no {p.kind} comment at {hex(va)}", target="/params/selector")
    return hit


@method("comment.list", effect=READ_ONLY)
def comment_list(ws: Workspace, p: CommentListParams) -> Listing[CommentItem]:
    """List comments in address order, filtered by kind, text glob and address range."""
    prog = ws.program(p.program)
    refresh(prog)
    items = [
        _item(prog, key[0], key[1], value["text"])
        for key, value in store(prog).rows("comment")
        if (p.kind is None or key[1] == p.kind) and (p.text is None or fnmatch.fnmatchcase(value["text"], p.text))
    ]
    out, cursor, report = page_by_address(prog, p, items, lambda c: int(c.address, 16), p.page, p.scan)
    return Listing[CommentItem](items=out, next_cursor=cursor, scan=report)


def _write(ws: Workspace, p: CommentRef, ctx: CallContext, method_name: str, must_exist: bool | None) -> CommentEdited:
    prog = ws.program(p.program)
    va = selected_address(prog, p.selector)
    text = getattr(p, "text", None)
    entry = put_row(
        prog,
        ctx,
        method_name,
        "comment",
        (va, p.kind),
        {"text": text} if text is not None else None,
        must_exist=must_exist,
        what=f"{p.kind} comment at {hex(va)}",
        target="/params/selector",
    )
    return CommentEdited(journal_id=entry, comment=_get(prog, va, p.kind))


@method("comment.create", effect=MUTATION)
def comment_create(ws: Workspace, p: CommentWrite, ctx: CallContext) -> CommentEdited:
    """Add a comment; `conflict` if that kind of comment is already there."""
    return _write(ws, p, ctx, "comment.create", False)


@method("comment.patch", effect=MUTATION)
def comment_patch(ws: Workspace, p: CommentWrite, ctx: CallContext) -> CommentEdited:
    """Replace the text of an existing comment; `not_found` if there is none."""
    return _write(ws, p, ctx, "comment.patch", True)


@method("comment.upsert", effect=MUTATION)
def comment_upsert(ws: Workspace, p: CommentWrite, ctx: CallContext) -> CommentEdited:
    """Set a comment, creating or replacing it."""
    return _write(ws, p, ctx, "comment.upsert", None)


@method("comment.delete", effect=DESTRUCTIVE)
def comment_delete(ws: Workspace, p: CommentRef, ctx: CallContext) -> CommentEdited:
    """Delete a comment; `not_found` if there is none."""
    return _write(ws, p, ctx, "comment.delete", True)
