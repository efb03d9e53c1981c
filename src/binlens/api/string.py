"""string.*: strings in the program's data, with how often code and data refer to them."""

from __future__ import annotations

import time
from typing import Any, Literal

import regex
from pydantic import Field

from binlens.api._regex_pool import user_regex
from binlens.api.analysis import NeedsAnalysis, need_view
from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.models import HexAddress, Listing, Page, Result, Scan, ScanReport
from binlens.api.pages import page_by_address, scan_bounds
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.workspace import Program, Workspace


class StringItem(Result):
    address: HexAddress
    size: int = Field(description="Bytes, without a terminator.")
    length: int = Field(description="Characters.")
    encoding: str
    text: str
    section: str | None
    references: int


class StringListParams(NeedsAnalysis):
    text: str | None = Field(None, max_length=4096, description="Only strings containing this text.")
    regex: str | None = Field(
        None, max_length=1024, description="Only strings in which this Python regex finds a match."
    )
    encoding: Literal["ascii", "utf-8", "utf-16le"] | None = None
    section: str | None = Field(None, max_length=256, description="Only strings in this section.")
    min_length: int = Field(4, ge=1, le=4096, description="Minimum length in characters.")
    referenced: bool | None = Field(None, description="true: only referenced strings; false: only unreferenced.")
    page: Page = Page()
    scan: Scan = Scan()


# A client regex runs in a killable process (`_regex_pool`), a batch of texts per request.
BATCH_CHARS = 1 << 18
USER_FLAGS = regex.VERSION0  # `re` syntax


@method("string.list", effect=READ_ONLY)
def string_list(ws: Workspace, p: StringListParams, ctx: CallContext) -> Listing[StringItem]:
    """Strings in address order, filtered by text, regex, encoding, section and length, with reference counts."""
    prog, view = need_view(ws, p, ctx)
    pattern = None
    if p.regex is not None:
        try:
            pattern = regex.compile(p.regex, USER_FLAGS)
        except regex.error as err:
            raise BinlensError("invalid_argument", f"bad regex: {err}", target="/params/regex") from None
    keep = [row for row in view.strings() if _wanted(p, row)]
    resume = None
    if pattern is not None:
        keep, resume = _matching(prog, p, keep, ctx)
    out, cursor, report = page_by_address(prog, p, keep, lambda r: r[0], p.page, p.scan)
    if resume is not None:  # the deadline came first: what was found, and where to go on
        cursor = encode_cursor(prog, query_key(p), hex(resume))
        report = ScanReport(complete=False, stop_reason="timeout", scanned_to=hex(resume))
    items = [
        StringItem(address=hex(a), size=n, length=len(t), encoding=e, text=t, section=s, references=r)
        for a, n, e, t, s, r in out
    ]
    return Listing[StringItem](items=items, next_cursor=cursor, scan=report)


def _wanted(p: StringListParams, row: tuple[Any, ...]) -> bool:
    """The filters other than the regex."""
    _a, _n, enc, text, sec, refs = row
    if len(text) < p.min_length or p.encoding and enc != p.encoding or p.section and sec != p.section:
        return False
    if p.text is not None and p.text not in text:
        return False
    return p.referenced is None or (refs > 0) == p.referenced


def _matching(prog: Program, p: StringListParams, rows: list[Any], ctx: CallContext) -> tuple[list[Any], int | None]:
    """The rows of this page's scan the regex finds something in, up to one past the page (so the
    page knows there is more), and the address to resume from when the scan's deadline came first."""
    start, end = scan_bounds(prog, p.scan)
    pos = decode_cursor(p.page.cursor, prog, query_key(p))
    lo = max(start, int(pos, 16)) if pos else start
    rows = [r for r in rows if lo <= r[0] < end]
    found: list[Any] = []
    with user_regex(p.regex or "", USER_FLAGS, ctx) as user:
        deadline = time.monotonic() + p.scan.timeout_ms / 1000  # (from when the regex process is ready)
        i = 0
        while i < len(rows) and len(found) <= p.page.limit:
            batch = _batch(rows, i)
            picked = user.pick([r[3] for r in batch], p.page.limit + 1 - len(found), deadline)
            if picked is None:
                return found, rows[i][0]
            found += [batch[k] for k in picked]
            i += len(batch)
            ctx.progress(i, len(rows), f"matched {i} of {len(rows)} strings")  # also honours cancellation
    return found, None


def _batch(rows: list[Any], i: int) -> list[Any]:
    """Rows from `i` holding about BATCH_CHARS of text (at least one)."""
    size, j = 0, i
    while j < len(rows) and (j == i or size < BATCH_CHARS):
        size += len(rows[j][3])
        j += 1
    return rows[i:j]
