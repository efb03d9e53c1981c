"""debug_variable.*: a stopped frame's arguments and local variables, and expressions over them, from
the target's debug information (DWARF, in the file or a separate debug file gdb finds) through gdb.

Values are gdb's text (`print` formatting: arrays and strings cut at 200 elements by gdb, each value
cut at `max_value_chars` here). Reading never runs the target's code: gdb's `may-call-functions`
is off in every session, and an expression that assigns is refused."""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from pydantic import Field

from binlens.api.debug_target import (
    REQUIRES,
    DebugId,
    FunctionRef,
    assigns,
    entry_of,
    frame_error,
    frame_options,
    framed_command,
    function_ref,
    hex_text,
    locate,
    static_of,
)
from binlens.api.models import HexAddress, Params, Result
from binlens.api.registry import READ_ONLY, method
from binlens.errors import BinlensError
from binlens.providers.gdb import mi_quote

MAX_VARIABLES = 256  # variables listed per frame


class FrameParams(Params):
    """A frame of a stopped thread."""

    debug_id: DebugId
    thread: int | None = Field(None, ge=1, description="The thread (default: the one that stopped).")
    frame: int = Field(0, ge=0, le=10000, description="The frame's level (0: innermost).")
    max_value_chars: int = Field(1024, ge=16, le=16384, description="Each value is cut after this many characters.")


class Variable(Result):
    """An argument or a local variable of a frame."""

    name: str
    kind: Literal["argument", "local"]
    type: str | None = Field(None, description="gdb's name of its type.")
    value: str | None = Field(None, description="gdb's text of the value ('<optimized out>' when DWARF has none here).")
    truncated: bool = Field(False, description="The value was cut at max_value_chars.")


class SourcePlace(Result):
    """Where a frame is in the source (from the line table)."""

    file: str
    line: int | None = None


class FrameVariables(Result):
    """A frame and its arguments and locals (arguments first, in declaration order)."""

    thread: int | None
    level: int
    address: HexAddress | None = Field(None, description="The frame's runtime pc.")
    static_address: HexAddress | None = None
    function: FunctionRef | None = Field(None, description="The program's function (binlens's name).")
    gdb_function: str | None = Field(None, description="The function's name in the debug information (or gdb's).")
    source: SourcePlace | None = None
    debug_info: bool = Field(
        description="False: the frame has no debug information (no DWARF for its code), so no variables are known."
    )
    items: list[Variable]
    truncated: bool = Field(False, description="The frame has more than 256 variables; the first 256 are listed.")


def _cut(text: Any, limit: int) -> tuple[str | None, bool]:
    if text is None:
        return None, False
    value = str(text)
    return (value[:limit], True) if len(value) > limit else (value, False)


@method("debug_variable.list", effect=READ_ONLY, requires=REQUIRES)
def debug_variable_list(ws: Any, p: FrameParams) -> FrameVariables:
    """The arguments and local variables of a stopped frame, with their types and values, from the
    debug information (frame 0 of the stopped thread by default)."""
    entry = entry_of(ws, p.debug_id)
    entry.session.require_stopped()
    thread = p.thread or (entry.session.last_stop or {}).get("thread") or 1
    where = f" --thread {thread} --frame {p.frame}"
    frame = framed_command(entry, f"-stack-info-frame{where}").get("frame") or {}
    listed = f"-stack-list-variables{where} --skip-unavailable"
    typed = framed_command(entry, f"{listed} --simple-values").get("variables") or []
    valued = framed_command(entry, f"{listed} --all-values").get("variables") or []
    items = []
    for i, row in enumerate(typed[:MAX_VARIABLES]):
        if not isinstance(row, dict):
            continue
        full = valued[i] if i < len(valued) and isinstance(valued[i], dict) else {}
        value, cut = _cut(full.get("value", row.get("value")), p.max_value_chars)
        items.append(
            Variable(
                name=str(row.get("name", "")),
                kind="argument" if row.get("arg") == "1" else "local",
                type=str(row["type"]) if row.get("type") is not None else None,
                value=value,
                truncated=cut,
            )
        )
    locate(entry)
    address = int(frame["addr"], 16) if isinstance(frame.get("addr"), str) else None
    static = static_of(entry, address)
    source = (
        SourcePlace(
            file=str(frame.get("fullname") or frame["file"]), line=int(frame["line"]) if frame.get("line") else None
        )
        if frame.get("file")
        else None
    )
    func = frame.get("func")
    return FrameVariables(
        thread=thread,
        level=int(frame.get("level", p.frame)),
        address=hex_text(address),
        static_address=hex_text(static),
        function=function_ref(entry, static),
        gdb_function=None if func in (None, "??") else str(func),
        source=source,
        debug_info=source is not None or bool(items),
        items=items,
        truncated=len(typed) > MAX_VARIABLES,
    )


class EvaluateParams(FrameParams):
    """An expression over a stopped frame's variables, registers and memory."""

    expression: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[^\n\r\x00]*$",
        description="A gdb expression in the frame's language: 'total', 'argv[1]', '*p', 'buf[3] + $rdi'.",
    )


class Evaluated(Result):
    """An expression's value in a frame."""

    expression: str
    type: str | None = Field(None, description="gdb's name of its type.")
    value: str = Field(description="gdb's text of the value.")
    truncated: bool = False


@method("debug_variable.evaluate", effect=READ_ONLY, requires=REQUIRES)
def debug_variable_evaluate(ws: Any, p: EvaluateParams) -> Evaluated:
    """The value of an expression in a stopped frame (its variables from the debug information,
    registers as $rip, memory); expressions that assign or call the target's functions are refused."""
    if assigns(p.expression):
        raise BinlensError(
            "invalid_argument",
            "the expression assigns; write with register.set or debug_memory.write",
            target="/params/expression",
            details={"reason": "assigns"},
        )
    entry = entry_of(ws, p.debug_id)
    entry.session.require_stopped()
    where = frame_options(entry, p.thread, p.frame)
    try:
        got = entry.session.command(
            f"-data-evaluate-expression{where} {mi_quote(p.expression)}", timeout=10, check=True
        )
    except BinlensError as err:
        err = frame_error(err)
        if err.code == "invalid_argument" and err.target is None:
            err.target = "/params/expression"
        raise err from None
    var: dict[str, Any] = {}
    with contextlib.suppress(BinlensError):  # (the type only: a value without one is still answered)
        var = entry.session.command(f"-var-create{where} - * {mi_quote(p.expression)}", timeout=10)
        if var.get("name"):
            entry.session.command(f"-var-delete {var['name']}", timeout=10)
    value, cut = _cut(got.get("value", ""), p.max_value_chars)
    return Evaluated(
        expression=p.expression,
        type=str(var["type"]) if var.get("type") is not None else None,
        value=value or "",
        truncated=cut,
    )
