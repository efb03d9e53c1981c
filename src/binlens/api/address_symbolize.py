"""address.symbolize: runtime addresses of a stack, and the image's runtime base, as functions and offsets."""

from __future__ import annotations

import re

from pydantic import Field

from binlens.api.analysis import NeedsAnalysis, need_view
from binlens.api.function import heuristic_warnings, sources_of
from binlens.api.models import HexAddress, Result
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import function_name
from binlens.workspace import Workspace

MAX_ADDRESSES = 1024  # addresses one call symbolizes (a stack is rarely deeper than a few hundred)
_HEX = re.compile(r"^\s*0[xX]([0-9a-fA-F]{1,16})\s*$")
RuntimeValue = int | str  # a JSON integer or a hex string like "0x7f3a12c4"


class SymbolizeParams(NeedsAnalysis):
    addresses: list[RuntimeValue] = Field(
        min_length=1,
        max_length=MAX_ADDRESSES,
        description=f"Runtime addresses (hex strings like '0x55d0c7a01189', or integers), at most {MAX_ADDRESSES}.",
    )
    base: RuntimeValue | None = Field(
        default=None,
        description="Where the image is loaded at run time (its first mapping in /proc/PID/maps, dladdr's "
        "dli_fbase, a module handle); omitted: the addresses are already the image's own.",
    )
    return_addresses: bool = Field(
        default=False,
        description="Every address but the first is a return address (a backtrace): it is looked up one byte "
        "before, so a call that ends a function names that function.",
    )


class FunctionPlace(Result):
    address: HexAddress = Field(description="The function's entry.")
    name: str


class SymbolizedAddress(Result):
    runtime: HexAddress
    address: HexAddress | None = Field(
        default=None,
        description="The static address in the image (runtime - base + image base); absent when not in the image.",
        exclude_if=lambda v: v is None,
    )
    function: FunctionPlace | None = Field(default=None, exclude_if=lambda v: v is None)
    offset: int | None = Field(
        default=None, description="Bytes from the function's entry.", exclude_if=lambda v: v is None
    )
    section: str | None = Field(
        default=None, description="The section, where no function holds the address.", exclude_if=lambda v: v is None
    )
    note: str | None = Field(
        default=None,
        description="'not in the image' (unmapped there) or 'not in a function'; absent when a function holds it.",
        exclude_if=lambda v: v is None,
    )
    warnings: list[str] | None = Field(
        default=None, description="e.g. that only heuristics found the function.", exclude_if=lambda v: not v
    )


class SymbolizeResult(Result):
    base: HexAddress = Field(description="The runtime base the addresses were read against.")
    image_base: HexAddress = Field(description="The image's own base (its lowest mapping).")
    items: list[SymbolizedAddress]


def runtime_value(value: RuntimeValue, target: str) -> int:
    """An address given as a JSON integer or a hex string, checked to fit in 64 bits."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BinlensError(
            "invalid_argument", "an address is an integer or a hex string like '0x401000'", target=target
        )
    if isinstance(value, str):
        m = _HEX.match(value)
        if m is None:
            raise BinlensError(
                "invalid_argument", f"{value[:40]!r} is not a hex address like '0x7f3a12c4'", target=target
            )
        return int(m.group(1), 16)
    if not 0 <= value < 1 << 64:
        raise BinlensError("invalid_argument", f"{value} is not a 64-bit address", target=target)
    return value


@method("address.symbolize", effect=READ_ONLY)
def address_symbolize(ws: Workspace, p: SymbolizeParams, ctx: CallContext) -> SymbolizeResult:
    """Runtime addresses of a stack plus the image's runtime base -> static address, function and offset."""
    runtime = [runtime_value(a, f"/params/addresses/{i}") for i, a in enumerate(p.addresses)]
    prog, view = need_view(ws, p, ctx)
    img = prog.image
    image_base = img.identity.image_base
    if image_base is None:
        raise BinlensError("unsupported", "the program has no loadable segments to symbolize against", target="/params")
    base = image_base if p.base is None else runtime_value(p.base, "/params/base")
    slide = base - image_base
    items: list[SymbolizedAddress] = []
    guessed = 0
    for i, rt in enumerate(runtime):
        static = rt - slide
        if not 0 <= static < 1 << 64 or not img.is_mapped(static):
            items.append(SymbolizedAddress(runtime=hex(rt), note="not in the image"))
            continue
        probe = static - 1 if p.return_addresses and i > 0 and static > 0 else static
        item = SymbolizedAddress(runtime=hex(rt), address=hex(static))
        f = view.function_at(probe) if img.is_mapped(probe) else None
        if f is not None:
            item.function = FunctionPlace(address=hex(f.address), name=function_name(prog, f))
            item.offset = static - f.address
            item.warnings = heuristic_warnings(prog, f.address, sources_of(prog, f))
            guessed += bool(item.warnings)
        else:
            sec = img.section_at(static)
            item.section = sec.name if sec is not None else None
            item.note = "not in a function"
        items.append(item)
    if guessed:
        ctx.warn(f"{guessed} of these addresses are in functions found by heuristics only")
    return SymbolizeResult(base=hex(base), image_base=hex(image_base), items=items)
