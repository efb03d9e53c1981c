"""`binlens query`: one JSON request in, one JSON object out (SPEC "Shapes")."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from binlens import __version__
from binlens.api import invoke
from binlens.api.registry import CallContext, program_identity
from binlens.errors import BinlensError
from binlens.workspace import Workspace

SCHEMA_VERSION = 1


def envelope(
    method: Any,
    program: dict[str, Any] | None,
    *,
    result: Any = None,
    error: BinlensError | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    """The one-shot CLI's output object; `warnings` (the call's caveats, `CallContext.warn`) only
    when there are some."""
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "binlens": __version__,
        "method": method,
        "program": program,
    }
    if error is not None:
        out["error"] = error.to_dict()
    else:
        out["result"] = result
    if warnings:
        out["warnings"] = list(warnings)
    return out


def parse_request(text: str) -> tuple[str, dict[str, Any]]:
    """Split a request document into method and params; usage errors are `invalid_argument`."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise BinlensError("invalid_argument", f"the request is not JSON: {err.msg} at {err.pos}", target="") from None
    if not isinstance(doc, dict):
        raise BinlensError("invalid_argument", "the request must be a JSON object", target="")
    extra = set(doc) - {"method", "params"}
    if extra:
        key = sorted(extra)[0]
        raise BinlensError("invalid_argument", f"unknown request field {key!r}", target=f"/{key}")
    method = doc.get("method")
    if not isinstance(method, str):
        raise BinlensError("invalid_argument", "'method' must be a string like 'function.list'", target="/method")
    params = doc.get("params", {})
    if not isinstance(params, dict):
        raise BinlensError("invalid_argument", "'params' must be an object", target="/params")
    return method, params


def run_query(ws: Workspace, text: str, files: list[str]) -> int:
    """Open `files`, run the request, print one JSON object; return the exit status."""
    method: Any = None
    program = None
    try:
        method, params = parse_request(text)
    except BinlensError as err:
        _emit(envelope(None, None, error=err))
        return 2
    ctx = CallContext()
    try:
        with sigint_cancels(ctx):
            for f in files:
                open_binary(ws, f)
            ctx.check_cancelled()
            program = program_identity(ws, method, params)
            result = invoke(ws, method, params, ctx)
    except BinlensError as err:
        _emit(envelope(method, program, error=err, warnings=ctx.warnings))
        return 2 if err.target == "/method" and err.code == "not_found" else 1
    _emit(
        envelope(method, program or program_identity(ws, method, params, result), result=result, warnings=ctx.warnings)
    )
    return 0


def open_binary(ws: Workspace, path: str) -> None:
    """Open a `-b FILE`; its failure names the file in `details.binary`, with no `target`: the
    request document has no field it could point at."""
    try:
        ws.open(path, check_roots=False)
    except BinlensError as err:
        raise BinlensError(err.code, err.message, details={**err.details, "binary": path}) from None


@contextlib.contextmanager
def sigint_cancels(ctx: CallContext) -> Iterator[None]:
    """While the call runs, SIGINT cancels it as a server's client would (the analysis process is
    killed, the call answers `cancelled`); a second SIGINT interrupts at once (exit status 130).
    It applies even when SIGINT came in ignored, as for a background job: a one-shot query that is
    sent SIGINT is meant to stop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cancel(_signum: int, _frame: object) -> None:
        if ctx.cancelled:
            raise KeyboardInterrupt
        ctx.cancel()

    previous = signal.signal(signal.SIGINT, cancel)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()
