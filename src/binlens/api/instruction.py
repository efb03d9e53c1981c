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
class ListingParams(NeedsAnalysis):
    selector: Selector | None = Field(None, description="A function (by entry, inner address or name).")
    range: AddressRange | None = Field(None, description="Or an address range, decoded linearly.")
    max_instructions: int = Field(2000, ge=1, le=20000)


class ListingLine(Result):
    address: HexAddress
    kind: Literal["label", "comment", "instruction", "data"] = Field(
        description="label: a function or block start; comment: a user plate/pre comment or prototype line; "
        "data: bytes that do not decode as an instruction, as `.byte 0xNN` (one alignment unit a line)"
    )
    text: str
    bytes: str | None = None
    comment: str | None = None


class ListingResult(Result):
    start: HexAddress
    end: HexAddress
    function: HexAddress | None = None
    function_name: str | None = None
    lines: list[ListingLine]
    truncated: bool
    text: str = Field(description="The listing rendered as text.")


def _strings(prog: Program, view: AnalysisView) -> dict[int, str]:
    key = "analysis.string_index"
    cached = prog.extensions.get(key)
    if cached is None or cached[0] is not view:
        cached = (view, {a: t for a, _n, _e, t, _s, _r in view.strings()})
        prog.extensions[key] = cached
    return cached[1]


def _quote(text: str, limit: int = 60) -> str:
    t = text.encode("unicode_escape").decode("ascii")
    return '"' + (t if len(t) <= limit else t[:limit] + "...") + '"'


@method("listing.get", effect=READ_ONLY)
def listing_get(ws: Workspace, p: ListingParams, ctx: CallContext) -> ListingResult:
    """Disassembly of a function or range with labels, call-target names and string/xref comments."""
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
    strings = _strings(prog, view)
    lines: list[ListingLine] = []
    count = 0
    charged = 0
    truncated = False
    dec = decoder(prog)
    thumb_spans(dec, view, _merged(spans))
    merged = _merged(spans)
    notes = comments_in(prog, merged[0][0], max(e for _s, e in merged)) if merged else {}
    stored = _stored_refs(view, merged)
    for s, e in merged:
        for ins in decode_range(prog, dec, s, e):
            if count >= p.max_instructions:
                truncated = True
                break
            va = ins.address
            user = notes.get(va, {})
            if va in labels or va in view.by_address:
                f = view.by_address.get(va)
                lines += _header_lines(prog, va, user.get("plate"), f is not None)
                label = function_name(prog, f) if f else f"loc_{va:x}"
                lines.append(ListingLine(address=hex(va), kind="label", text=label + ":"))
            elif "plate" in user:
                lines += _header_lines(prog, va, user["plate"], False)
            if "pre" in user:
                lines += [ListingLine(address=hex(va), kind="comment", text=t) for t in user["pre"].splitlines()]
            text, comment = _render(prog, view, ins, strings, stored.get(va, ()))
            if "eol" in user:
                comment = user["eol"] + (f"; {comment}" if comment else "")
            kind: Literal["instruction", "data"] = "data" if ins.flow == "data" else "instruction"
            lines.append(ListingLine(address=hex(va), kind=kind, text=text, bytes=ins.bytes.hex(), comment=comment))
            count += 1
            # Each line is in `lines` and again in `text`: stop once that passes the budget.
            ctx.charge(2 * sum(len(ln.text) + len(ln.comment or "") for ln in lines[charged:]))
            charged = len(lines)
        if truncated:
            break
    start = spans[0][0] if spans else 0
    end = max((e for _s, e in spans), default=start)
    return ListingResult(
        start=hex(start),
        end=hex(end),
        function=hex(fn.address) if fn else None,
        function_name=function_name(prog, fn) if fn else None,
        lines=lines,
        truncated=truncated,
        text=render_text(lines),
    )


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
    prog: Program, view: AnalysisView, ins: Instruction, strings: dict[int, str], stored: Iterable[int] = ()
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
        if typed is not None:
            notes.append(typed)
        elif r in strings:
            notes.append(_quote(strings[r]))
        else:
            name = name_for_address(prog, r)
            if name:
                notes.append(name)
    return text, "; ".join(notes) if notes else None


def render_text(lines: list[ListingLine]) -> str:
    """Listing lines as text: labels flush left, instructions with address and bytes."""
    out = []
    for ln in lines:
        if ln.kind == "label":
            out.append(f"{ln.text}")
            continue
        if ln.kind == "comment":
            out.append(f"  ; {ln.text}")
            continue
        b = (ln.bytes or "")[:20]
        row = f"  {ln.address:>12}  {b:<20}  {ln.text}"
        if ln.comment:
            row = f"{row:<72} ; {ln.comment}"
        out.append(row)
    return "\n".join(out) + "\n"
