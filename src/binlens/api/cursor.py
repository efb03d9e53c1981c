"""Opaque page cursors, bound to the program and the query that made them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from pydantic import BaseModel

from binlens.errors import BinlensError
from binlens.workspace import Program

# Cursors are signed with the program's `cursor_key`, a key kept under the binlens home, so a
# cursor from one process (one `binlens query`) pages on in the next process using that home.


def query_key(params: BaseModel, exclude: tuple[str, ...] = ("page", "program")) -> str:
    """A stable hash of the query's parameters (everything but paging and the handle)."""
    data = params.model_dump(mode="json", exclude=set(exclude))
    if isinstance(data.get("scan"), dict):
        data["scan"] = {k: v for k, v in data["scan"].items() if k != "timeout_ms"}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_cursor(prog: Program, qkey: str, position: Any) -> str:
    """An opaque cursor for `position` in the query `qkey` over `prog`, signed with its home's key."""
    return encode_scoped(prog.cursor_key, prog.image.identity.sha256, qkey, position)


def encode_scoped(key: bytes, sha256: str, qkey: str, position: Any) -> str:
    """A cursor over the content `sha256` names (a program's bytes, or retained evidence about
    them), signed with `key` (the home's cursor key)."""
    body = json.dumps({"p": sha256[:16], "q": qkey, "o": position}, separators=(",", ":")).encode()
    tag = hmac.new(key, body, hashlib.sha256).digest()[:8]
    return base64.urlsafe_b64encode(tag + body).decode().rstrip("=")


def decode_cursor(cursor: str | None, prog: Program, qkey: str) -> Any:
    """The position a cursor stands for; None for no cursor; `invalid_argument` if it does not fit."""
    return decode_scoped(cursor, prog.cursor_key, prog.image.identity.sha256, qkey)


def decode_scoped(cursor: str | None, key: bytes, sha256: str, qkey: str) -> Any:
    """The position of a cursor `encode_scoped` made with `key` over `sha256`; None for no cursor."""
    if cursor is None:
        return None
    target = "/params/page/cursor"
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        tag, body = raw[:8], raw[8:]
        if not hmac.compare_digest(tag, hmac.new(key, body, hashlib.sha256).digest()[:8]):
            raise ValueError
        data = json.loads(body)
    except Exception:  # noqa: BLE001
        raise BinlensError("invalid_argument", "the cursor is not one this server issued", target=target) from None
    if data.get("p") != sha256[:16]:
        raise BinlensError("invalid_argument", "the cursor belongs to another program", target=target)
    if data.get("q") != qkey:
        raise BinlensError("invalid_argument", "the cursor belongs to a different query", target=target)
    return data.get("o")
