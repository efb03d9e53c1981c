"""instruction.search: the analysed instructions by mnemonic, operand text, immediate value or referenced address.

The search walks the analysis' blocks (as `instruction.list` does) in address order, paged by a
cursor and bounded by `scan.timeout_ms`. On x86 it decodes with iced directly and formats only
what it must: a mnemonic glob is judged once per iced mnemonic (the formatter names one the same
way each time, but for the compare pseudo-ops, whose name comes from their immediate); an
immediate that no 8-bit field can hold is looked for as its low two bytes first, so only the
blocks holding those bytes are decoded; a referenced address takes the sources of the references
the analysis stored. libc.so.6 (314k instructions) is searched whole for one immediate in a few
milliseconds and for every `call` in about 0.3 s.
"""

from __future__ import annotations

import bisect
import fnmatch
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import regex
from pydantic import Field

from binlens.api._regex_pool import user_regex
from binlens.api.analysis import NeedsAnalysis, need_view, select_function
from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.instruction import _merged, decode_range, decoder, thumb_spans
from binlens.api.models import AddressText, HexAddress, Listing, Page, Result, Scan, ScanReport, Selector, StopReason
from binlens.api.pages import scan_bounds
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import function_name
from binlens.store.analysis import AnalysisView
from binlens.workspace import Program, Workspace

_HEX = re.compile(r"^\s*(-?)0[xX]([0-9a-fA-F]{1,16})\s*$")
_NUMBER = re.compile(r"(?<![\w.$])(-?)(0[xX][0-9a-fA-F]+|\d+)\b")  # numbers in a listed operand text
_REGEX_BATCH = 512  # operand texts sent to the regex process at a time
# iced mnemonics named by their immediate (`vpcmpb k1, .., 4` lists as `vpcmpneqb`): judged one by one
_PSEUDO = ("CMPP", "CMPS", "VCMP", "VPCMP", "VPCOM", "PCLMUL", "VPCLMUL")


class InstructionSearchParams(NeedsAnalysis):
    mnemonic: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Glob on the mnemonic, e.g. 'call', 'j*'; with a space it sees the prefixes too ('rep *').",
    )
    operands: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Glob on the operand text as listed, e.g. 'r*' (x86-64: a 64-bit register) or '*rip*'.",
    )
    operands_regex: str | None = Field(
        default=None, min_length=1, max_length=256, description="Python regex searched in the operand text."
    )
    immediate: int | str | None = Field(
        default=None,
        description="A value an operand holds as an immediate or displacement: an integer or hex like "
        "'0x5a827999' or '-0x10' (compared at the operand's width).",
    )
    references: AddressText | None = Field(
        default=None, description="Instructions the analysis records as referencing this address or name."
    )
    selector: Selector | None = Field(default=None, description="Only the instructions of this function.")
    page: Page = Page()
    scan: Scan = Scan()


class SearchHit(Result):
    address: HexAddress
    mnemonic: str
    operands: str
    function: HexAddress | None = Field(
        default=None, description="The function it is in.", exclude_if=lambda v: v is None
    )
    function_name: str | None = Field(default=None, exclude_if=lambda v: v is None)


@dataclass
class _Candidate:
    address: int
    mnemonic: str
    operands: str


def _immediate(value: int | str | None) -> int | None:
    if value is None:
        return None
    target = "/params/immediate"
    if isinstance(value, bool):
        raise BinlensError("invalid_argument", "the immediate is an integer or a hex string", target=target)
    if isinstance(value, str):
        m = _HEX.match(value)
        if m is None:
            raise BinlensError(
                "invalid_argument", f"{value[:40]!r} is not a hex value like '0x5a827999'", target=target
            )
        value = int(m.group(2), 16) * (-1 if m.group(1) else 1)
    if not -(1 << 63) <= value < 1 << 64:
        raise BinlensError("invalid_argument", f"{value} does not fit in 64 bits", target=target)
    return value


def fits(value: int, imm: int, width: int) -> bool:
    """Is `imm` (an operand's bits) `value` at `width` bits, `value` read as unsigned or signed?"""
    if not -(1 << (width - 1)) <= value < 1 << width:
        return False
    mask = (1 << width) - 1
    return (imm & mask) == (value & mask)


def _glob(pattern: str | None) -> Callable[[str], bool] | None:
    if pattern is None:
        return None
    rx = re.compile(fnmatch.translate(pattern.lower()), re.S)
    return lambda text: rx.match(text.lower()) is not None


class _Criteria:
    """The parsed, checked criteria of one search."""

    def __init__(self, prog: Program, view: AnalysisView, p: InstructionSearchParams) -> None:
        self.mnemonic = _glob(p.mnemonic)
        self.prefixed = p.mnemonic is not None and " " in p.mnemonic.strip()  # (the glob sees the prefixes)
        self.operands = _glob(p.operands)
        self.regex = p.operands_regex
        if self.regex is not None:
            try:
                regex.compile(self.regex, regex.VERSION0)
            except regex.error as err:
                raise BinlensError("invalid_argument", f"bad regex: {err}", target="/params/operands_regex") from None
        self.value = _immediate(p.immediate)
        self.sources: set[int] | None = None
        if p.references is not None:
            dst = prog.resolve(p.references, "/params/references")
            self.sources = {src for src, _d, _k, fn in view.xrefs_to(dst) if fn is not None or view.block_at(src)}
        if all(x is None for x in (p.mnemonic, p.operands, p.operands_regex, p.immediate, p.references)):
            raise BinlensError(
                "invalid_argument",
                "give at least one of mnemonic, operands, operands_regex, immediate, references",
                target="/params",
            )

    def text_ok(self, c: _Candidate) -> bool:
        """The mnemonic and operand globs on a decoded instruction's text."""
        if self.mnemonic is not None:
            shown = c.mnemonic if self.prefixed else c.mnemonic.rsplit(" ", 1)[-1]
            if not self.mnemonic(shown):
                return False
        return self.operands is None or self.operands(c.operands)

    def number_ok(self, operands: str, bits: int) -> bool:
        """Any number in a listed operand text (`#0x10`, `-8`) is the immediate (other architectures)."""
        assert self.value is not None
        for m in _NUMBER.finditer(operands):
            n = int(m.group(2), 0) * (-1 if m.group(1) else 1)
            if any(fits(self.value, n, w) for w in {32, bits}) or n == self.value:
                return True
        return False


class _X86:
    """The x86 fast path: iced instructions, formatted only when they may match."""

    def __init__(self, dec: Any, crit: _Criteria) -> None:
        import iced_x86 as ix

        self.ix = ix
        self.dec = dec
        self.fmt = dec.formatter()
        self.crit = crit
        self.bits = dec.bits
        self.names: dict[int, bool] = {}  # iced mnemonic -> the glob's verdict (pseudo-ops: never kept)
        pseudo = {getattr(ix.Mnemonic, n) for n in dir(ix.Mnemonic) if n.startswith(_PSEUDO)}
        self.pseudo = frozenset(pseudo)
        k = ix.OpKind
        b = self.bits
        self.imm_widths = {
            k.IMMEDIATE8: (8,),
            k.IMMEDIATE8_2ND: (8,),
            k.IMMEDIATE16: (16,),
            k.IMMEDIATE32: (32,),
            k.IMMEDIATE64: (64,),
            k.IMMEDIATE8TO16: (16,),
            k.IMMEDIATE8TO32: (32,),
            k.IMMEDIATE8TO64: (64,),
            k.IMMEDIATE32TO64: (32, 64),
        }
        self.disp_widths = (32, b) if b == 64 else (b,)

    def needle(self) -> bytes | None:
        """Bytes every encoding of the immediate holds (its low two), or None when an 8-bit field
        could hold it (an imm8 or disp8, sign-extended or not: then every block is decoded)."""
        v = self.crit.value
        if v is None:
            return None
        low = v & 0xFFFF
        if low <= 0xFF or low >= 0xFF80:
            return None
        return low.to_bytes(2, "little")

    def _mnemonic_ok(self, ins: Any) -> bool:
        crit = self.crit
        assert crit.mnemonic is not None
        if crit.prefixed:
            return crit.mnemonic(self.fmt.format_mnemonic(ins))
        m = ins.mnemonic
        verdict = self.names.get(m)
        if verdict is None:
            ok = crit.mnemonic(self.fmt.format_mnemonic(ins).rsplit(" ", 1)[-1])
            if m not in self.pseudo:
                self.names[m] = ok
            return ok
        return verdict

    def _immediate_ok(self, ins: Any) -> bool:
        value = self.crit.value
        assert value is not None
        memory = self.ix.OpKind.MEMORY
        for i in range(ins.op_count):
            kind = ins.op_kind(i)
            widths = self.imm_widths.get(kind)
            if widths is not None:
                imm = ins.immediate(i)
                if any(fits(value, imm, w) for w in widths):
                    return True
            elif (
                kind == memory
                and ins.memory_displ_size
                and not ins.is_ip_rel_memory_operand  # (its displacement is an address: `references`)
                and any(fits(value, ins.memory_displacement, w) for w in self.disp_widths)
            ):
                return True
        return False

    def candidates(self, s: int, e: int, cur: int) -> Iterator[_Candidate]:
        """The instructions of [s, e) from `cur` on that pass every criterion but the regex."""
        crit = self.crit
        sources = crit.sources
        for ins in self.dec.raw_instructions(s, e):
            va = ins.ip
            if va < cur or ins.code == 0:
                continue
            if sources is not None and va not in sources:
                continue
            if crit.mnemonic is not None and not self._mnemonic_ok(ins):
                continue
            if crit.value is not None and not self._immediate_ok(ins):
                continue
            c = _Candidate(va, self.fmt.format_mnemonic(ins), self.fmt.format_all_operands(ins))
            if crit.operands is None or crit.operands(c.operands):
                yield c


class _Generic:
    """Other architectures: the listing's decode (`decode_range`), matched on its text."""

    def __init__(self, prog: Program, dec: Any, crit: _Criteria) -> None:
        self.prog = prog
        self.dec = dec
        self.crit = crit
        self.bits = prog.image.identity.bits

    def candidates(self, s: int, e: int, cur: int) -> Iterator[_Candidate]:
        crit = self.crit
        for ins in decode_range(self.prog, self.dec, s, e):
            if ins.address < cur or ins.flow == "data":
                continue
            if crit.sources is not None and ins.address not in crit.sources:
                continue
            c = _Candidate(ins.address, ins.mnemonic, ins.operands)
            if not crit.text_ok(c):
                continue
            if crit.value is not None and not crit.number_ok(ins.operands, self.bits):
                continue
            yield c


def _spans(prog: Program, view: AnalysisView, p: InstructionSearchParams, cur: int, end: int) -> list[tuple[int, int]]:
    """The analysed code to search, merged, in address order, up to `end`: the spans that reach
    past `cur`, whole (decoded from their start, so a `cur` inside one keeps instruction bounds)."""
    if p.selector is not None:
        f = select_function(prog, view, p.selector)
        spans = _merged([(s, e) for s, e, _n, _t in view.blocks(f.address)])
    else:
        spans, starts = _all_spans(prog, view)
        i = max(0, bisect.bisect_right(starts, cur) - 1)
        spans = spans[i : bisect.bisect_left(starts, end)]
    return [(s, min(e, end)) for s, e in spans if e > cur and s < end]


def _all_spans(prog: Program, view: AnalysisView) -> tuple[list[tuple[int, int]], list[int]]:
    """Every block of the analysis, merged, and their starts (made once per analysis: 0.1-0.2 s on libc)."""
    cached = prog.extensions.get("instruction.search.spans")
    if cached is None or cached[0] is not view:
        spans = _merged(view.blocks_in(0, 1 << 64))
        cached = (view, spans, [s for s, _e in spans])
        prog.extensions["instruction.search.spans"] = cached
    return cached[1], cached[2]


def _holding(spans: list[tuple[int, int]], addresses: list[int]) -> list[tuple[int, int]]:
    """The spans that hold one of `addresses` (sorted)."""
    out = []
    for s, e in spans:
        i = bisect.bisect_left(addresses, s)
        if i < len(addresses) and addresses[i] < e:
            out.append((s, e))
    return out


def _with_bytes(dec: Any, spans: list[tuple[int, int]], needle: bytes) -> list[tuple[int, int]]:
    """The spans that hold `needle` in their bytes (or lie outside the decoder's code regions)."""
    starts = [s for s, _e in spans]
    keep: set[int] = set()
    inside: set[int] = set()
    for r in dec.codemap.regions:
        lo = bisect.bisect_left(starts, r.va)
        hi = bisect.bisect_left(starts, r.end)
        inside.update(i for i in range(lo, hi) if spans[i][1] <= r.end)
        at = r.data.find(needle)
        while at >= 0:
            va = r.va + at
            i = bisect.bisect_right(starts, va) - 1
            # (an instruction holding the bytes starts in its span at most 15 bytes before them)
            while i >= 0 and spans[i][1] > va - 15:
                if spans[i][0] <= va + 1:
                    keep.add(i)
                i -= 1
            at = r.data.find(needle, at + 1)
    return [sp for i, sp in enumerate(spans) if i in keep or i not in inside]


@method("instruction.search", effect=READ_ONLY, long_running=True)
def instruction_search(ws: Workspace, p: InstructionSearchParams, ctx: CallContext) -> Listing[SearchHit]:
    """Find analysed instructions by mnemonic glob, operand text, immediate value or referenced address."""
    prog, view = need_view(ws, p, ctx)
    crit = _Criteria(prog, view, p)
    start, end = scan_bounds(prog, p.scan)
    qkey = query_key(p)
    pos = decode_cursor(p.page.cursor, prog, qkey)
    cur = max(start, int(pos, 16)) if isinstance(pos, str) else start
    dec = decoder(prog)
    spans = _spans(prog, view, p, cur, end)
    # (from here: the blocks merged above are made once per analysis, the deadline bounds the scan)
    deadline = time.monotonic() + p.scan.timeout_ms / 1000
    if crit.sources is not None:  # (only the blocks holding a reference's source are decoded)
        spans = _holding(spans, sorted(crit.sources))
    search: _X86 | _Generic
    if hasattr(dec, "formatter") and hasattr(dec, "raw_instructions"):
        search = _X86(dec, crit)
        needle = search.needle()
        if needle is not None:
            spans = _with_bytes(dec, spans, needle)
    else:
        search = _Generic(prog, dec, crit)
        thumb_spans(dec, view, spans)
    if crit.regex is None:
        hits, nxt, stop = _collect(search, spans, cur, p.page.limit, deadline, ctx)
    else:
        with user_regex(crit.regex, regex.VERSION0, ctx) as user:
            deadline = time.monotonic() + p.scan.timeout_ms / 1000  # (from when the regex process is ready)
            hits, nxt, stop = _collect(search, spans, cur, p.page.limit, deadline, ctx, user.pick)
    names: dict[int, tuple[str, str] | None] = {}
    items = []
    for c in hits:
        f = view.function_at(c.address)
        if f is not None and f.address not in names:
            names[f.address] = (hex(f.address), function_name(prog, f))
        where = names.get(f.address) if f is not None else None
        items.append(
            SearchHit(
                address=hex(c.address),
                mnemonic=c.mnemonic,
                operands=c.operands,
                function=where[0] if where else None,
                function_name=where[1] if where else None,
            )
        )
        ctx.charge(len(c.mnemonic) + len(c.operands) + 64)
    cursor = encode_cursor(prog, qkey, hex(nxt)) if nxt is not None else None
    report = ScanReport(complete=nxt is None, stop_reason=stop, scanned_to=hex(nxt) if nxt is not None else None)
    return Listing[SearchHit](items=items, next_cursor=cursor, scan=report)


def _collect(
    search: _X86 | _Generic,
    spans: list[tuple[int, int]],
    cur: int,
    limit: int,
    deadline: float,
    ctx: CallContext,
    pick: Callable[[list[str], int, float], list[int] | None] | None = None,
) -> tuple[list[_Candidate], int | None, StopReason]:
    """Up to `limit` hits from `cur` on, where to resume (None: the end) and why the page stopped.

    `pick` (an operand regex): candidates go to the regex process a batch at a time, in order."""
    hits: list[_Candidate] = []
    pending: list[_Candidate] = []

    def flush() -> int | None:
        """Judge the pending candidates; the address to resume from when the deadline came first."""
        assert pick is not None
        chosen = pick([c.operands for c in pending], limit + 1 - len(hits), deadline)
        if chosen is None:
            return pending[0].address
        hits.extend(pending[k] for k in chosen)
        pending.clear()
        return None

    for n, (s, e) in enumerate(spans):
        if time.monotonic() > deadline:
            return hits, (pending[0].address if pending else max(s, cur)), "timeout"
        for c in search.candidates(s, e, cur):
            if pick is None:
                hits.append(c)
            else:
                pending.append(c)
                if len(pending) >= _REGEX_BATCH and (stopped := flush()) is not None:
                    return hits, stopped, "timeout"
            if len(hits) > limit:
                return hits[:limit], hits[limit].address, "limit"
        if n % 256 == 255:
            ctx.check_cancelled()
    if pending and (stopped := flush()) is not None:
        return hits, stopped, "timeout"
    if len(hits) > limit:
        return hits[:limit], hits[limit].address, "limit"
    return hits, None, "range_end"
