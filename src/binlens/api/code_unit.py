"""code_unit.* and data_unit.*: the listing as Ghidra's code units and its defined data.

`code_unit.list` is `instruction.list` in Ghidra's terms: each unit's length, its text, bytes,
flow (with the user's flow override, if any) and the function it is in, named. `data_unit.list`
gives the defined data in address order: the user's typed globals, the strings the analysis
found, pointers stored in data, and the bytes of object symbols no other unit describes (shown
as `.byte` data of the symbol's size). Where units overlap the first kind of that order wins, so
the units never overlap each other.
"""

from __future__ import annotations

import bisect
from typing import Any, Literal

from pydantic import Field

from binlens.api.analysis import NeedsAnalysis, need_view
from binlens.api.edits import refresh, store
from binlens.api.global_variable import item as global_item
from binlens.api.instruction import InstructionListParams, instruction_list
from binlens.api.models import HexAddress, Listing, Page, Result, Scan
from binlens.api.pages import page_by_address
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.jobs.state import name_for_address
from binlens.store.analysis import AnalysisView
from binlens.workspace import Program, Workspace

DataKind = Literal["global", "string", "pointer", "symbol"]
_PRIORITY = {"global": 0, "string": 1, "pointer": 2, "symbol": 3}
_SHOWN_BYTES = 16  # bytes a `.byte` representation spells out before "..."
_VALUE_BYTES = 256  # bytes of a symbol's data given in `value`


class CodeUnit(Result):
    """One code unit: an instruction, or bytes that do not decode (`kind: data`, mnemonic `.byte`)."""

    address: HexAddress
    length: int
    kind: Literal["instruction", "data"]
    mnemonic: str
    operands: str
    bytes: str = Field(description="Hex bytes.")
    flow: str = Field(
        description="fallthrough, jump, conditional, call, return, indirect_jump, indirect_call, stop, data"
    )
    flow_override: str | None = Field(
        default=None, description="The user's flow override here (flow_override.patch).", exclude_if=lambda v: v is None
    )
    function: HexAddress | None = None
    function_name: str | None = None


class CodeUnitListParams(NeedsAnalysis):
    mode: Literal["analysed", "linear"] = Field(
        "analysed", description="analysed: the engine's blocks; linear: every byte of scan.range (needs it)."
    )
    page: Page = Page()
    scan: Scan = Scan()


class DataUnit(Result):
    """One defined data unit."""

    address: HexAddress
    length: int
    kind: DataKind = Field(description="global: typed by the user; string; pointer: an address stored in data; "
                           "symbol: an object symbol's bytes no other unit describes")  # fmt: skip
    type: str = Field(description="A C type for globals; string, unicode, pointer; undefinedN or byte[N] for symbols.")
    value: Any = Field(description="Decoded value: the text, the target address, the global's value, or hex bytes.")
    representation: str = Field(description="How a listing shows it: a quoted string, 'addr (name)', or .byte ...")
    name: str | None = None
    section: str | None = None


class DataUnitListParams(NeedsAnalysis):
    kind: DataKind | None = Field(None, description="Only units of this kind.")
    page: Page = Page()
    scan: Scan = Scan()


# ---------------------------------------------------------------------------- code units
@method("code_unit.list", effect=READ_ONLY, long_running=True)
def code_unit_list(ws: Workspace, p: CodeUnitListParams, ctx: CallContext) -> Listing[CodeUnit]:
    """Code units (instructions, undecodable bytes) in address order with length, flow and function; paged."""
    inner = InstructionListParams(
        program=p.program, wait=p.wait, timeout_ms=p.timeout_ms, mode=p.mode, page=p.page, scan=p.scan
    )
    page = instruction_list(ws, inner, ctx)
    prog = ws.program(p.program)
    refresh(prog)
    overrides = flow_overrides(prog)
    names: dict[int, str | None] = {}
    items = []
    for ins in page.items:
        fn = int(ins.function, 16) if ins.function else None
        if fn is not None and fn not in names:
            names[fn] = name_for_address(prog, fn) or f"sub_{fn:x}"
        items.append(
            CodeUnit(
                address=ins.address,
                length=ins.size,
                kind="data" if ins.flow == "data" else "instruction",
                mnemonic=ins.mnemonic,
                operands=ins.operands,
                bytes=ins.bytes,
                flow=ins.flow,
                flow_override=overrides.get(int(ins.address, 16)),
                function=ins.function,
                function_name=names.get(fn) if fn is not None else None,
            )
        )
    return Listing[CodeUnit](items=items, next_cursor=page.next_cursor, scan=page.scan)


def flow_overrides(prog: Program) -> dict[int, str]:
    """The user's flow overrides by instruction address (type names), reloaded when they change."""
    st = store(prog)
    gen = st.generation("flow_override")
    cached = prog.extensions.get("annotations.flow_overrides")
    if cached is not None and cached[0] == gen:
        return cached[1]
    rows = {key[0]: value["type"] for key, value in st.rows("flow_override")}
    prog.extensions["annotations.flow_overrides"] = (gen, rows)
    return rows


# ---------------------------------------------------------------------------- data units
# a candidate unit: (address, priority, length, kind, extra) with extra the string text,
# the pointer's target, the global's type, or nothing
_Candidate = tuple[int, int, int, str, Any]


def _candidates(prog: Program, view: AnalysisView) -> list[_Candidate]:
    img = prog.image
    out: list[_Candidate] = [
        (k[0], 0, 0, "global", v["type"]) for k, v in store(prog).rows("global")
    ]  # (a global's length comes from its type when it is shown)
    for a, n, enc, text, _sec, _refs in view.strings():
        out.append((a, 1, n, "string", (text, enc)))
    word = img.identity.bits // 8
    texts = {a: text for a, _n, _e, text, _s, _r in view.strings()}
    for sec in img.sections:
        if sec.kind == "code" or not sec.size:
            continue
        for src, dst, kind, _fn in view.xrefs_between(sec.va, sec.end):
            if kind in ("pointer", "string"):
                out.append((src, 2, word, "pointer", (dst, texts.get(dst))))
    for s in img.symbols:
        home = img.section_at(s.address) if s.kind == "object" and s.size else None
        # (in a data section: a TLS symbol's value is an offset in the thread's block, not an address)
        if home is not None and home.kind != "code" and img.is_mapped(s.address):
            out.append((s.address, 3, s.size, "symbol", None))
    out.sort(key=lambda c: (c[0], c[1]))
    return out


def _sweep(prog: Program, cands: list[_Candidate]) -> list[_Candidate]:
    """The candidates that do not start inside an earlier unit (the earlier wins; at one address,
    the kind first in `_PRIORITY`)."""
    from binlens.api.global_variable import global_at

    kept: list[_Candidate] = []
    end = 0
    for c in cands:
        if c[0] < end:
            continue
        if kept and kept[-1][0] == c[0]:
            continue
        length = c[2]
        if c[3] == "global":
            typed = global_at(prog, c[0])
            length = typed[1] if typed else 0
            c = (c[0], c[1], length, c[3], c[4])
        kept.append(c)
        end = c[0] + max(length, 1)
    return kept


def defined_data(prog: Program, view: AnalysisView) -> list[_Candidate]:
    """Every defined data unit of the program in address order, cached per analysis and annotations."""
    key = (view, store(prog).generation())  # (any edit: a type's change resizes the globals of that type)
    cached = prog.extensions.get("analysis.data_units")
    if cached is not None and cached[0][0] is key[0] and cached[0][1] == key[1]:
        return cached[1]
    units = _sweep(prog, _candidates(prog, view))
    prog.extensions["analysis.data_units"] = (key, units)
    return units


def data_unit_at(prog: Program, view: AnalysisView, va: int) -> DataUnit | None:
    """The defined data unit that contains `va`, or None."""
    units = defined_data(prog, view)
    i = bisect.bisect_right(units, va, key=lambda c: c[0]) - 1
    if i < 0:
        return None
    c = units[i]
    return data_unit(prog, c) if c[0] <= va < c[0] + max(c[2], 1) else None


def _quoted(text: str) -> str:
    return '"' + text.encode("unicode_escape").decode("ascii") + '"'


def _byte_text(data: bytes) -> str:
    shown = ", ".join(f"0x{b:02x}" for b in data[:_SHOWN_BYTES])
    return ".byte " + shown + (", ..." if len(data) > _SHOWN_BYTES else "")


def data_unit(prog: Program, c: _Candidate) -> DataUnit:
    """The wire form of one defined data unit."""
    va, _prio, length, kind, extra = c
    sec = prog.image.section_at(va)
    name = prog.name_at(va)
    section = sec.name if sec else None
    if kind == "global":
        g = global_item(prog, va, extra)
        rep = f"{g.type} = {g.value!r}" if g.value is not None else g.type
        return DataUnit(address=hex(va), length=g.size, kind="global", type=g.type, value=g.value,
                        representation=rep, name=name, section=section)  # fmt: skip
    if kind == "string":
        text, enc = extra
        t = "unicode" if enc == "utf-16le" else "string"
        rep = _quoted(text)
        return DataUnit(address=hex(va), length=length, kind="string", type=t, value=text,
                        representation=rep, name=name, section=section)  # fmt: skip
    if kind == "pointer":
        dst, text = extra
        target = name_for_address(prog, dst)
        rep = hex(dst) + (f" ({target})" if target else "") + (f" {_quoted(text)}" if text is not None else "")
        return DataUnit(address=hex(va), length=length, kind="pointer", type="pointer", value=hex(dst),
                        representation=rep, name=name, section=section)  # fmt: skip
    data = prog.image.read(va, min(length, _VALUE_BYTES)) or b""
    t = f"undefined{length}" if length in (1, 2, 4, 8) else f"byte[{length}]"
    return DataUnit(address=hex(va), length=length, kind="symbol", type=t, value=data.hex(),
                    representation=_byte_text(data), name=name, section=section)  # fmt: skip


@method("data_unit.list", effect=READ_ONLY)
def data_unit_list(ws: Workspace, p: DataUnitListParams, ctx: CallContext) -> Listing[DataUnit]:
    """Defined data (typed globals, strings, pointers, object symbols' bytes) in address order; paged."""
    prog, view = need_view(ws, p, ctx)
    refresh(prog)
    units = defined_data(prog, view)
    if p.kind is not None:
        units = [c for c in units if c[3] == p.kind]
    out, cursor, report = page_by_address(prog, p, units, lambda c: c[0], p.page, p.scan)
    return Listing[DataUnit](items=[data_unit(prog, c) for c in out], next_cursor=cursor, scan=report)
