"""Paging over address-ordered and plain lists, with cursors bound to program and query."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel

from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.models import Page, Scan, ScanReport
from binlens.errors import BinlensError
from binlens.workspace import Program

T = TypeVar("T")


def scan_bounds(prog: Program, scan: Scan | None) -> tuple[int, int]:
    """The [start, end) addresses a scan covers (the whole address space by default)."""
    if scan is None or scan.range is None:
        return 0, 1 << 64
    start = prog.resolve(scan.range.start, "/params/scan/range/start")
    end = prog.resolve(scan.range.end, "/params/scan/range/end")
    if end <= start:
        raise BinlensError("invalid_argument", "scan.range.end must be above start", target="/params/scan/range/end")
    return start, end


def page_by_address(
    prog: Program,
    params: BaseModel,
    items: Sequence[T],
    address_of: Callable[[T], int],
    page: Page,
    scan: Scan | None = None,
) -> tuple[list[T], str | None, ScanReport]:
    """One page of `items` (sorted by address) within the scan range, resuming after the cursor."""
    qkey = query_key(params)
    start, end = scan_bounds(prog, scan)
    pos = decode_cursor(page.cursor, prog, qkey)
    keys = [address_of(x) for x in items]
    i = bisect.bisect_left(keys, max(start, int(pos, 16) if pos else start))
    out: list[T] = []
    while i < len(items) and keys[i] < end and len(out) < page.limit:
        out.append(items[i])
        i += 1
    more = i < len(items) and keys[i] < end
    cursor = encode_cursor(prog, qkey, hex(keys[i])) if more else None
    report = ScanReport(
        complete=not more,
        stop_reason="limit" if more else "range_end",
        scanned_to=hex(keys[i]) if more else None,
    )
    return out, cursor, report


def page_by_offset(prog: Program, params: BaseModel, items: Sequence[T], page: Page) -> tuple[list[T], str | None]:
    """One page of a plain list, by position."""
    qkey = query_key(params)
    pos = decode_cursor(page.cursor, prog, qkey) or 0
    if not isinstance(pos, int) or pos < 0:
        pos = 0
    out = list(items[pos : pos + page.limit])
    nxt = pos + len(out)
    cursor = encode_cursor(prog, qkey, nxt) if nxt < len(items) else None
    return out, cursor
