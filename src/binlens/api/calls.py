"""The calls running on each open program, so that closing it drains them: they are cancelled,
waited for (a bounded time), and named when they outlast it."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from binlens.jobs import state as job_state

if TYPE_CHECKING:
    from binlens.api.registry import CallContext, MethodSpec
    from binlens.workspace import Program, Workspace

KEY = "api.calls"  # Program.extensions key of its ProgramCalls


class ProgramCalls:
    """The method calls running on one program."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._running: dict[int, tuple[str, CallContext]] = {}
        self._ids = itertools.count(1)

    @contextmanager
    def running(self, name: str, ctx: CallContext) -> Iterator[None]:
        """Count the call `name` as running on the program while the block runs."""
        with self._idle:
            key = next(self._ids)
            self._running[key] = (name, ctx)
        try:
            yield
        finally:
            with self._idle:
                del self._running[key]
                self._idle.notify_all()

    def drain(self, timeout_s: float | None = None) -> list[str]:
        """Cancel every running call and wait up to `timeout_s` (the close drain bound) for them
        to end; the calls still running after that, named."""
        limit = job_state.CLOSE_DRAIN_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        with self._idle:
            for _name, ctx in self._running.values():
                ctx.cancel()
            while self._running and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
            return [f"call {name} ({ctx.client})" for name, ctx in self._running.values()]


def on_open(_ws: Workspace, prog: Program) -> None:
    """Track the program's calls from its open on (`components.OPEN_HOOKS`, first: closing the
    program cancels its calls before it stops its analysis)."""
    calls = ProgramCalls()
    prog.extensions[KEY] = calls
    prog.on_close.append(calls.drain)


def program_of_call(ws: Workspace, spec: MethodSpec, params: dict[str, Any]) -> Program | None:
    """The open program a call runs on (its `program`, or the only open one), None for calls that
    concern no program or open and close programs themselves."""
    if spec.domain == "program" and spec.operation in ("open", "close"):
        return None
    if "program" not in spec.params_model.model_fields:
        return None
    ref = params.get("program")
    if isinstance(ref, str):
        return ws.programs.get(ref)
    if ref is None and len(ws.programs) == 1:
        return next(iter(ws.programs.values()))
    return None


@contextmanager
def tracked(ws: Workspace, spec: MethodSpec, params: dict[str, Any], ctx: CallContext) -> Iterator[None]:
    """Count the call as running on its program (if it has one) while the block runs."""
    prog = program_of_call(ws, spec, params)
    calls = prog.extensions.get(KEY) if prog is not None else None
    if not isinstance(calls, ProgramCalls):
        yield
        return
    with calls.running(spec.name, ctx):
        yield
