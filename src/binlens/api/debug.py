"""debug.*: start or attach a debug session, run and step the target, read its stop events (the
shared ground is `api/debug_target.py`)."""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import Field

from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.debug_target import (
    MAX_LIVE,
    REQUIRES,
    DebugEntry,
    DebugEvent,
    DebugId,
    DebugSessionInfo,
    Line,
    PlaceParams,
    RuntimeAddress,
    StepResult,
    TimeoutMs,
    WaitMs,
    entry_of,
    event_record,
    listeners,
    runtime_of,
    session_info,
    sessions_of,
)
from binlens.api.models import Page, Params, ProgramRef, Result, Selector
from binlens.api.registry import LIFECYCLE, READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of
from binlens.providers import registry as providers
from binlens.providers.gdb import KILL_COMMAND, GdbSession
from binlens.providers.target import TargetIdentity

# --- start, attach, list --------------------------------------------------------------------------


def _new_session(ws: Any, prog: Any) -> tuple[DebugEntry, GdbSession]:
    provider, _ = providers.choose("auto", "debugger")
    table = sessions_of(ws)
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
        event = event_record(entry, raw, wait=0).model_dump(mode="json")
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
    sessions_of(ws).add(entry)
    return session_info(entry)


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
    sessions_of(ws).add(entry)
    return session_info(entry)


class DebugRef(Params):
    """One debug session."""

    debug_id: DebugId


@method("debug.get", effect=READ_ONLY, requires=REQUIRES)
def debug_get(ws: Any, p: DebugRef) -> DebugSessionInfo:
    """A debug session's state, pinned identity, slide, last event and the end of its output."""
    return session_info(entry_of(ws, p.debug_id), output=True)


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
    entries = list(sessions_of(ws).entries.values())
    if p.program is not None:
        handle = ws.program(p.program).handle
        entries = [e for e in entries if e.prog.handle == handle]
    return DebugList(items=[session_info(e) for e in entries])


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
    return StepResult(state=s.state, event=event_record(entry, event) if event else None)


@method("debug.continue", effect=LIFECYCLE, requires=REQUIRES)
def debug_continue(ws: Any, p: ResumeParams) -> StepResult:
    """Let the target run; answers at its next stop or after `wait_ms` (then `debug.wait` follows it)."""
    return _resume(ws, entry_of(ws, p.debug_id), "-exec-continue", p.wait_ms, p.thread)


@method("debug.step", effect=LIFECYCLE, requires=REQUIRES)
def debug_step(ws: Any, p: StepParams) -> StepResult:
    """Step one instruction into calls (or one source line with `source_line`)."""
    cmd = "-exec-step" if p.source_line else "-exec-step-instruction"
    return _resume(ws, entry_of(ws, p.debug_id), cmd, p.wait_ms, p.thread)


@method("debug.next", effect=LIFECYCLE, requires=REQUIRES)
def debug_next(ws: Any, p: StepParams) -> StepResult:
    """Step one instruction over calls (or one source line with `source_line`)."""
    cmd = "-exec-next" if p.source_line else "-exec-next-instruction"
    return _resume(ws, entry_of(ws, p.debug_id), cmd, p.wait_ms, p.thread)


@method("debug.finish", effect=LIFECYCLE, requires=REQUIRES)
def debug_finish(ws: Any, p: ResumeParams) -> StepResult:
    """Run until the current function returns to its caller."""
    return _resume(ws, entry_of(ws, p.debug_id), "-exec-finish", p.wait_ms, p.thread)


class RunToParams(PlaceParams):
    """Run until a place (a one-shot breakpoint)."""

    debug_id: DebugId
    selector: Selector | None = Field(None, description="A static place in the program (through the slide).")
    address: RuntimeAddress | None = None
    wait_ms: WaitMs = 2000


@method("debug.run_to", effect=LIFECYCLE, requires=REQUIRES)
def debug_run_to(ws: Any, p: RunToParams) -> StepResult:
    """Run until the target reaches a place (or another stop comes first)."""
    entry = entry_of(ws, p.debug_id)
    entry.session.require_stopped()
    runtime = runtime_of(ws, entry, p.address, p.selector, "selector")
    entry.session.command(f"-break-insert -t *{hex(runtime)}", timeout=10, check=True)
    return _resume(ws, entry, "-exec-continue", p.wait_ms)


class InterruptParams(Params):
    """Stop a running target."""

    debug_id: DebugId
    wait_ms: WaitMs = 5000


@method("debug.interrupt", effect=LIFECYCLE, requires=REQUIRES)
def debug_interrupt(ws: Any, p: InterruptParams) -> StepResult:
    """Stop a running target (a `signal` event with SIGINT)."""
    entry = entry_of(ws, p.debug_id)
    s = entry.session
    s.check_alive()
    if s.state != "running":
        return StepResult(state=s.state)
    before = s.seq
    s.command("-exec-interrupt --all", timeout=10, check=True)
    event = s.wait_event(before, p.wait_ms / 1000) if p.wait_ms else None
    return StepResult(state=s.state, event=event_record(entry, event) if event else None)


def _stop_running(s: GdbSession) -> None:
    """Stop a running target (at most 5 s) before ending its session."""
    s.check_alive()
    if s.state == "running":
        s.command("-exec-interrupt --all", timeout=10)
        s.wait_stop(5)


@method("debug.kill", effect=LIFECYCLE, requires=REQUIRES)
def debug_kill(ws: Any, p: DebugRef) -> DebugSessionInfo:
    """Kill the target and end the session (its `exited` event stays in the log)."""
    entry = entry_of(ws, p.debug_id)
    s = entry.session
    _stop_running(s)
    if s.state == "stopped":
        s.command(KILL_COMMAND, timeout=10, check=True)
    s.mark_exited("killed by debug.kill")
    s.close()
    return session_info(entry)


@method("debug.detach", effect=LIFECYCLE, requires=REQUIRES)
def debug_detach(ws: Any, p: DebugRef) -> DebugSessionInfo:
    """Detach from the target (it keeps running) and end the session."""
    entry = entry_of(ws, p.debug_id)
    s = entry.session
    _stop_running(s)
    s.command("-target-detach", timeout=10, check=True)
    s.state = "detached"
    s.close()
    return session_info(entry)


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
    entry = entry_of(ws, p.debug_id)
    qkey = query_key(p, exclude=("page", "program"))
    after = p.after_seq
    if p.page.cursor is not None:
        after = int(decode_cursor(p.page.cursor, entry.prog, qkey))
    items, last, first = entry.session.events(after, p.page.limit + 1)
    more = len(items) > p.page.limit
    items = items[: p.page.limit]
    last = items[-1]["seq"] if items else after
    return EventPage(
        items=[event_record(entry, e) for e in items],
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
    entry = entry_of(ws, p.debug_id)
    s = entry.session
    after = p.after_seq
    if after is None:
        if s.state != "running" and s.last_stop is not None:
            return WaitResult(event=event_record(entry, s.last_stop), timed_out=False, state=s.state)
        after = s.seq
    event = s.wait_event(after, p.timeout_ms / 1000, lambda: ctx.cancelled)
    ctx.check_cancelled()
    return WaitResult(event=event_record(entry, event) if event else None, timed_out=event is None, state=s.state)
