"""`binlens query`: one JSON request in, one JSON object out (SPEC "Shapes")."""

from __future__ import annotations

import json
import sys
from typing import Any

from binlens import __version__
from binlens.api import invoke
from binlens.api.registry import program_identity
from binlens.errors import BinlensError
from binlens.workspace import Workspace

SCHEMA_VERSION = 1


def envelope(
    method: Any, program: dict[str, Any] | None, *, result: Any = None, error: BinlensError | None = None
) -> dict[str, Any]:
    """The one-shot CLI's output object."""
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
    try:
        for f in files:
            ws.open(f, check_roots=False)
        program = program_identity(ws, method, params)
        result = invoke(ws, method, params)
    except BinlensError as err:
        _emit(envelope(method, program, error=err))
        return 2 if err.target == "/method" and err.code == "not_found" else 1
    _emit(envelope(method, program or program_identity(ws, method, params, result), result=result))
    return 0


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()
