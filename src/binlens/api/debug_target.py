"""The debug domains' shared ground: each workspace's debug sessions and event listeners, runtime and
static addresses, and the records every debug method returns.

debug.*, breakpoint.*, watchpoint.*, register.*, debug_memory.*, backtrace.get, thread.list,
memory_map.list, debug_address.resolve: live debugging of a Linux process through the debugger
provider (gdb over GDB/MI), off unless the server allows it (`--allow-debug`).

A debug session is bound to an open program: `debug.start` runs the program's own file (under the
roots), `debug.attach` takes a process whose executable has the program's bytes. Runtime addresses
are reported as they are, next to the static address of the program (runtime - slide) and the
slide itself; selectors (`{"name": "work"}`, `{"name": "sub_1240"}`, `{"address": "0x1240"}`) are
static and go through the program database and the slide. Stop events are kept in a bounded log
per session (`debug.events`, `debug.wait`) and passed to the workspace's event listeners (the
servers push them as notifications).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from binlens.api.analysis import select_address
from binlens.api.models import HexAddress, Params, Result, Selector
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of, function_name
from binlens.providers.gdb import GdbSession
from binlens.providers.target import Mapping, TargetIdentity, read_maps

SESSIONS_KEY = "debug.sessions"  # Workspace.extensions key of the `DebugSessions`
LISTENERS_KEY = "debug.listeners"  # Workspace.extensions key of the event listeners (the servers')
MAX_LIVE = 8  # debug sessions with a live gdb at once
MAX_KEPT = 64  # ended sessions kept for their events, per workspace
MAX_READ = 64 * 1024
REQUIRES = ("permission:debug", "provider-kind:debugger")
ANALYSIS_WAIT_S = 10.0  # how long a call waits for the analysis to name a function (pushed events: not at all)

DebugId = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^dbg-[0-9]+$", description="A debug_id.")]
RuntimeAddress = Annotated[str, Field(pattern=r"^0[xX][0-9a-fA-F]{1,16}$", description="A runtime address in hex.")]


class PlaceParams(Params):
    """Params naming one place of the target: a static `selector` of the program (through the slide)
    or a runtime `address`, exactly one."""

    selector: Selector | None = Field(None, description="A place of the program (static, through the slide).")
    address: RuntimeAddress | None = None

    @model_validator(mode="after")
    def _one_place(self) -> Self:
        if (self.selector is None) == (self.address is None):
            raise ValueError("give exactly one of 'selector' or 'address'")
        return self


WaitMs = Annotated[
    int, Field(ge=0, le=60000, description="How long to wait for the target to stop before answering (0: at once).")
]
TimeoutMs = Annotated[int, Field(ge=100, le=120000, description="How long gdb may take.")]
Line = Annotated[str, Field(max_length=4096, pattern=r"^[^\n\r\x00]*$")]


# --- the sessions of a workspace -----------------------------------------------------------------


@dataclass(kw_only=True)
class Located:
    """A live process running a program: where the program is loaded in it (found once)."""

    prog: Any
    base: int | None = None  # the program's runtime base
    end: int | None = None
    slide: int | None = None

    @property
    def identity(self) -> TargetIdentity | None:
        """The pinned process (None before it is pinned)."""
        raise NotImplementedError


@dataclass(kw_only=True)
class DebugEntry(Located):
    """One debug session and what the domain knows of it."""

    debug_id: str
    session: GdbSession
    breakpoints: dict[int, dict[str, Any]] = field(default_factory=dict)
    register_names: list[str] | None = None
    general_registers: list[int] | None = None  # gdb's `general` register group, by number
    maps_at: tuple[int, list[Mapping]] | None = None  # (the stop's event seq, the target's maps then)

    @property
    def identity(self) -> TargetIdentity | None:
        """The session's pinned target."""
        return self.session.identity


class DebugSessions:
    """Every debug session of a workspace by debug_id; ended sessions stay for their events."""

    def __init__(self) -> None:
        self.entries: dict[str, DebugEntry] = {}
        self.lock = threading.Lock()
        self.ids = itertools.count(1)

    def live(self) -> int:
        """Sessions whose gdb still runs."""
        return sum(1 for e in self.entries.values() if e.session.state in ("idle", "stopped", "running"))

    def add(self, entry: DebugEntry) -> None:
        """Keep `entry`, dropping the oldest ended sessions past `MAX_KEPT`."""
        with self.lock:
            self.entries[entry.debug_id] = entry
            ended = [k for k, e in self.entries.items() if e.session.state not in ("idle", "stopped", "running")]
            for k in ended[: max(0, len(self.entries) - MAX_KEPT)]:
                del self.entries[k]


def sessions_of(ws: Any) -> DebugSessions:
    held = ws.extensions.get(SESSIONS_KEY)
    if held is None:
        held = ws.extensions.setdefault(SESSIONS_KEY, DebugSessions())
    assert isinstance(held, DebugSessions)
    return held


def listeners(ws: Any) -> list[Callable[[dict[str, Any]], None]]:
    """The workspace's debug event listeners: each gets every stop event (with `debug_id`) from
    gdb's reader thread and must not block (a server hands it to its event loop)."""
    held = ws.extensions.get(LISTENERS_KEY)
    if held is None:
        held = ws.extensions.setdefault(LISTENERS_KEY, [])
    assert isinstance(held, list)
    return held


def entry_of(ws: Any, debug_id: str) -> DebugEntry:
    entry = sessions_of(ws).entries.get(debug_id)
    if entry is None:
        raise BinlensError("not_found", f"no debug session {debug_id}", target="/params/debug_id")
    entry.session.release_if_ended()
    return entry


# --- addresses ------------------------------------------------------------------------------------


def _module_of(maps: list[Mapping], device: int, inode: int) -> tuple[int, int] | None:
    """The (base, end) of the file (device, inode) mapped in `maps`."""
    mine = [m for m in maps if m.inode == inode and m.device == device and inode]
    if not mine:
        return None
    return min(m.start - m.offset for m in mine), max(m.end for m in mine)


def locate(entry: Located) -> None:
    """Find the program's runtime base and slide in the target's maps (once)."""
    ident = entry.identity
    if entry.slide is not None or ident is None:
        return
    found = _module_of(read_maps(ident.pid), ident.exe_device, ident.exe_inode)
    if found is None:
        return
    entry.base, entry.end = found
    static_base = entry.prog.image.identity.image_base or 0
    entry.slide = entry.base - static_base


def static_of(entry: Located, runtime: int | None) -> int | None:
    if runtime is None or entry.slide is None or entry.base is None or entry.end is None:
        return None
    return runtime - entry.slide if entry.base <= runtime < entry.end else None


def runtime_of(ws: Any, entry: DebugEntry, address: str | None, selector: Selector | None, where: str) -> int:
    """A runtime address from `address` (runtime) or `selector` (static: through the program and the slide)."""
    if address is not None:
        return int(address, 16)
    if selector is None:
        raise BinlensError("invalid_argument", "give 'address' or 'selector'", target=f"/params/{where}")
    static, target = select_address(entry.prog, selector)
    locate(entry)
    if entry.slide is None:
        raise BinlensError(
            "unavailable",
            "the program is not mapped in the target yet",
            target=target,
            details={"reason": "not_mapped"},
        )
    return static + entry.slide


class FunctionRef(Result):
    """A function of the program, by its static address."""

    address: HexAddress
    name: str | None = None
    offset: int = Field(description="Bytes from the function's start.")


def function_ref(entry: Located, static: int | None, wait: float = ANALYSIS_WAIT_S) -> FunctionRef | None:
    """The program's function around a static address: from the analysis (waited for at most
    `wait` seconds; it starts with the session), else a name at the address or the nearest symbol."""
    if static is None:
        return None
    prog = entry.prog
    st = analysis_of(prog)
    view = st.view if st.status == "done" else None
    if view is None and wait > 0:
        with contextlib.suppress(BinlensError):
            view = st.require(None, wait=True, timeout_s=wait)
    if view is not None:
        f = view.function_at(static)
        if f is not None:
            return FunctionRef(address=hex(f.address), name=function_name(prog, f), offset=static - f.address)
    exact = prog.name_at(static)
    if exact:
        return FunctionRef(address=hex(static), name=exact, offset=0)
    near = prog.nearest_symbol(static)
    if near is not None:
        sym, off = near
        return FunctionRef(address=hex(sym.address), name=prog.name_at(sym.address) or sym.name, offset=off)
    return None


_ASSIGNS = re.compile(r"(?:<<|>>)=|(?<![=!<>])=(?!=)|\+\+|--")


def assigns(expression: str) -> bool:
    """The gdb expression assigns (=, op=, ++, --): a write to the target."""
    return _ASSIGNS.search(expression) is not None


def frame_options(entry: DebugEntry, thread: int | None, frame: int) -> str:
    """MI's thread and frame options (gdb takes --frame only with --thread: the current one by default)."""
    if thread is None and frame == 0:
        return ""
    if thread is None:
        thread = (entry.session.last_stop or {}).get("thread") or 1
    return f" --thread {thread} --frame {frame}"


def frame_error(err: BinlensError) -> BinlensError:
    """gdb's refusals of a thread or frame as errors at the params that named them."""
    message = err.message.removeprefix("gdb: ")
    if message.startswith(("Invalid thread id", "Unknown thread")):
        err.target = "/params/thread"
    elif message.startswith(("Invalid frame id", "No frame at level")):
        err.target = "/params/frame"
    return err


def framed_command(entry: DebugEntry, text: str) -> dict[str, Any]:
    """One MI command of a call that names a thread and frame: gdb's refusals of either point at
    the param (`frame_error`)."""
    try:
        return entry.session.command(text, timeout=10, check=True)
    except BinlensError as err:
        raise frame_error(err) from None


def hex_text(value: int | None) -> str | None:
    return None if value is None else hex(value)


# --- results --------------------------------------------------------------------------------------


class DebugEvent(Result):
    """A stop of the target (or its exit)."""

    debug_id: str
    seq: int = Field(description="The event's number in its session's log (1, 2, ...).")
    kind: Literal["breakpoint", "watchpoint", "signal", "exited", "step", "stopped"]
    reason: str | None = Field(None, description="gdb's stop reason.")
    time: float = Field(description="Seconds since the epoch.")
    thread: int | None = None
    address: HexAddress | None = Field(None, description="Runtime address where the target stopped.")
    static_address: HexAddress | None = Field(None, description="The same in the program (runtime - slide).")
    function: FunctionRef | None = None
    breakpoint: int | None = None
    watchpoint: dict[str, Any] | None = Field(None, description="{id, expression, old, new}.")
    signal: dict[str, Any] | None = Field(None, description="{name, meaning}.")
    exit_code: int | None = None
    return_value: str | None = None


def event_record(entry: DebugEntry, raw: dict[str, Any], wait: float = ANALYSIS_WAIT_S) -> DebugEvent:
    address = raw.get("address")
    static = static_of(entry, address)
    return DebugEvent(
        debug_id=entry.debug_id,
        seq=raw["seq"],
        kind=raw["kind"],
        reason=raw.get("reason"),
        time=raw["time"],
        thread=raw.get("thread"),
        address=hex_text(address),
        static_address=hex_text(static),
        function=function_ref(entry, static, wait),
        breakpoint=raw.get("breakpoint"),
        watchpoint=raw.get("watchpoint"),
        signal=raw.get("signal"),
        exit_code=raw.get("exit_code"),
        return_value=raw.get("return_value"),
    )


class DebugSessionInfo(Result):
    """A debug session: its target, state and the program's slide."""

    debug_id: str
    program: str
    pid: int | None
    state: Literal["idle", "stopped", "running", "exited", "detached", "failed", "closed"]
    started: bool = Field(description="True: the session started the target (it is killed with the session).")
    slide: HexAddress | None = Field(None, description="Runtime base - static base of the program.")
    base: HexAddress | None = Field(None, description="The program's runtime base.")
    exit_code: int | None = None
    identity: dict[str, Any] | None = Field(
        None, description="The pinned target: {pid, start_time, exe, exe_device, exe_inode, sha256}."
    )
    last_event: DebugEvent | None = None
    output_tail: str | None = Field(None, description="The end (4 KiB) of a started target's stdout and stderr.")


def session_info(entry: DebugEntry, output: bool = False) -> DebugSessionInfo:
    s = entry.session
    if s.state in ("stopped", "running"):
        with contextlib.suppress(BinlensError):  # (a target that just exited has no maps)
            locate(entry)
    ident = s.identity
    return DebugSessionInfo(
        debug_id=entry.debug_id,
        program=entry.prog.handle,
        pid=ident.pid if ident else None,
        state=s.state,  # type: ignore[arg-type]  # GdbSession.state holds one of the literal's values
        started=s.started,
        slide=hex_text(entry.slide),
        base=hex_text(entry.base),
        exit_code=s.exit_code,
        identity=ident.to_dict() if ident else None,
        last_event=event_record(entry, s.last_stop) if s.last_stop else None,
        output_tail=s.output_tail() if output and s.started else None,
    )


class StepResult(Result):
    """The state after a resume, and the stop it ended with when it stopped within `wait_ms`."""

    state: str
    event: DebugEvent | None = None
