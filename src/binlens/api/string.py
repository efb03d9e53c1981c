"""string.*: strings in the program's data, with how often code and data refer to them."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from binlens.api.analysis import NeedsAnalysis, need_view
from binlens.api.models import HexAddress, Listing, Page, Result, Scan
from binlens.api.pages import page_by_address
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError


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
    regex: str | None = Field(None, max_length=1024, description="Only strings matching this Python regex.")
    encoding: Literal["ascii", "utf-8", "utf-16le"] | None = None
    section: str | None = Field(None, max_length=256, description="Only strings in this section.")
    min_length: int = Field(4, ge=1, le=4096, description="Minimum length in characters.")
    referenced: bool | None = Field(None, description="true: only referenced strings; false: only unreferenced.")
    page: Page = Page()
    scan: Scan = Scan()


@method("string.list", effect=READ_ONLY)
def string_list(ws: Any, p: StringListParams, ctx: CallContext) -> Listing[StringItem]:
    """Strings in address order, filtered by text, regex, encoding, section and length, with reference counts."""
    prog, view = need_view(ws, p, ctx)
    pattern = None
    if p.regex is not None:
        try:
            pattern = re.compile(p.regex)
        except re.error as err:
            raise BinlensError("invalid_argument", f"bad regex: {err}", target="/params/regex") from None
    rows = view.strings()
    keep = []
    for row in rows:
        a, n, enc, text, sec, refs = row
        if len(text) < p.min_length or p.encoding and enc != p.encoding or p.section and sec != p.section:
            continue
        if p.text is not None and p.text not in text:
            continue
        if p.referenced is not None and (refs > 0) != p.referenced:
            continue
        if pattern is not None and not pattern.search(text):
            continue
        keep.append(row)
    out, cursor, report = page_by_address(prog, p, keep, lambda r: r[0], p.page, p.scan)
    items = [
        StringItem(address=hex(a), size=n, length=len(t), encoding=e, text=t, section=s, references=r)
        for a, n, e, t, s, r in out
    ]
    return Listing[StringItem](items=items, next_cursor=cursor, scan=report)
