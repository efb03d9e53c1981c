"""debug.*, breakpoint.*, watchpoint.*, register.*, debug_memory.*, backtrace.get, thread.list,
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
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from binlens.api.analysis import select_address
from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.models import HexAddress, Page, Params, ProgramRef, Result, Selector
from binlens.api.registry import LIFECYCLE, MUTATION, READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of, function_name
from binlens.providers import registry as providers
from binlens.providers.gdb import KILL_COMMAND, GdbSession, Mapping, TargetIdentity, mi_quote, read_maps

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


def _sessions(ws: Any) -> DebugSessions:
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


def _entry(ws: Any, debug_id: str) -> DebugEntry:
    entry = _sessions(ws).entries.get(debug_id)
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


def _locate(entry: Located) -> None:
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


def _static(entry: Located, runtime: int | None) -> int | None:
    if runtime is None or entry.slide is None or entry.base is None or entry.end is None:
        return None
    return runtime - entry.slide if entry.base <= runtime < entry.end else None


def _runtime(ws: Any, entry: DebugEntry, address: str | None, selector: Selector | None, where: str) -> int:
    """A runtime address from `address` (runtime) or `selector` (static: through the program and the slide)."""
    if address is not None:
        return int(address, 16)
    if selector is None:
        raise BinlensError("invalid_argument", "give 'address' or 'selector'", target=f"/params/{where}")
    static, target = select_address(entry.prog, selector)
    _locate(entry)
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


def _function(entry: Located, static: int | None, wait: float = ANALYSIS_WAIT_S) -> FunctionRef | None:
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


def _hex(value: int | None) -> str | None:
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


def _event(entry: DebugEntry, raw: dict[str, Any], wait: float = ANALYSIS_WAIT_S) -> DebugEvent:
    address = raw.get("address")
    static = _static(entry, address)
    return DebugEvent(
        debug_id=entry.debug_id,
        seq=raw["seq"],
        kind=raw["kind"],
        reason=raw.get("reason"),
        time=raw["time"],
        thread=raw.get("thread"),
        address=_hex(address),
        static_address=_hex(static),
        function=_function(entry, static, wait),
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


def _info(entry: DebugEntry, output: bool = False) -> DebugSessionInfo:
    s = entry.session
    if s.state in ("stopped", "running"):
        with contextlib.suppress(BinlensError):  # (a target that just exited has no maps)
            _locate(entry)
    ident = s.identity
    return DebugSessionInfo(
        debug_id=entry.debug_id,
        program=entry.prog.handle,
        pid=ident.pid if ident else None,
        state=s.state,  # type: ignore[arg-type]  # GdbSession.state holds one of the literal's values
        started=s.started,
        slide=_hex(entry.slide),
        base=_hex(entry.base),
        exit_code=s.exit_code,
        identity=ident.to_dict() if ident else None,
        last_event=_event(entry, s.last_stop) if s.last_stop else None,
        output_tail=s.output_tail() if output and s.started else None,
    )


class StepResult(Result):
    """The state after a resume, and the stop it ended with when it stopped within `wait_ms`."""

    state: str
    event: DebugEvent | None = None


# --- start, attach, list --------------------------------------------------------------------------


def _new_session(ws: Any, prog: Any) -> tuple[DebugEntry, GdbSession]:
    provider, _ = providers.choose("auto", "debugger")
    table = _sessions(ws)
    with table.lock:
        if table.live() >= MAX_LIVE:
            raise BinlensError(
                "busy", f"{MAX_LIVE} debug sessions are running; kill or detach one first", details={"limit": MAX_LIVE}
            )
        debug_id = f"dbg-{next(table.ids)}"
    session = provider.open_session(prog.image)
    assert isinstance(session, GdbSession)
    entry = DebugEntry(debug_id=debug_id, prog=prog, session=session)

    def push(raw: dict[str, Any]) -> None:
        if not listeners(ws):
            return
        event = _event(entry, raw, wait=0).model_dump(mode="json")
        for listener in list(listeners(ws)):
            listener(event)

    session.listener = push
    prog.on_close.append(session.close)
    analysis_of(prog).start()  # names for events and backtraces while the target runs
    return entry, session


class DebugStartParams(Params):
    """Start the program's file under the debugger, stopped at its first instruction."""

    program: ProgramRef | None = None
    args: list[Line] = Field(default_factory=list, max_length=256, description="Command-line arguments.")
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")], Line] = Field(
        default_factory=dict, max_length=256, description="Environment variables added to gdb's minimal environment."
    )
    cwd: Line | None = Field(None, description="The target's working directory.")
    stdin: str | None = Field(None, max_length=1 << 20, description="Text the target reads on stdin (else /dev/null).")
    timeout_ms: TimeoutMs = 30000


@method("debug.start", effect=LIFECYCLE, requires=REQUIRES)
def debug_start(ws: Any, p: DebugStartParams) -> DebugSessionInfo:
    """Start the program's own file (under the roots) in gdb, stopped at its first instruction."""
    prog = ws.program(p.program)
    path = ws.check_root(prog.path, "/params/program")
    if not os.access(path, os.X_OK):
        raise BinlensError("invalid_argument", f"{prog.path.name} is not executable", target="/params/program")
    if p.cwd is not None and not os.path.isdir(p.cwd):
        raise BinlensError("invalid_argument", "cwd is not a directory", target="/params/cwd")
    entry, session = _new_session(ws, prog)
    try:
        session.start(
            str(path), p.args, p.env, p.cwd, p.stdin.encode() if p.stdin is not None else None, p.timeout_ms / 1000
        )
    except BinlensError as err:
        session.close()
        if err.code == "conflict":  # the file's bytes changed since the program was opened
            err.target = "/params/program"
        raise
    _sessions(ws).add(entry)
    return _info(entry)


class DebugAttachParams(Params):
    """Attach to a running process whose executable has the program's bytes."""

    program: ProgramRef | None = None
    pid: int = Field(ge=1, le=(1 << 22))
    timeout_ms: TimeoutMs = 30000


@method("debug.attach", effect=LIFECYCLE, requires=REQUIRES)
def debug_attach(ws: Any, p: DebugAttachParams) -> DebugSessionInfo:
    """Attach gdb to a running process (stopped once attached) after checking its executable is the program."""
    prog = ws.program(p.program)
    if p.pid == os.getpid():
        raise BinlensError("invalid_argument", "the server cannot debug itself", target="/params/pid")
    try:
        ident = TargetIdentity.pin(p.pid)
    except BinlensError as err:
        err.target = err.target or "/params/pid"
        raise
    if ident.sha256 != prog.image.identity.sha256:
        raise BinlensError(
            "conflict",
            f"process {p.pid} runs {os.path.basename(ident.exe)}, whose bytes are not the program's",
            target="/params/pid",
            details={"reason": "exe_mismatch", "sha256": ident.sha256},
        )
    entry, session = _new_session(ws, prog)
    try:
        session.attach(p.pid, p.timeout_ms / 1000)
    except BinlensError:
        session.close()
        raise
    _sessions(ws).add(entry)
    return _info(entry)


class DebugRef(Params):
    """One debug session."""

    debug_id: DebugId


@method("debug.get", effect=READ_ONLY, requires=REQUIRES)
def debug_get(ws: Any, p: DebugRef) -> DebugSessionInfo:
    """A debug session's state, pinned identity, slide, last event and the end of its output."""
    return _info(_entry(ws, p.debug_id), output=True)


class DebugListParams(Params):
    """The debug sessions (of one program, or all)."""

    program: ProgramRef | None = None


class DebugList(Result):
    """Debug sessions, newest last."""

    items: list[DebugSessionInfo]
    next_cursor: str | None = None


@method("debug.list", effect=READ_ONLY, requires=REQUIRES)
def debug_list(ws: Any, p: DebugListParams) -> DebugList:
    """The debug sessions, live and ended (of one program when `program` is given)."""
    entries = list(_sessions(ws).entries.values())
    if p.program is not None:
        handle = ws.program(p.program).handle
        entries = [e for e in entries if e.prog.handle == handle]
    return DebugList(items=[_info(e) for e in entries])


# --- execution ------------------------------------------------------------------------------------


class ResumeParams(Params):
    """Resume the target."""

    debug_id: DebugId
    wait_ms: WaitMs = 2000
    thread: int | None = Field(None, ge=1, description="The thread to step (default: gdb's current one).")


class StepParams(ResumeParams):
    """Step one instruction (or one source line when the program has line information)."""

    source_line: bool = Field(False, description="Step a source line instead of an instruction.")


def _resume(ws: Any, entry: DebugEntry, command: str, wait_ms: int, thread: int | None = None) -> StepResult:
    s = entry.session
    s.require_stopped()
    before = s.seq
    option = f" --thread {thread}" if thread is not None else ""
    s.command(f"{command}{option}", timeout=10, check=True)
    event = s.wait_event(before, wait_ms / 1000) if wait_ms else None
    return StepResult(state=s.state, event=_event(entry, event) if event else None)


@method("debug.continue", effect=LIFECYCLE, requires=REQUIRES)
def debug_continue(ws: Any, p: ResumeParams) -> StepResult:
    """Let the target run; answers at its next stop or after `wait_ms` (then `debug.wait` follows it)."""
    return _resume(ws, _entry(ws, p.debug_id), "-exec-continue", p.wait_ms, p.thread)


@method("debug.step", effect=LIFECYCLE, requires=REQUIRES)
def debug_step(ws: Any, p: StepParams) -> StepResult:
    """Step one instruction into calls (or one source line with `source_line`)."""
    cmd = "-exec-step" if p.source_line else "-exec-step-instruction"
    return _resume(ws, _entry(ws, p.debug_id), cmd, p.wait_ms, p.thread)


@method("debug.next", effect=LIFECYCLE, requires=REQUIRES)
def debug_next(ws: Any, p: StepParams) -> StepResult:
    """Step one instruction over calls (or one source line with `source_line`)."""
    cmd = "-exec-next" if p.source_line else "-exec-next-instruction"
    return _resume(ws, _entry(ws, p.debug_id), cmd, p.wait_ms, p.thread)


@method("debug.finish", effect=LIFECYCLE, requires=REQUIRES)
def debug_finish(ws: Any, p: ResumeParams) -> StepResult:
    """Run until the current function returns to its caller."""
    return _resume(ws, _entry(ws, p.debug_id), "-exec-finish", p.wait_ms, p.thread)


class RunToParams(PlaceParams):
    """Run until a place (a one-shot breakpoint)."""

    debug_id: DebugId
    selector: Selector | None = Field(None, description="A static place in the program (through the slide).")
    address: RuntimeAddress | None = None
    wait_ms: WaitMs = 2000


@method("debug.run_to", effect=LIFECYCLE, requires=REQUIRES)
def debug_run_to(ws: Any, p: RunToParams) -> StepResult:
    """Run until the target reaches a place (or another stop comes first)."""
    entry = _entry(ws, p.debug_id)
    entry.session.require_stopped()
    runtime = _runtime(ws, entry, p.address, p.selector, "selector")
    entry.session.command(f"-break-insert -t *{hex(runtime)}", timeout=10, check=True)
    return _resume(ws, entry, "-exec-continue", p.wait_ms)


class InterruptParams(Params):
    """Stop a running target."""

    debug_id: DebugId
    wait_ms: WaitMs = 5000


@method("debug.interrupt", effect=LIFECYCLE, requires=REQUIRES)
def debug_interrupt(ws: Any, p: InterruptParams) -> StepResult:
    """Stop a running target (a `signal` event with SIGINT)."""
    entry = _entry(ws, p.debug_id)
    s = entry.session
    s.check_alive()
    if s.state != "running":
        return StepResult(state=s.state)
    before = s.seq
    s.command("-exec-interrupt --all", timeout=10, check=True)
    event = s.wait_event(before, p.wait_ms / 1000) if p.wait_ms else None
    return StepResult(state=s.state, event=_event(entry, event) if event else None)


@method("debug.kill", effect=LIFECYCLE, requires=REQUIRES)
def debug_kill(ws: Any, p: DebugRef) -> DebugSessionInfo:
    """Kill the target and end the session (its `exited` event stays in the log)."""
    entry = _entry(ws, p.debug_id)
    s = entry.session
    s.check_alive()
    if s.state == "running":
        s.command("-exec-interrupt --all", timeout=10)
        s.wait_stop(5)
    if s.state == "stopped":
        s.command(KILL_COMMAND, timeout=10, check=True)
    s.mark_exited("killed by debug.kill")
    s.close()
    return _info(entry)


@method("debug.detach", effect=LIFECYCLE, requires=REQUIRES)
def debug_detach(ws: Any, p: DebugRef) -> DebugSessionInfo:
    """Detach from the target (it keeps running) and end the session."""
    entry = _entry(ws, p.debug_id)
    s = entry.session
    s.check_alive()
    if s.state == "running":
        s.command("-exec-interrupt --all", timeout=10)
        s.wait_stop(5)
    s.command("-target-detach", timeout=10, check=True)
    s.state = "detached"
    s.close()
    return _info(entry)


# --- events ---------------------------------------------------------------------------------------


class EventsParams(Params):
    """A page of a session's stop events."""

    debug_id: DebugId
    after_seq: int = Field(0, ge=0, description="Only events after this seq (the last one the client has seen).")
    page: Page = Field(default_factory=Page)


class EventPage(Result):
    """Stop events in seq order."""

    items: list[DebugEvent]
    next_cursor: str | None = None
    last_seq: int = Field(description="The seq of the last item (or after_seq): the next call's after_seq.")
    first_kept_seq: int = Field(description="The oldest seq still in the log (1000 events are kept).")
    state: str


@method("debug.events", effect=READ_ONLY, requires=REQUIRES)
def debug_events(ws: Any, p: EventsParams) -> EventPage:
    """A session's stop events (breakpoint, watchpoint, signal, step, exited) from its bounded log."""
    entry = _entry(ws, p.debug_id)
    qkey = query_key(p, exclude=("page", "program"))
    after = p.after_seq
    if p.page.cursor is not None:
        after = int(decode_cursor(p.page.cursor, entry.prog, qkey))
    items, last, first = entry.session.events(after, p.page.limit + 1)
    more = len(items) > p.page.limit
    items = items[: p.page.limit]
    last = items[-1]["seq"] if items else after
    return EventPage(
        items=[_event(entry, e) for e in items],
        next_cursor=encode_cursor(entry.prog, qkey, last) if more else None,
        last_seq=last,
        first_kept_seq=first,
        state=entry.session.state,
    )


class WaitParams(Params):
    """Wait for a session's next stop event."""

    debug_id: DebugId
    after_seq: int | None = Field(
        None, ge=0, description="Wait for an event after this seq; default: the newest when the target is not running."
    )
    timeout_ms: int = Field(5000, ge=0, le=60000, description="The longest wait.")


class WaitResult(Result):
    """The event waited for, or none when the wait timed out."""

    event: DebugEvent | None
    timed_out: bool
    state: str


@method("debug.wait", effect=READ_ONLY, requires=REQUIRES)
def debug_wait(ws: Any, p: WaitParams, ctx: CallContext) -> WaitResult:
    """Wait (at most `timeout_ms`) for a stop event: how stateless clients follow a running target."""
    entry = _entry(ws, p.debug_id)
    s = entry.session
    after = p.after_seq
    if after is None:
        if s.state != "running" and s.last_stop is not None:
            return WaitResult(event=_event(entry, s.last_stop), timed_out=False, state=s.state)
        after = s.seq
    event = s.wait_event(after, p.timeout_ms / 1000, lambda: ctx.cancelled)
    ctx.check_cancelled()
    return WaitResult(event=_event(entry, event) if event else None, timed_out=event is None, state=s.state)


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


_ASSIGNS = re.compile(r"(?<![=!<>])=(?!=)|\+\+|--")


def _check_condition(ws: Any, condition: str | None) -> None:
    """A read-only server refuses conditions that assign (a write the write methods would refuse)."""
    if condition and ws.read_only and _ASSIGNS.search(condition):
        raise BinlensError(
            "read_only",
            "the condition assigns, and the server is read-only",
            target="/params/condition",
            details={"requirement": "writable", "reason": "the server is read-only"},
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
    entry = _entry(ws, p.debug_id)
    entry.session.check_alive()
    _check_condition(ws, p.condition)
    runtime = _runtime(ws, entry, p.address, p.selector, "selector")
    flags = " -h" if p.hardware else ""
    if p.condition:
        flags += f" -c {mi_quote(p.condition)}"
    got = entry.session.command(f"-break-insert{flags} *{hex(runtime)}", timeout=10, check=True)
    number = int((got.get("bkpt") or {}).get("number", 0))
    static = _static(entry, runtime)
    info: dict[str, Any] = {
        "id": number,
        "kind": "hardware" if p.hardware else "software",
        "address": hex(runtime),
        "static_address": _hex(static),
        "condition": p.condition,
    }
    entry.breakpoints[number] = info
    return Breakpoint(**info, function=_function(entry, static))


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
        items.append(Breakpoint(**info, function=_function(entry, static), hits=hits.get(number)))
    return BreakpointList(items=items)


@method("breakpoint.list", effect=READ_ONLY, requires=REQUIRES)
def breakpoint_list(ws: Any, p: BreakpointListParams) -> BreakpointList:
    """A session's breakpoints with their hit counts."""
    return _listed(_entry(ws, p.debug_id), watch=False)


class BreakpointDeleteParams(Params):
    """Delete a breakpoint or watchpoint by id."""

    debug_id: DebugId
    id: int = Field(ge=1)


class Deleted(Result):
    """What was deleted."""

    id: int
    deleted: bool


def _delete(ws: Any, p: BreakpointDeleteParams, watch: bool) -> Deleted:
    entry = _entry(ws, p.debug_id)
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
    entry = _entry(ws, p.debug_id)
    entry.session.require_stopped()
    _check_condition(ws, p.condition)
    runtime = _runtime(ws, entry, p.address, p.selector, "selector")
    flag = {"write": "", "read": " -r", "access": " -a"}[p.access]
    got = entry.session.command(f"-break-watch{flag} *({_C_TYPES[p.size]}*){hex(runtime)}", timeout=10, check=True)
    wpt = got.get("wpt") or got.get("hw-rwpt") or got.get("hw-awpt") or {}
    number = int(wpt.get("number", 0))
    if p.condition:
        entry.session.command(f"-break-condition {number} {p.condition}", timeout=10, check=True)
    static = _static(entry, runtime)
    info: dict[str, Any] = {
        "id": number,
        "kind": "watchpoint",
        "address": hex(runtime),
        "static_address": _hex(static),
        "condition": p.condition,
        "size": p.size,
        "access": p.access,
    }
    entry.breakpoints[number] = info
    return Breakpoint(**info, function=None)


@method("watchpoint.list", effect=READ_ONLY, requires=REQUIRES)
def watchpoint_list(ws: Any, p: BreakpointListParams) -> BreakpointList:
    """A session's watchpoints with their hit counts."""
    return _listed(_entry(ws, p.debug_id), watch=True)


@method("watchpoint.delete", effect=LIFECYCLE, requires=REQUIRES)
def watchpoint_delete(ws: Any, p: BreakpointDeleteParams) -> Deleted:
    """Delete a watchpoint."""
    return _delete(ws, p, watch=True)


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


def _where(entry: DebugEntry, thread: int | None, frame: int) -> str:
    """MI's thread and frame options (gdb takes --frame only with --thread: the current one by default)."""
    if thread is None and frame == 0:
        return ""
    if thread is None:
        thread = (entry.session.last_stop or {}).get("thread") or 1
    return f" --thread {thread} --frame {frame}"


@method("register.get", effect=READ_ONLY, requires=REQUIRES)
def register_get(ws: Any, p: RegisterGetParams) -> Registers:
    """Register values of the stopped target (a thread and frame; default the current thread, frame 0)."""
    entry = _entry(ws, p.debug_id)
    entry.session.require_stopped()
    names = _register_names(entry)
    numbers: list[int] = [] if p.names is not None else _general_registers(entry)
    if p.names is not None:
        for i, name in enumerate(p.names):
            if name not in names:
                raise BinlensError("not_found", f"no register {name!r}", target=f"/params/names/{i}")
            numbers.append(names.index(name))
    where = _where(entry, p.thread, p.frame)
    got = entry.session.command(
        f"-data-list-register-values{where} --skip-unavailable x {' '.join(map(str, numbers))}".rstrip(),
        timeout=10,
        check=True,
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
    entry = _entry(ws, p.debug_id)
    entry.session.require_stopped()
    if p.name not in _register_names(entry):
        raise BinlensError("not_found", f"no register {p.name!r}", target="/params/name")
    where = _where(entry, p.thread, p.frame)
    entry.session.command(
        f"-data-evaluate-expression{where} {mi_quote(f'${p.name}={p.value}')}", timeout=10, check=True
    )
    return register_get(ws, RegisterGetParams(debug_id=p.debug_id, names=[p.name], thread=p.thread, frame=p.frame))


class MemoryReadParams(PlaceParams):
    """Bytes of the target's memory."""

    debug_id: DebugId
    address: RuntimeAddress | None = None
    selector: Selector | None = Field(None, description="A place of the program (static, through the slide).")
    size: int = Field(ge=1, le=MAX_READ)


class MemoryBytes(Result):
    """Bytes read from the target."""

    address: HexAddress
    static_address: HexAddress | None = None
    size: int
    bytes: str = Field(description="Hex bytes.")


def _memory_error(err: BinlensError, where: str) -> BinlensError:
    if err.code == "invalid_argument":
        err.target = f"/params/{where}"
    return err


@method("debug_memory.read", effect=READ_ONLY, requires=REQUIRES)
def debug_memory_read(ws: Any, p: MemoryReadParams) -> MemoryBytes:
    """Read up to 64 KiB of the stopped target's memory at a runtime address or a static selector."""
    entry = _entry(ws, p.debug_id)
    entry.session.require_stopped()
    where = "address" if p.address is not None else "selector"
    runtime = _runtime(ws, entry, p.address, p.selector, where)
    try:
        got = entry.session.command(f"-data-read-memory-bytes {hex(runtime)} {p.size}", timeout=10, check=True)
    except BinlensError as err:
        raise _memory_error(err, where) from None
    blocks = got.get("memory") or []
    data = "".join(str(b.get("contents", "")) for b in blocks if isinstance(b, dict))
    if len(data) != 2 * p.size:
        raise BinlensError(
            "invalid_argument", f"cannot read {p.size} bytes at {hex(runtime)}", target=f"/params/{where}"
        )
    return MemoryBytes(address=hex(runtime), static_address=_hex(_static(entry, runtime)), size=p.size, bytes=data)


class MemoryWriteParams(PlaceParams):
    """Write bytes into the target's memory."""

    debug_id: DebugId
    address: RuntimeAddress | None = None
    selector: Selector | None = None
    bytes: str = Field(min_length=2, max_length=2 * MAX_READ, pattern=r"^([0-9a-fA-F]{2})+$", description="Hex bytes.")


@method("debug_memory.write", effect=MUTATION, requires=REQUIRES)
def debug_memory_write(ws: Any, p: MemoryWriteParams) -> MemoryBytes:
    """Write up to 64 KiB into the stopped target's memory (refused on a read-only server)."""
    entry = _entry(ws, p.debug_id)
    entry.session.require_stopped()
    where = "address" if p.address is not None else "selector"
    runtime = _runtime(ws, entry, p.address, p.selector, where)
    try:
        entry.session.command(f"-data-write-memory-bytes {hex(runtime)} {p.bytes.lower()}", timeout=10, check=True)
    except BinlensError as err:
        raise _memory_error(err, where) from None
    size = len(p.bytes) // 2
    return MemoryBytes(
        address=hex(runtime), static_address=_hex(_static(entry, runtime)), size=size, bytes=p.bytes.lower()
    )


# --- stack, threads, maps, addresses --------------------------------------------------------------


class BacktraceParams(Params):
    """The call stack of a stopped thread."""

    debug_id: DebugId
    thread: int | None = Field(None, ge=1)
    limit: int = Field(64, ge=1, le=1024)


class Frame(Result):
    """One stack frame."""

    level: int
    address: HexAddress
    static_address: HexAddress | None = None
    function: FunctionRef | None = Field(None, description="The program's function (binlens's name).")
    gdb_function: str | None = Field(None, description="gdb's name for frames outside the program.")
    module: str | None = None


class Backtrace(Result):
    """Frames, innermost first."""

    frames: list[Frame]


@method("backtrace.get", effect=READ_ONLY, requires=REQUIRES)
def backtrace_get(ws: Any, p: BacktraceParams) -> Backtrace:
    """The stopped thread's call stack, with the program's frames named by binlens."""
    entry = _entry(ws, p.debug_id)
    entry.session.require_stopped()
    _locate(entry)
    option = f" --thread {p.thread}" if p.thread is not None else ""
    got = entry.session.command(f"-stack-list-frames{option} 0 {p.limit - 1}", timeout=10, check=True)
    frames: list[Frame] = []
    for item in got.get("stack") or []:
        row = item.get("frame", item) if isinstance(item, dict) else {}
        address = int(str(row.get("addr", "0")), 16)
        static = _static(entry, address)
        func = row.get("func")
        frames.append(
            Frame(
                level=int(row.get("level", len(frames))),
                address=hex(address),
                static_address=_hex(static),
                function=_function(entry, static),
                gdb_function=None if func in (None, "??") else str(func),
                module=str(row["from"]) if row.get("from") else (entry.prog.path.name if static is not None else None),
            )
        )
    return Backtrace(frames=frames)


class ThreadListParams(Params):
    """The target's threads."""

    debug_id: DebugId


class ThreadInfo(Result):
    """One thread."""

    id: int
    target_id: str
    name: str | None = None
    state: str
    address: HexAddress | None = None
    static_address: HexAddress | None = None
    current: bool


class ThreadList(Result):
    """Threads."""

    items: list[ThreadInfo]
    next_cursor: str | None = None


@method("thread.list", effect=READ_ONLY, requires=REQUIRES)
def thread_list(ws: Any, p: ThreadListParams) -> ThreadList:
    """The target's threads: id, kernel id, state and where each one is."""
    entry = _entry(ws, p.debug_id)
    got = entry.session.command("-thread-info", timeout=10, check=True)
    _locate(entry)
    current = str(got.get("current-thread-id", ""))
    items = []
    for t in got.get("threads") or []:
        frame = t.get("frame") or {}
        address = int(frame["addr"], 16) if isinstance(frame, dict) and frame.get("addr") else None
        items.append(
            ThreadInfo(
                id=int(t.get("id", 0)),
                target_id=str(t.get("target-id", "")),
                name=t.get("name"),
                state=str(t.get("state", "")),
                address=_hex(address),
                static_address=_hex(_static(entry, address)),
                current=str(t.get("id")) == current,
            )
        )
    return ThreadList(items=items)


class MemoryMapParams(Params):
    """The target's memory mappings."""

    debug_id: DebugId
    page: Page = Field(default_factory=Page)


class MapItem(Result):
    """One mapping, with the base and slide of the module it belongs to."""

    start: HexAddress
    end: HexAddress
    perms: str
    offset: int
    path: str
    module_base: HexAddress | None = None
    slide: HexAddress | None = Field(None, description="The module's runtime base - its link-time base (ELF modules).")
    program: bool = Field(description="The mapping is the program's file.")


def _link_base(path: str, cache: dict[str, int | None]) -> int | None:
    """The lowest PT_LOAD address of an ELF file (its link-time base), or None."""
    if path in cache:
        return cache[path]
    base = None
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] == b"\x7fELF" and head[4] == 2 and head[5] == 1:
                phoff = int.from_bytes(head[32:40], "little")
                phentsize = int.from_bytes(head[54:56], "little")
                phnum = int.from_bytes(head[56:58], "little")
                f.seek(phoff)
                table = f.read(phentsize * min(phnum, 256))
                loads = [
                    int.from_bytes(table[i + 16 : i + 24], "little")
                    for i in range(0, len(table) - 55, phentsize)
                    if int.from_bytes(table[i : i + 4], "little") == 1
                ]
                base = min(loads) & ~0xFFF if loads else None
    except OSError:
        base = None
    cache[path] = base
    return base


def _map_items(entry: Located) -> list[MapItem]:
    ident = entry.identity
    assert ident is not None
    maps = read_maps(ident.pid)
    _locate(entry)
    bases: dict[tuple[int, int], int] = {}
    for m in maps:
        if m.inode:
            key = (m.device, m.inode)
            bases[key] = min(bases.get(key, m.start - m.offset), m.start - m.offset)
    links: dict[str, int | None] = {}
    items = []
    for m in maps:
        mine = m.inode != 0 and (m.device, m.inode) == (ident.exe_device, ident.exe_inode)
        base = bases.get((m.device, m.inode)) if m.inode else None
        slide = None
        if mine:
            slide = entry.slide
        elif base is not None and m.path.startswith("/"):
            link = _link_base(m.path, links)
            slide = None if link is None else base - link
        items.append(
            MapItem(
                start=hex(m.start),
                end=hex(m.end),
                perms=m.perms,
                offset=m.offset,
                path=m.path,
                module_base=_hex(base),
                slide=_hex(slide),
                program=mine,
            )
        )
    return items


class MapList(Result):
    """Mappings in address order."""

    items: list[MapItem]
    next_cursor: str | None = None


@method("memory_map.list", effect=READ_ONLY, requires=REQUIRES)
def memory_map_list(ws: Any, p: MemoryMapParams) -> MapList:
    """The target's memory mappings (/proc/PID/maps) with each module's base and slide."""
    entry = _entry(ws, p.debug_id)
    entry.session.check_alive()
    items = _map_items(entry)
    qkey = query_key(p, exclude=("page", "program"))
    start = int(decode_cursor(p.page.cursor, entry.prog, qkey)) if p.page.cursor else 0
    chunk = items[start : start + p.page.limit]
    more = start + p.page.limit < len(items)
    return MapList(items=chunk, next_cursor=encode_cursor(entry.prog, qkey, start + p.page.limit) if more else None)


class ResolveParams(Params):
    """A runtime address to resolve."""

    debug_id: DebugId
    address: RuntimeAddress


class Resolved(Result):
    """Where a runtime address is: its module, and in the program its static address and function."""

    address: HexAddress
    module: str | None = None
    module_base: HexAddress | None = None
    slide: HexAddress | None = None
    program: bool
    static_address: HexAddress | None = None
    function: FunctionRef | None = None
    perms: str | None = None


@method("debug_address.resolve", effect=READ_ONLY, requires=REQUIRES)
def debug_address_resolve(ws: Any, p: ResolveParams) -> Resolved:
    """A runtime address → its module, the module's slide, and (in the program) the static address and function."""
    entry = _entry(ws, p.debug_id)
    entry.session.check_alive()
    runtime = int(p.address, 16)
    for item in _map_items(entry):
        if int(item.start, 16) <= runtime < int(item.end, 16):
            static = _static(entry, runtime) if item.program else None
            return Resolved(
                address=hex(runtime),
                module=item.path or None,
                module_base=item.module_base,
                slide=item.slide,
                program=item.program,
                static_address=_hex(static),
                function=_function(entry, static),
                perms=item.perms,
            )
    return Resolved(address=hex(runtime), program=False)
