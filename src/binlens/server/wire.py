"""JSON text in and out of every transport (stdio, /mcp, legacy SSE, /ws), without surprises.

`decode` turns one frame into a message or raises `FrameError` with a JSON-RPC code and a message
of our own (Python's decoder text says nothing useful to a client): bytes that are not UTF-8 or
not JSON, nesting deeper than the parser's recursion limit, and strings holding a lone surrogate
(`"\\ud800"` is valid JSON grammar but no Unicode text, so it can be neither echoed in UTF-8 nor
used as a name). `dumps`/`dump_bytes` never fail on text: a message that cannot be written as
UTF-8 is written with ASCII escapes instead.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeGuard

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

# A \uD800-\uDFFF escape in the raw text: the only way a lone surrogate gets into a decoded string
# (raw surrogate bytes are not UTF-8 and fail decoding). Valid pairs match too; the walk decides.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE_ESCAPE_B = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# json.loads joins valid pairs into one code point, so any surrogate left in a str is a lone one.
_SURROGATE = re.compile("[\ud800-\udfff]")


class FrameError(Exception):
    """A frame that cannot be served: the JSON-RPC error to answer with, and the id to echo (if any)."""

    def __init__(self, code: int, message: str, msg_id: Any = None, *, identifiable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = msg_id
        self.identifiable = identifiable


def valid_id(value: Any) -> TypeGuard[str | int]:
    """A JSON-RPC id this server echoes: a string or an integer (not a bool)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(data: bytes | str, *, reject_constants: bool = False) -> Any:
    """One frame as a Python value; raises FrameError (-32700 or -32600) instead of any parser error."""
    try:
        msg = json.loads(data, parse_constant=_reject_constant if reject_constants else None)
    except RecursionError:
        raise FrameError(PARSE_ERROR, "Parse error: the message nests deeper than the server accepts") from None
    except UnicodeDecodeError:
        raise FrameError(PARSE_ERROR, "Parse error: the message is not UTF-8 text") from None
    except ValueError:
        raise FrameError(PARSE_ERROR, "Parse error: the message is not valid JSON") from None
    if isinstance(data, bytes):
        escaped = _SURROGATE_ESCAPE_B.search(data) is not None
    else:
        escaped = _SURROGATE_ESCAPE.search(data) is not None
    if escaped:
        where = lone_surrogate_at(msg)
        if where is not None:
            rid = msg.get("id") if isinstance(msg, dict) else None
            ok = valid_id(rid) and not (isinstance(rid, str) and _SURROGATE.search(rid))
            raise FrameError(
                INVALID_REQUEST,
                f"Invalid Request: the string at {where or '/'} is not Unicode text (a lone surrogate escape)",
                rid if ok else None,
                identifiable=ok,
            )
    return msg


def _pointer_token(key: Any) -> str:
    text = _SURROGATE.sub("\ufffd", str(key))  # the pointer itself must be printable
    return text.replace("~", "~0").replace("/", "~1")


def lone_surrogate_at(value: Any) -> str | None:
    """RFC 6901 pointer of the first key or string holding a lone surrogate, else None (iterative)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return where
        elif isinstance(item, dict):
            for key, sub in item.items():
                path = f"{where}/{_pointer_token(key)}"
                if _SURROGATE.search(key):
                    return path
                stack.append((path, sub))
        elif isinstance(item, list):
            stack.extend((f"{where}/{i}", sub) for i, sub in enumerate(item))
    return None


def dumps(message: Any) -> str:
    """Compact JSON text that encodes as UTF-8 (ASCII escapes when a string holds a lone surrogate)."""
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    if _SURROGATE.search(text) is None:
        return text
    return json.dumps(message, separators=(",", ":"))


def dump_bytes(message: Any) -> bytes:
    """`dumps` as UTF-8 bytes."""
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":")).encode()
