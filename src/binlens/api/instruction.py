"""instruction.* and listing.*: decoded instructions and the rendered disassembly people read."""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from pydantic import Field

from binlens.analysis import Instruction, make_backend
from binlens.analysis.codemap import CodeMap
from binlens.api.analysis import NeedsAnalysis, need_view, select_address, select_function
from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.edits import comments_in
from binlens.api.function_edit import load_prototype, render_prototype
from binlens.api.global_variable import global_item_at
from binlens.api.models import AddressRange, HexAddress, Listing, Page, Result, Scan, ScanReport, Selector, StopReason
from binlens.api.pages import scan_bounds
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import function_name, name_for_address
from binlens.store.analysis import AnalysisView
from binlens.workspace import Program, Workspace


class InstructionItem(Result):
    address: HexAddress
    size: int
    bytes: str = Field(description="Hex bytes.")
    mnemonic: str
    operands: str
    flow: str = Field(
        description="fallthrough, jump, conditional, call, return, indirect_jump, indirect_call, stop; "
        "data: bytes that do not decode (mnemonic `.byte`), listed so a linear decode covers its whole range"
    )
    targets: list[HexAddress] = Field(description="Direct branch or call targets.")
    refs: list[HexAddress] = Field(description="Memory references and immediates that may be addresses.")
    function: HexAddress | None = None


class InstructionGetParams(NeedsAnalysis):
    selector: Selector


class InstructionListParams(NeedsAnalysis):
    mode: Literal["analysed", "linear"] = Field(
        "analysed", description="analysed: instructions of the engine's blocks; linear: decode the range as code."
    )
    page: Page = Page()
    scan: Scan = Scan()


def decoder(prog: Program) -> Any:
    """The program's decoder for listings (created once per program)."""
    d = prog.extensions.get("analysis.decoder")
    if d is None:
        d = make_backend(prog.image, CodeMap(prog.image))
        prog.extensions["analysis.decoder"] = d
    return d


def thumb_spans(dec: Any, view: AnalysisView, spans: list[tuple[int, int]]) -> None:
    """Tell an ARM decoder which spans are Thumb code (from the functions that own them)."""
    thumb = getattr(dec, "thumb", None)
    if thumb is None:
        return
    for s, _e in spans:
        f = view.function_at(s)
        if f is not None and f.mode == "thumb":
            thumb.add(s)


_WINDOW = 4096  # bytes decoded at a time by `decode_range` (a page rarely needs more)
_MAX_INSN = 16  # the longest instruction of any supported architecture, in bytes


def _data_unit(prog: Program, thumb: bool) -> int:
    """How many bytes an undecodable unit spans: the architecture's instruction alignment."""
    arch = prog.image.identity.arch
    if arch in ("x86", "x86-64"):
        return 1
    if arch == "riscv" or (arch == "arm" and thumb):
        return 2  # (compressed RISC-V and Thumb instructions are 2 bytes)
    return 4


def data_instruction(va: int, data: bytes) -> Instruction:
    """Bytes that do not decode, as a listing item: `.byte 0x06, 0x27`, flow `data`."""
    return Instruction(va, len(data), data, ".byte", ", ".join(f"0x{b:02x}" for b in data), "data")


def _mapped_run(prog: Program, va: int) -> tuple[int, int] | None:
    """The mapped addresses from `va` on, as [start, end) of contiguous regions: at `va` itself when
    it is mapped, else from the next mapped address; None when nothing is mapped at or after it."""
    regions = prog.image.regions
    starts = [r.va for r in regions]
    i = bisect.bisect_right(starts, va) - 1
    if i < 0 or va >= regions[i].va + regions[i].vsize:
        i += 1
        if i >= len(regions):
            return None
        va = regions[i].va
    end = regions[i].va + regions[i].vsize
    while i + 1 < len(regions) and regions[i + 1].va <= end:
        i += 1
        end = max(end, regions[i].va + regions[i].vsize)
    return va, end


def decode_range(prog: Program, dec: Any, start: int, end: int) -> Iterator[Instruction]:
    """Every byte of [start, end) in address order, decoded lazily a window at a time: instructions
    where the bytes decode, a `data` item (`data_instruction`, one alignment unit) where they do not,
    after which decoding resumes at the next unit. Unmapped addresses have no bytes and no items."""
    arm = prog.image.identity.arch == "arm"
    thumb = start in getattr(dec, "thumb", ()) or bool(arm and start & 1)
    if arm:
        start &= ~1
    unit = _data_unit(prog, thumb)
    cur = start
    while cur < end:
        run = _mapped_run(prog, cur)
        if run is None or run[0] >= end:
            return
        cur = max(cur, run[0])
        limit = min(end, run[1])
        while cur < limit:
            hi = min(limit, cur + _WINDOW)
            insns = dec.instructions(cur | 1 if thumb else cur, hi)
            for ins in insns:
                if ins.address < cur or ins.address + ins.size > hi:
                    continue
                yield ins
                cur = ins.address + ins.size
            if cur >= limit:
                break
            if hi < limit and hi - cur < _MAX_INSN:
                continue  # the window may have cut an instruction: decode on from `cur` in the next
            n = min(unit, limit - cur)
            yield data_instruction(cur, prog.image.read(cur, n) or bytes(n))
            cur += n


def instruction_item(ins: Instruction, fn: int | None) -> InstructionItem:
    return InstructionItem(
        address=hex(ins.address),
        size=ins.size,
        bytes=ins.bytes.hex(),
        mnemonic=ins.mnemonic,
        operands=ins.operands,
        flow=ins.flow,
        targets=[hex(t) for t in ins.targets],
        refs=[hex(r) for r in ins.refs],
        function=hex(fn) if fn is not None else None,
    )


@method("instruction.get", effect=READ_ONLY)
def instruction_get(ws: Workspace, p: InstructionGetParams, ctx: CallContext) -> InstructionItem:
    """The instruction at an address: bytes, text, flow kind, targets and address-like operands."""
    prog, view = need_view(ws, p, ctx)
    va, target = select_address(prog, p.selector)
    dec = decoder(prog)
    thumb_spans(dec, view, [(va, va + 16)])
    insns = dec.instructions(va, va + 16)
    if not insns or insns[0].address != va:
        raise BinlensError("not_found", f"no decodable instruction at {hex(va)}", target=target)
    f = view.function_at(va)
    return instruction_item(insns[0], f.address if f else None)


@method("instruction.list", effect=READ_ONLY, long_running=True)
def instruction_list(ws: Workspace, p: InstructionListParams, ctx: CallContext) -> Listing[InstructionItem]:
    """Instructions in address order over a range (the analysed blocks, or a linear decode), with a cursor."""
    prog, view = need_view(ws, p, ctx)
    start, end = scan_bounds(prog, p.scan)
    qkey = query_key(p)
    pos = decode_cursor(p.page.cursor, prog, qkey)
    cur = max(start, int(pos, 16)) if isinstance(pos, str) else start
    deadline = time.monotonic() + p.scan.timeout_ms / 1000
    dec = decoder(prog)
    out: list[InstructionItem] = []
    stop: StopReason = "range_end"
    nxt: int | None = None
    if p.mode == "linear":
        if p.scan.range is None:
            raise BinlensError("invalid_argument", "a linear decode needs scan.range", target="/params/scan/range")
        spans = [(cur, end)]
    else:
        spans = _merged(view.blocks_in(_block_floor(view, cur), end))
    thumb_spans(dec, view, spans)
    for s, e in spans:
        if e <= cur:
            continue
        if s < cur and getattr(dec, "thumb", None) is not None and s in dec.thumb:
            dec.thumb.add(cur)
        for ins in decode_range(prog, dec, s, min(e, end)):
            if ins.address < cur:
                continue
            if len(out) >= p.page.limit:
                stop, nxt = "limit", ins.address
                break
            if time.monotonic() > deadline:
                stop, nxt = "timeout", ins.address
                break
            f = view.function_at(ins.address) if p.mode == "linear" else None
            out.append(instruction_item(ins, f.address if f else _fn_of(view, ins.address)))
            cur = ins.address + ins.size
        if nxt is not None:
            break
        ctx.check_cancelled()
    cursor = encode_cursor(prog, qkey, hex(nxt)) if nxt is not None else None
    report = ScanReport(complete=nxt is None, stop_reason=stop, scanned_to=hex(nxt) if nxt is not None else None)
    return Listing[InstructionItem](items=out, next_cursor=cursor, scan=report)


def _block_floor(view: AnalysisView, va: int) -> int:
    b = view.block_at(va)
    return b[1] if b else va


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _fn_of(view: AnalysisView, va: int) -> int | None:
    f = view.function_at(va)
    return f.address if f else None


# ---------------------------------------------------------------------------- listing.get
LISTING_MAX_BYTES = 32768  # the text of one listing.get page by default (~8k tokens)


class ListingParams(NeedsAnalysis):
    selector: Selector | None = Field(default=None, description="A function (by entry, inner address or name).")
    range: AddressRange | None = Field(default=None, description="Or an address range, decoded linearly.")
    format: Literal["text", "lines", "both"] = Field(
        default="text", description="text: the listing as text; lines: as structured lines instead; both: the two."
    )
    offset: int = Field(
        default=0, ge=0, description="Byte offset into the listing's text: a previous page's next_offset."
    )
    max_bytes: int = Field(
        default=LISTING_MAX_BYTES, ge=256, le=1 << 24, description="At most this many bytes of text per call."
    )
    max_instructions: int = Field(default=20000, ge=1, le=20000, description="Stop the listing after this many.")


class ListingLine(Result):
    address: HexAddress
    kind: Literal["label", "comment", "instruction", "data"] = Field(
        description="label: a function or block start; comment: a user plate/pre comment, a prototype, or "
        "(range listings) the function the lines that follow are in; data: bytes that do not decode as an "
        "instruction, as `.byte 0xNN` (one alignment unit a line)"
    )
    text: str
    bytes: str | None = None
    comment: str | None = None
    function: HexAddress | None = Field(
        default=None,
        description="Range listings: the function this line is in (absent outside functions).",
        exclude_if=lambda v: v is None,
    )


class ListingResult(Result):
    start: HexAddress
    end: HexAddress
    function: HexAddress | None = None
    function_name: str | None = None
    text: str | None = Field(
        default=None,
        description="This page of the listing as text (format text or both).",
        exclude_if=lambda v: v is None,
    )
    lines: list[ListingLine] | None = Field(
        default=None,
        description="The lines whose text starts in this page (format lines or both).",
        exclude_if=lambda v: v is None,
    )
    offset: int = Field(description="Byte offset of this page in the listing's text.")
    next_offset: int | None = Field(description="Where the next page starts; null at the end.")
    fragment: bool = Field(description="True when this page is not the whole listing.")
    truncated: bool = Field(description="The listing stopped at max_instructions.")


class _StringIndex:
    """The program's strings by address, to name a reference to a string or into its tail."""

    def __init__(self, view: AnalysisView) -> None:
        rows = view.strings()
        self.text = {a: t for a, _n, _e, t, _s, _r in rows}
        self.starts = [a for a, _n, _e, _t, _s, _r in rows]
        self.rows = rows

    def at(self, prog: Program, va: int) -> str | None:
        """The string that starts at `va`, or the tail of the string `va` points into (linkers share
        one string's tail between strings that end alike)."""
        whole = self.text.get(va)
        if whole is not None:
            return whole
        i = bisect.bisect_right(self.starts, va) - 1
        if i < 0:
            return None
        start, size, enc, _t, _s, _r = self.rows[i]
        if va >= start + size or (enc == "utf-16le" and (va - start) % 2):
            return None
        raw = prog.image.read(va, start + size - va) or b""
        return raw.decode("utf-16le" if enc == "utf-16le" else "utf-8", "replace") or None


def _strings(prog: Program, view: AnalysisView) -> _StringIndex:
    key = "analysis.string_index"
    cached = prog.extensions.get(key)
    if cached is None or cached[0] is not view:
        cached = (view, _StringIndex(view))
        prog.extensions[key] = cached
    return cached[1]


def _quote(text: str, limit: int = 60) -> str:
    t = text.encode("unicode_escape").decode("ascii")
    return '"' + (t if len(t) <= limit else t[:limit] + "...") + '"'


@method("listing.get", effect=READ_ONLY)
def listing_get(ws: Workspace, p: ListingParams, ctx: CallContext) -> ListingResult:
    """Disassembly of a function or range as text, paged by byte offset, with names and string comments."""
    prog, view = need_view(ws, p, ctx)
    if (p.selector is None) == (p.range is None):
        raise BinlensError("invalid_argument", "give exactly one of 'selector' or 'range'", target="/params/selector")
    fn = None
    if p.selector is not None:
        fn = select_function(prog, view, p.selector)
        spans = [(s, e) for s, e, _n, _t in view.blocks(fn.address)]
        labels = {s for s, _e in spans}
    else:
        assert p.range is not None
        s0 = prog.resolve(p.range.start, "/params/range/start")
        e0 = prog.resolve(p.range.end, "/params/range/end")
        if e0 <= s0:
            raise BinlensError("invalid_argument", "range.end must be above range.start", target="/params/range/end")
        spans = [(s0, e0)]
        labels = {s for s, _e in view.blocks_in(s0, e0)}
    merged = _merged(spans)
    start = spans[0][0] if spans else 0
    end = max((e for _s, e in spans), default=start)
    layout = RowLayout(address_width=len(hex(end)))
    # The text is rendered from the start on each call (so every page is cut from the same text)
    # and only as far as this page needs: one byte past its end tells whether more follows.
    want = p.offset + p.max_bytes + 1
    body = bytearray()
    page_lines: list[tuple[int, ListingLine]] = []  # (where its text starts, line)
    truncated = False
    for line in _listing_lines(prog, view, merged, labels, p.max_instructions, ranged=fn is None):
        if line is None:
            truncated = True
            break
        at = len(body)
        row = render_row(line, layout)
        body += row.encode()
        if p.format != "text" and p.offset <= at < p.offset + p.max_bytes:
            page_lines.append((at, line))
            ctx.charge(len(row) + 64)
        if len(body) >= want:
            break
        ctx.check_cancelled()
    if p.offset > len(body) or (p.offset < len(body) and body[p.offset] & 0xC0 == 0x80):
        raise BinlensError(
            "invalid_argument",
            f"offset {p.offset} is not a character boundary within this listing's {len(body)} bytes of text",
            target="/params/offset",
        )
    cut, next_offset = _page_cut(body, p.offset, p.max_bytes)
    text = body[p.offset : cut].decode() if p.format != "lines" else None
    if text is not None:
        ctx.charge(len(text))
    return ListingResult(
        start=hex(start),
        end=hex(end),
        function=hex(fn.address) if fn else None,
        function_name=function_name(prog, fn) if fn else None,
        text=text,
        lines=[ln for at, ln in page_lines if at < cut] if p.format != "text" else None,
        offset=p.offset,
        next_offset=next_offset,
        fragment=p.offset > 0 or next_offset is not None,
        truncated=truncated,
    )


def _page_cut(body: bytearray | bytes, offset: int, max_bytes: int) -> tuple[int, int | None]:
    """Where a page of at most `max_bytes` from `offset` ends, and the next page's offset (None at the
    end): after the page's last newline when it has one, else at a UTF-8 character boundary."""
    if len(body) - offset <= max_bytes:
        return len(body), None
    cut = offset + max_bytes
    nl = body.rfind(b"\n", offset, cut)
    if nl >= offset:
        cut = nl + 1
    else:
        while cut > offset + 1 and body[cut] & 0xC0 == 0x80:  # not inside a UTF-8 sequence
            cut -= 1
    return cut, cut


def _listing_lines(
    prog: Program,
    view: AnalysisView,
    merged: list[tuple[int, int]],
    labels: set[int],
    max_instructions: int,
    *,
    ranged: bool,
) -> Iterator[ListingLine | None]:
    """Each line of the listing in order; None once `max_instructions` is reached (and it stops).

    `ranged` (an address range, not a function): every line carries its function, and a comment
    line names the function whenever the lines enter one other than at its entry label."""
    strings = _strings(prog, view)
    dec = decoder(prog)
    thumb_spans(dec, view, merged)
    notes = comments_in(prog, merged[0][0], max(e for _s, e in merged)) if merged else {}
    stored = _stored_refs(view, merged)
    count = 0
    current: int | None | bool = False  # range listings: the previous line's function (False: no line yet)
    for s, e in merged:
        for ins in decode_range(prog, dec, s, e):
            va = ins.address
            if count >= max_instructions:
                yield None
                return
            owner = _fn_of(view, va) if ranged else None
            fn_hex = hex(owner) if owner is not None else None
            user = notes.get(va, {})
            f = view.by_address.get(va)
            if ranged and owner != current and f is None:
                where = f"in {_function_label(prog, view, owner)}" if owner is not None else "not in a function"
                yield ListingLine(address=hex(va), kind="comment", text=where, function=fn_hex)
            current = owner
            if va in labels or f is not None:
                for h in _header_lines(prog, va, user.get("plate"), f is not None):
                    yield h.model_copy(update={"function": fn_hex})
                label = function_name(prog, f) if f else f"loc_{va:x}"
                yield ListingLine(address=hex(va), kind="label", text=label + ":", function=fn_hex)
            elif "plate" in user:
                for h in _header_lines(prog, va, user["plate"], False):
                    yield h.model_copy(update={"function": fn_hex})
            for t in user.get("pre", "").splitlines():
                yield ListingLine(address=hex(va), kind="comment", text=t, function=fn_hex)
            text, comment = _render(prog, view, ins, strings, stored.get(va, ()))
            if "eol" in user:
                comment = user["eol"] + (f"; {comment}" if comment else "")
            kind: Literal["instruction", "data"] = "data" if ins.flow == "data" else "instruction"
            yield ListingLine(
                address=hex(va), kind=kind, text=text, bytes=ins.bytes.hex(), comment=comment, function=fn_hex
            )
            count += 1


def _function_label(prog: Program, view: AnalysisView, address: int) -> str:
    f = view.by_address.get(address)
    return function_name(prog, f) if f is not None else f"sub_{address:x}"


def _header_lines(prog: Program, va: int, plate: str | None, is_function: bool) -> list[ListingLine]:
    """A plate comment and, for a function, its user prototype, as comment lines before the label."""
    out = [ListingLine(address=hex(va), kind="comment", text=t) for t in (plate or "").splitlines()]
    if is_function:
        proto = render_prototype(prog, va, load_prototype(prog, va))
        if proto is not None:
            out.append(ListingLine(address=hex(va), kind="comment", text=proto.declaration))
    return out


def _data_note(prog: Program, va: int) -> str | None:
    """How a reference to a typed global reads: `name: type = value` (its bytes decoded through the type)."""
    g = global_item_at(prog, va)
    if g is None:
        return None
    value = json.dumps(g.value, separators=(",", ":")) if g.value is not None else "?"
    if len(value) > 80:
        value = value[:77] + "..."
    return f"{g.name or hex(va)}: {g.type} = {value}"


def _stored_refs(view: AnalysisView, spans: list[tuple[int, int]]) -> dict[int, list[int]]:
    """Instruction address -> the addresses the analysis found it references (the data that
    instruction pairs form on AArch64, ARM, MIPS, PowerPC and RISC-V, and calls through GOT slots:
    what the decoder alone cannot see in one instruction)."""
    out: dict[int, list[int]] = {}
    for s, e in spans:
        for src, dst, _kind, _fn in view.xrefs_between(s, e):
            out.setdefault(src, []).append(dst)
    return out


def _render(
    prog: Program, view: AnalysisView, ins: Instruction, strings: _StringIndex, stored: Iterable[int] = ()
) -> tuple[str, str | None]:
    text = f"{ins.mnemonic} {ins.operands}".strip()
    notes = []
    for t in ins.targets:
        name = name_for_address(prog, t)
        if name is None and view.block_at(t) is not None:
            name = f"loc_{t:x}"
        if name:
            text += f" <{name}>"
    refs = list(ins.refs)
    refs += [r for r in stored if r not in refs and r not in ins.targets]
    for r in refs:
        typed = _data_note(prog, r)
        text_at = strings.at(prog, r) if typed is None else None
        if typed is not None:
            notes.append(typed)
        elif text_at is not None:
            notes.append(_quote(text_at))
        else:
            name = name_for_address(prog, r)
            if name:
                notes.append(name)
    return text, "; ".join(notes) if notes else None


class RowLayout:
    """Column widths of a listing's text rows (fixed for a whole listing, so pages line up)."""

    BYTES = 16  # hex digits: instructions of up to 8 bytes keep the text column aligned
    COMMENT = 60  # the column end-of-line comments start at

    def __init__(self, address_width: int = 10) -> None:
        self.address_width = address_width


def render_row(ln: ListingLine, layout: RowLayout) -> str:
    """One listing line as text, newline included: labels flush left, `; comment` lines indented,
    instructions as address, hex bytes, text and an aligned `; comment`."""
    if ln.kind == "label":
        return ln.text + "\n"
    if ln.kind == "comment":
        return f"  ; {ln.text}\n"
    row = f"  {ln.address:>{layout.address_width}}  {ln.bytes or '':<{layout.BYTES}}  {ln.text}"
    if ln.comment:
        row = f"{row:<{layout.COMMENT}}  ; {ln.comment}"
    return row + "\n"


def render_text(lines: list[ListingLine], address_width: int | None = None) -> str:
    """Listing lines as text (the rows of `render_row`)."""
    if address_width is None:
        address_width = max((len(ln.address) for ln in lines), default=10)
    layout = RowLayout(address_width)
    return "".join(render_row(ln, layout) for ln in lines)


# instruction.search lives in its own module; importing it here registers it with its namespace
from binlens.api import instruction_search as _search  # noqa: E402, F401
