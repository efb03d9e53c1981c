"""register.*, debug_memory.*: a stopped target's registers and memory (writes refused when read-only)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from binlens.api.debug_target import (
    MAX_READ,
    REQUIRES,
    DebugEntry,
    DebugId,
    PlaceParams,
    RuntimeAddress,
    entry_of,
    frame_options,
    framed_command,
    hex_text,
    runtime_of,
    static_of,
)
from binlens.api.models import HexAddress, Params, Result, Selector
from binlens.api.registry import MUTATION, READ_ONLY, method
from binlens.errors import BinlensError
from binlens.providers.gdb import mi_quote
from binlens.providers.target import read_maps

# --- registers and memory -------------------------------------------------------------------------

RegisterName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.]{0,31}$")]


class RegisterGetParams(Params):
    """Registers of a stopped thread and frame."""

    debug_id: DebugId
    names: list[RegisterName] | None = Field(
        None, max_length=128, description="Registers to read (default: gdb's general registers, as 'info registers')."
    )
    thread: int | None = Field(None, ge=1)
    frame: int = Field(0, ge=0, le=10000)


class RegisterValue(Result):
    """One register."""

    name: str
    value: str = Field(description="Hex for integer registers; gdb's text for others.")


class Registers(Result):
    """Register values."""

    registers: list[RegisterValue]


def _register_names(entry: DebugEntry) -> list[str]:
    if entry.register_names is None:
        names = entry.session.command("-data-list-register-names", timeout=10).get("register-names") or []
        entry.register_names = [str(n) for n in names]
    return entry.register_names


def _general_registers(entry: DebugEntry) -> list[int]:
    """The numbers of gdb's `general` registers (what `info registers` shows), found once."""
    if entry.general_registers is None:
        text = entry.session.console("maint print register-groups", timeout=10)
        numbers = []
        for line in text.splitlines()[1:]:
            parts = line.split()
            # (registers without a name, shown as '' or not at all, are skipped)
            named = len(parts) >= 7 and parts[0] not in ("''", "") and not parts[0].isdigit() and parts[1].isdigit()
            if named and "general" in parts[-1].split(","):
                numbers.append(int(parts[1]))
        entry.general_registers = numbers
    return entry.general_registers


@method("register.get", effect=READ_ONLY, requires=REQUIRES)
def register_get(ws: Any, p: RegisterGetParams) -> Registers:
    """Register values of the stopped target (a thread and frame; default the current thread, frame 0)."""
    entry = entry_of(ws, p.debug_id)
    entry.session.require_stopped()
    names = _register_names(entry)
    numbers: list[int] = [] if p.names is not None else _general_registers(entry)
    if p.names is not None:
        for i, name in enumerate(p.names):
            if name not in names:
                raise BinlensError("not_found", f"no register {name!r}", target=f"/params/names/{i}")
            numbers.append(names.index(name))
    where = frame_options(entry, p.thread, p.frame)
    got = framed_command(
        entry, f"-data-list-register-values{where} --skip-unavailable x {' '.join(map(str, numbers))}".rstrip()
    )
    out = []
    for row in got.get("register-values") or []:
        n = int(row.get("number", -1))
        value = str(row.get("value", ""))
        if not (0 <= n < len(names)) or not names[n] or (p.names is None and value.startswith("{")):
            continue
        out.append(RegisterValue(name=names[n], value=value))
    return Registers(registers=out)


class RegisterSetParams(Params):
    """Set one register."""

    debug_id: DebugId
    name: RegisterName
    value: str = Field(pattern=r"^-?(0[xX][0-9a-fA-F]{1,16}|[0-9]{1,20})$", description="An integer, hex or decimal.")
    thread: int | None = Field(None, ge=1)
    frame: int = Field(0, ge=0, le=10000)


@method("register.set", effect=MUTATION, requires=REQUIRES)
def register_set(ws: Any, p: RegisterSetParams) -> Registers:
    """Set a register of the stopped target (refused on a read-only server)."""
    entry = entry_of(ws, p.debug_id)
    entry.session.require_stopped()
    if p.name not in _register_names(entry):
        raise BinlensError("not_found", f"no register {p.name!r}", target="/params/name")
    where = frame_options(entry, p.thread, p.frame)
    framed_command(entry, f"-data-evaluate-expression{where} {mi_quote(f'${p.name}={p.value}')}")
    return register_get(ws, RegisterGetParams(debug_id=p.debug_id, names=[p.name], thread=p.thread, frame=p.frame))


class MemoryReadParams(PlaceParams):
    """Bytes of the target's memory."""

    debug_id: DebugId
    address: RuntimeAddress | None = None
    selector: Selector | None = Field(None, description="A place of the program (static, through the slide).")
    size: int = Field(ge=1, le=MAX_READ)


class MemoryRange(Result):
    """Bytes of the target's memory that could not be read (no mapping there, or one gdb cannot read)."""

    address: HexAddress
    size: int


class MemorySegment(Result):
    """A readable run of bytes of a partly readable range."""

    address: HexAddress
    static_address: HexAddress | None = None
    size: int
    bytes: str = Field(description="Hex bytes.")


class MemoryBytes(Result):
    """Bytes read from (or written to) the target."""

    address: HexAddress
    static_address: HexAddress | None = None
    size: int = Field(description="Bytes in `bytes`: the requested size, or the readable prefix's.")
    bytes: str = Field(description="Hex bytes from `address` up to the first unreadable byte.")
    complete: bool = Field(True, description="False: part of the range is unreadable (`unreadable`).")
    unreadable: list[MemoryRange] = Field(
        default_factory=list, description="The runtime ranges that could not be read, in address order."
    )
    segments: list[MemorySegment] | None = Field(
        None, description="When incomplete: every readable run, in address order (the prefix is the first one)."
    )


def _memory_error(err: BinlensError, where: str) -> BinlensError:
    if err.code == "invalid_argument":
        err.target = f"/params/{where}"
    return err


def _read_blocks(entry: DebugEntry, address: int, size: int) -> list[tuple[int, bytes]]:
    """gdb's readable blocks of [address, address + size): (start, bytes), clipped to the range
    (an unreadable range answers no blocks)."""
    try:
        got = entry.session.command(f"-data-read-memory-bytes {hex(address)} {size}", timeout=10, check=True)
    except BinlensError as err:
        if err.code != "invalid_argument":
            raise
        return []
    blocks = []
    for b in got.get("memory") or []:
        if isinstance(b, dict) and isinstance(b.get("begin"), str):
            start, data = int(b["begin"], 16), bytes.fromhex(str(b.get("contents", "")))
            lo, hi = max(start, address), min(start + len(data), address + size)
            if lo < hi:
                blocks.append((lo, data[lo - start : hi - start]))
    return blocks


def _mapped(entry: DebugEntry, address: int, size: int) -> list[tuple[int, int]]:
    """The pieces (start, end) of [address, address + size) inside the target's mappings, in order
    (the mappings are read once per stop: they change only while the target runs)."""
    ident = entry.identity
    assert ident is not None
    seq = entry.session.seq
    if entry.maps_at is None or entry.maps_at[0] != seq:
        entry.maps_at = (seq, read_maps(ident.pid))
    end = address + size
    pieces: list[tuple[int, int]] = []
    for m in entry.maps_at[1]:
        lo, hi = max(m.start, address), min(m.end, end)
        if lo < hi:
            if pieces and pieces[-1][1] == lo:  # adjacent mappings: one piece
                pieces[-1] = (pieces[-1][0], hi)
            else:
                pieces.append((lo, hi))
    return pieces


@method("debug_memory.read", effect=READ_ONLY, requires=REQUIRES)
def debug_memory_read(ws: Any, p: MemoryReadParams) -> MemoryBytes:
    """Read up to 64 KiB of the stopped target's memory at a runtime address or a static selector.
    A range that is partly unreadable answers its readable prefix and says which bytes were not
    read (`complete: false`, `unreadable`, `segments`); one that is wholly unreadable is an error."""
    entry = entry_of(ws, p.debug_id)
    entry.session.require_stopped()
    where = "address" if p.address is not None else "selector"
    runtime = runtime_of(ws, entry, p.address, p.selector, where)
    static = hex_text(static_of(entry, runtime))
    # (gdb reads only inside the mappings: past a mapping's end it can answer bytes that are not there)
    blocks = [b for lo, hi in _mapped(entry, runtime, p.size) for b in _read_blocks(entry, lo, hi - lo)]
    if len(blocks) == 1 and blocks[0][0] == runtime and len(blocks[0][1]) == p.size:
        return MemoryBytes(address=hex(runtime), static_address=static, size=p.size, bytes=blocks[0][1].hex())
    gaps, at = [], runtime
    for start, data in blocks:
        if start > at:
            gaps.append(MemoryRange(address=hex(at), size=start - at))
        at = start + len(data)
    if at < runtime + p.size:
        gaps.append(MemoryRange(address=hex(at), size=runtime + p.size - at))
    if not blocks:
        raise BinlensError(
            "invalid_argument",
            f"cannot read the {p.size} bytes at {hex(runtime)}: nothing there is readable",
            target=f"/params/{where}",
            details={"reason": "unreadable", "address": hex(runtime), "size": p.size},
        )
    prefix = blocks[0][1] if blocks[0][0] == runtime else b""
    return MemoryBytes(
        address=hex(runtime),
        static_address=static,
        size=len(prefix),
        bytes=prefix.hex(),
        complete=False,
        unreadable=gaps,
        segments=[
            MemorySegment(address=hex(a), static_address=hex_text(static_of(entry, a)), size=len(d), bytes=d.hex())
            for a, d in blocks
        ],
    )


class MemoryWriteParams(PlaceParams):
    """Write bytes into the target's memory."""

    debug_id: DebugId
    address: RuntimeAddress | None = None
    selector: Selector | None = None
    bytes: str = Field(min_length=2, max_length=2 * MAX_READ, pattern=r"^([0-9a-fA-F]{2})+$", description="Hex bytes.")


@method("debug_memory.write", effect=MUTATION, requires=REQUIRES)
def debug_memory_write(ws: Any, p: MemoryWriteParams) -> MemoryBytes:
    """Write up to 64 KiB into the stopped target's memory (refused on a read-only server)."""
    entry = entry_of(ws, p.debug_id)
    entry.session.require_stopped()
    where = "address" if p.address is not None else "selector"
    runtime = runtime_of(ws, entry, p.address, p.selector, where)
    try:
        entry.session.command(f"-data-write-memory-bytes {hex(runtime)} {p.bytes.lower()}", timeout=10, check=True)
    except BinlensError as err:
        raise _memory_error(err, where) from None
    size = len(p.bytes) // 2
    return MemoryBytes(
        address=hex(runtime), static_address=hex_text(static_of(entry, runtime)), size=size, bytes=p.bytes.lower()
    )
