"""memory_block.* and memory.*: segments/sections, byte reads and byte searches."""

from __future__ import annotations

import base64
import contextlib
import re
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Literal

import regex
from pydantic import Field

from binlens.api._regex_child import scan as scan_window
from binlens.api._regex_pool import SharedBytes, user_regex
from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.models import (
    AddressText,
    HexAddress,
    Listing,
    Page,
    Params,
    ProgramRef,
    Result,
    Scan,
    ScanReport,
    Selector,
    StopReason,
)
from binlens.api.pages import scan_bounds
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.loader import Image
from binlens.workspace import Program, Workspace


class MemoryBlock(Result):
    name: str
    kind: Literal["segment", "section"]
    start: HexAddress
    end: HexAddress
    size: int
    perms: str
    file_offset: int | None
    file_size: int
    content: str | None = Field(None, description="code, data, bss or other (sections only)")


class MemoryBlockListParams(Params):
    program: ProgramRef | None = None
    kind: Literal["segment", "section"] | None = None


class MemoryBlockGetParams(Params):
    program: ProgramRef | None = None
    selector: Selector = Field(description="An address inside the block, or the block's name.")


def blocks(prog: Program) -> list[MemoryBlock]:
    """Segments then sections, each in address order."""
    img = prog.image
    out = [
        MemoryBlock(
            name=s.name,
            kind="segment",
            start=hex(s.va),
            end=hex(s.end),
            size=s.vsize,
            perms=s.perms,
            file_offset=s.offset if s.fsize else None,
            file_size=s.fsize,
        )
        for s in sorted(img.segments, key=lambda s: s.va)
    ]
    out += [
        MemoryBlock(
            name=s.name,
            kind="section",
            start=hex(s.va),
            end=hex(s.end),
            size=s.size,
            perms=s.perms,
            file_offset=s.offset if s.fsize else None,
            file_size=s.fsize,
            content=s.kind,
        )
        for s in sorted(img.sections, key=lambda s: s.va)
        if s.size
    ]
    return out


@method("memory_block.list", effect=READ_ONLY)
def memory_block_list(ws: Workspace, p: MemoryBlockListParams) -> Listing[MemoryBlock]:
    """List segments and sections with permissions and file/VA ranges."""
    items = blocks(ws.program(p.program))
    if p.kind:
        items = [b for b in items if b.kind == p.kind]
    return Listing[MemoryBlock](items=items)


@method("memory_block.get", effect=READ_ONLY)
def memory_block_get(ws: Workspace, p: MemoryBlockGetParams) -> MemoryBlock:
    """The section (or segment) containing an address, or a block by name."""
    prog = ws.program(p.program)
    items = blocks(prog)
    if p.selector.name is not None:
        for b in items:
            if b.name == p.selector.name:
                return b
        raise BinlensError(
            "not_found", f"no segment or section named {p.selector.name!r}", target="/params/selector/name"
        )
    va = prog.resolve(p.selector.address or "", "/params/selector/address")
    inside = [b for b in items if int(b.start, 16) <= va < int(b.end, 16)]
    if not inside:
        raise BinlensError("not_found", f"{hex(va)} is in no segment or section", target="/params/selector/address")
    sections = [b for b in inside if b.kind == "section"]
    return min(sections or inside, key=lambda b: b.size)


class MemoryReadParams(Params):
    program: ProgramRef | None = None
    address: AddressText
    length: int = Field(ge=1, le=65536, description="Bytes to read (at most 64 KiB).")
    encoding: Literal["hex", "base64"] = "hex"


class MemoryBytes(Result):
    address: HexAddress
    length: int
    encoding: Literal["hex", "base64"]
    data: str
    file_offset: int | None
    patched: bool = Field(False, description="True when any byte differs from the file (a memory.write patch).")


def read_bytes(prog: Program, va: int, length: int, target: str) -> bytes:
    """Bytes at `va` as the program sees them (patch overlays applied by later layers)."""
    data = prog.image.read(va, length)
    if data is None:
        raise BinlensError("invalid_argument", f"{hex(va)}..{hex(va + length)} is not entirely mapped", target=target)
    return data


@method("memory.read", effect=READ_ONLY)
def memory_read(ws: Workspace, p: MemoryReadParams) -> MemoryBytes:
    """Read up to 64 KiB at an address, as hex or base64 (zeros where a segment has no file bytes)."""
    prog = ws.program(p.program)
    va = prog.resolve(p.address, "/params/address")
    overlay = prog.extensions.get("memory.overlay")
    if overlay is not None:
        data, patched = overlay(prog, va, p.length)
    else:
        data, patched = read_bytes(prog, va, p.length, "/params/address"), False
    text = data.hex() if p.encoding == "hex" else base64.b64encode(data).decode()
    return MemoryBytes(
        address=hex(va),
        length=len(data),
        encoding=p.encoding,
        data=text,
        file_offset=prog.image.va_to_offset(va),
        patched=patched,
    )


class MemorySearchParams(Params):
    program: ProgramRef | None = None
    pattern: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        None, description="Hex bytes with '??' wildcards, e.g. '48 8b ?? 10'."
    )
    regex: Annotated[str, Field(min_length=1, max_length=512)] | None = Field(
        None, description="A Python regular expression over bytes (latin-1 text)."
    )
    page: Page = Page()
    scan: Scan = Scan()


class SearchHit(Result):
    address: HexAddress
    length: int
    data: str = Field(description="The matched bytes, hex (at most 64).")
    section: str | None


USER_FLAGS = regex.DOTALL | regex.VERSION0  # a client regex: `.` matches any byte, `re` syntax


def compile_pattern(p: MemorySearchParams) -> regex.Pattern[bytes]:
    """A bytes regex from a hex/wildcard pattern or a client regex."""
    if (p.pattern is None) == (p.regex is None):
        raise BinlensError("invalid_argument", "give exactly one of 'pattern' or 'regex'", target="/params/pattern")
    if p.pattern is not None:
        tokens = p.pattern.replace(",", " ").split()
        if len(tokens) == 1 and len(tokens[0]) > 2:
            text = tokens[0]
            tokens = [text[i : i + 2] for i in range(0, len(text), 2)]
        parts = []
        for tok in tokens:
            if tok in ("??", "?"):
                parts.append(b".")
            elif re.fullmatch(r"[0-9a-fA-F]{2}", tok):
                parts.append(re.escape(bytes.fromhex(tok)))
            else:
                raise BinlensError(
                    "invalid_argument", f"bad pattern token {tok!r}: use hex bytes and '??'", target="/params/pattern"
                )
        return regex.compile(b"".join(parts), regex.DOTALL)
    assert p.regex is not None  # exactly one of the two is given
    try:
        return regex.compile(p.regex.encode("latin-1"), USER_FLAGS)
    except (regex.error, UnicodeEncodeError) as err:
        raise BinlensError("invalid_argument", f"bad regex: {err}", target="/params/regex") from None


# Chunks bound the latency of progress and of the deadline checks between them; a client's regex
# runs in a killable process (`_regex_pool`), which also stops it inside a chunk. A chunk that
# went quickly doubles the next one (up to MAX_CHUNK: fewer round trips to that process), a slow
# one halves it, so a slow pattern still gets through a chunk within a short deadline.
CHUNK = 1 << 16
MAX_CHUNK = 1 << 20
OVERLAP = 4096  # a match crossing a chunk's end is found from the chunk it starts in

# (file offset, length, stop, want, deadline) -> matches, or None past the deadline
Find = Callable[[int, int, int, int, float], "list[tuple[int, int, bytes]] | None"]


@contextlib.contextmanager
def _finder(p: MemorySearchParams, prog: Program, rx: regex.Pattern[bytes], ctx: CallContext) -> Iterator[Find]:
    """How a window is searched: a hex pattern (no repetition, linear) here, a client regex in a child."""
    data = prog.image.data
    if p.regex is None:
        yield lambda off, n, stop, want, _deadline: scan_window(rx, data[off : off + n], stop, want)
        return
    shared = prog.extensions.get("memory.shared_bytes")
    if shared is None:
        shared = prog.extensions["memory.shared_bytes"] = SharedBytes(data)
    with user_regex(p.regex.encode("latin-1"), USER_FLAGS, ctx) as user:
        yield lambda off, n, stop, want, deadline: user.find(shared, off, n, stop, want, deadline)


@method("memory.search", effect=READ_ONLY, long_running=True)
def memory_search(ws: Workspace, p: MemorySearchParams, ctx: CallContext) -> Listing[SearchHit]:
    """Search file-backed bytes for a hex pattern (with ?? wildcards) or a bytes regex, in address order."""
    prog = ws.program(p.program)
    rx = compile_pattern(p)
    start, end = scan_bounds(prog, p.scan)
    qkey = query_key(p)
    pos = decode_cursor(p.page.cursor, prog, qkey)
    cur = max(start, int(pos, 16)) if pos else start
    with _finder(p, prog, rx, ctx) as find:
        deadline = time.monotonic() + p.scan.timeout_ms / 1000  # (from when the regex process is ready)
        hits, stop, resume = _search(prog.image, find, cur, end, p.page.limit, deadline, ctx)
    cursor = encode_cursor(prog, qkey, hex(resume)) if resume is not None else None
    report = ScanReport(
        complete=resume is None,
        stop_reason=stop,
        scanned_to=hex(resume) if resume is not None else None,
    )
    return Listing[SearchHit](items=hits, next_cursor=cursor, scan=report)


def _search(
    img: Image, find: Find, cur: int, end: int, limit: int, deadline: float, ctx: CallContext
) -> tuple[list[SearchHit], StopReason, int | None]:
    """Hits from `cur` to `end` chunk by chunk: (hits, stop reason, resume address or None)."""
    hits: list[SearchHit] = []
    size = CHUNK
    total = sum(max(0, min(end, r.va + r.fsize) - max(cur, r.va)) for r in img.regions)
    done = 0
    for region in img.regions:
        chunk_start, r_end = max(cur, region.va), min(end, region.va + region.fsize)
        while chunk_start < r_end:
            if time.monotonic() > deadline:
                return hits, "timeout", chunk_start
            ctx.progress(done, total, f"searched {done} of {total} bytes")  # also honours cancellation
            chunk_end = min(r_end, chunk_start + size)
            done += chunk_end - chunk_start
            off = region.offset + (chunk_start - region.va)
            began = time.monotonic()
            n = chunk_end - chunk_start
            found = find(off, n + OVERLAP, n, limit - len(hits) + 1, deadline)
            if found is None:
                return hits, "timeout", chunk_start
            size = _next_size(size, time.monotonic() - began)
            for m_start, m_end, m_bytes in found:
                va = chunk_start + m_start
                if len(hits) == limit:
                    return hits, "limit", va
                sec = img.section_at(va)
                hits.append(
                    SearchHit(
                        address=hex(va),
                        length=m_end - m_start,
                        data=m_bytes.hex(),
                        section=sec.name if sec else None,
                    )
                )
            chunk_start = chunk_end
    return hits, "range_end", None


def _next_size(size: int, took_s: float) -> int:
    """The next chunk's size after one of `size` bytes took `took_s` seconds."""
    if took_s < 0.02:
        return min(MAX_CHUNK, size * 2)
    if took_s > 0.1:
        return max(CHUNK, size // 2)
    return size
