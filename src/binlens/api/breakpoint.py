"""breakpoint.*, watchpoint.*: where a debugged target stops."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from binlens.api.debug_target import (
    REQUIRES,
    DebugEntry,
    DebugId,
    FunctionRef,
    PlaceParams,
    RuntimeAddress,
    assigns,
    entry_of,
    function_ref,
    hex_text,
    runtime_of,
    static_of,
)
from binlens.api.models import HexAddress, Params, Result, Selector
from binlens.api.registry import LIFECYCLE, READ_ONLY, method
from binlens.errors import BinlensError
from binlens.providers.gdb import mi_quote

# --- breakpoints and watchpoints ------------------------------------------------------------------


class BreakpointCreateParams(PlaceParams):
    """A breakpoint at a static place of the program (through the slide) or a runtime address."""

    debug_id: DebugId
    selector: Selector | None = Field(None, description="A function or address of the program (static).")
    address: RuntimeAddress | None = None
    hardware: bool = Field(False, description="A hardware breakpoint (debug registers) instead of int3.")
    condition: str | None = Field(
        None,
        max_length=512,
        pattern=r"^[^\n\r\x00]*$",
        description="A gdb expression: stop only when it is true ($rdi == 3).",
    )


class Breakpoint(Result):
    """A breakpoint or watchpoint of a session."""

    id: int
    kind: Literal["software", "hardware", "watchpoint"]
    address: HexAddress
    static_address: HexAddress | None = None
    function: FunctionRef | None = None
    condition: str | None = None
    size: int | None = None
    access: str | None = None
    hits: int | None = None


def _check_condition(ws: Any, condition: str | None) -> None:
    """A read-only server refuses conditions that assign (a write the write methods would refuse)."""
    if condition and ws.read_only and assigns(condition):
        raise BinlensError(
            "read_only",
            "the condition assigns, and the server is read-only",
            target="/params/condition",
            details={"requirement": "writable", "reason": "the server is read-only"},
        )


def _no_debug_registers(entry: DebugEntry, target: str) -> None:
    """An emulated target has no debug registers (QEMU's gdb stub answers no hardware breakpoint
    or watchpoint): `unsupported`, rather than a resume that fails."""
    emulator = entry.session.emulator
    if emulator is not None:
        raise BinlensError(
            "unsupported",
            f"the {emulator.arch} target runs under QEMU, whose gdb stub has no hardware breakpoints or watchpoints",
            target=target,
            details={"reason": "emulated", "arch": emulator.arch},
        )


def _hits(entry: DebugEntry) -> dict[int, int]:
    try:
        table = entry.session.command("-break-list", timeout=10).get("BreakpointTable") or {}
    except BinlensError:
        return {}
    out = {}
    for row in table.get("body") or []:
        if isinstance(row, dict) and str(row.get("number", "")).isdigit():
            out[int(row["number"])] = int(row.get("times") or 0)
    return out


@method("breakpoint.create", effect=LIFECYCLE, requires=REQUIRES)
def breakpoint_create(ws: Any, p: BreakpointCreateParams) -> Breakpoint:
    """Set a software, hardware or conditional breakpoint by selector (static, through the slide) or runtime address."""
    entry = entry_of(ws, p.debug_id)
    if p.hardware:
        _no_debug_registers(entry, "/params/hardware")
    entry.session.check_alive()
    _check_condition(ws, p.condition)
    runtime = runtime_of(ws, entry, p.address, p.selector, "selector")
    flags = " -h" if p.hardware else ""
    if p.condition:
        flags += f" -c {mi_quote(p.condition)}"
    got = entry.session.command(f"-break-insert{flags} *{hex(runtime)}", timeout=10, check=True)
    number = int((got.get("bkpt") or {}).get("number", 0))
    static = static_of(entry, runtime)
    info: dict[str, Any] = {
        "id": number,
        "kind": "hardware" if p.hardware else "software",
        "address": hex(runtime),
        "static_address": hex_text(static),
        "condition": p.condition,
    }
    entry.breakpoints[number] = info
    return Breakpoint(**info, function=function_ref(entry, static))


class BreakpointListParams(Params):
    """A session's breakpoints."""

    debug_id: DebugId


class BreakpointList(Result):
    """Breakpoints (or watchpoints) with their hit counts."""

    items: list[Breakpoint]
    next_cursor: str | None = None


def _listed(entry: DebugEntry, watch: bool) -> BreakpointList:
    hits = _hits(entry) if entry.session.state in ("stopped", "running") else {}
    items = []
    for number, info in sorted(entry.breakpoints.items()):
        if (info["kind"] == "watchpoint") != watch:
            continue
        static = int(info["static_address"], 16) if info.get("static_address") else None
        items.append(Breakpoint(**info, function=function_ref(entry, static), hits=hits.get(number)))
    return BreakpointList(items=items)


@method("breakpoint.list", effect=READ_ONLY, requires=REQUIRES)
def breakpoint_list(ws: Any, p: BreakpointListParams) -> BreakpointList:
    """A session's breakpoints with their hit counts."""
    return _listed(entry_of(ws, p.debug_id), watch=False)


class BreakpointDeleteParams(Params):
    """Delete a breakpoint or watchpoint by id."""

    debug_id: DebugId
    id: int = Field(ge=1)


class Deleted(Result):
    """What was deleted."""

    id: int
    deleted: bool


def _delete(ws: Any, p: BreakpointDeleteParams, watch: bool) -> Deleted:
    entry = entry_of(ws, p.debug_id)
    info = entry.breakpoints.get(p.id)
    if info is None or (info["kind"] == "watchpoint") != watch:
        raise BinlensError("not_found", f"no {'watchpoint' if watch else 'breakpoint'} {p.id}", target="/params/id")
    entry.session.command(f"-break-delete {p.id}", timeout=10, check=True)
    del entry.breakpoints[p.id]
    return Deleted(id=p.id, deleted=True)


@method("breakpoint.delete", effect=LIFECYCLE, requires=REQUIRES)
def breakpoint_delete(ws: Any, p: BreakpointDeleteParams) -> Deleted:
    """Delete a breakpoint."""
    return _delete(ws, p, watch=False)


_C_TYPES = {1: "char", 2: "short", 4: "int", 8: "long"}


class WatchpointCreateParams(PlaceParams):
    """A (hardware) watchpoint on 1, 2, 4 or 8 bytes."""

    debug_id: DebugId
    selector: Selector | None = Field(None, description="A global of the program (static, through the slide).")
    address: RuntimeAddress | None = None
    size: Literal[1, 2, 4, 8] = 8
    access: Literal["write", "read", "access"] = "write"
    condition: str | None = Field(None, max_length=512, pattern=r"^[^\n\r\x00]*$", description="A gdb expression.")


@method("watchpoint.create", effect=LIFECYCLE, requires=REQUIRES)
def watchpoint_create(ws: Any, p: WatchpointCreateParams) -> Breakpoint:
    """Stop when the target writes (or reads, or accesses) 1-8 bytes at a place."""
    entry = entry_of(ws, p.debug_id)
    entry.session.require_stopped()
    _no_debug_registers(entry, "/params/debug_id")
    _check_condition(ws, p.condition)
    runtime = runtime_of(ws, entry, p.address, p.selector, "selector")
    flag = {"write": "", "read": " -r", "access": " -a"}[p.access]
    got = entry.session.command(f"-break-watch{flag} *({_C_TYPES[p.size]}*){hex(runtime)}", timeout=10, check=True)
    wpt = got.get("wpt") or got.get("hw-rwpt") or got.get("hw-awpt") or {}
    number = int(wpt.get("number", 0))
    if p.condition:
        entry.session.command(f"-break-condition {number} {p.condition}", timeout=10, check=True)
    static = static_of(entry, runtime)
    info: dict[str, Any] = {
        "id": number,
        "kind": "watchpoint",
        "address": hex(runtime),
        "static_address": hex_text(static),
        "condition": p.condition,
        "size": p.size,
        "access": p.access,
    }
    entry.breakpoints[number] = info
    return Breakpoint(**info, function=None)


@method("watchpoint.list", effect=READ_ONLY, requires=REQUIRES)
def watchpoint_list(ws: Any, p: BreakpointListParams) -> BreakpointList:
    """A session's watchpoints with their hit counts."""
    return _listed(entry_of(ws, p.debug_id), watch=True)


@method("watchpoint.delete", effect=LIFECYCLE, requires=REQUIRES)
def watchpoint_delete(ws: Any, p: BreakpointDeleteParams) -> Deleted:
    """Delete a watchpoint."""
    return _delete(ws, p, watch=True)
