"""Opaque page cursors, bound to the program and the query that made them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from typing import Any

from pydantic import BaseModel

from binlens.errors import BinlensError

# A per-install key would survive restarts only if stored; cursors are short-lived, so a
# process key plus the program's sha256 and the query's hash are enough to bind them.
_KEY = os.urandom(16)


def query_key(params: BaseModel, exclude: tuple[str, ...] = ("page", "program")) -> str:
    """A stable hash of the query's parameters (everything but paging and the handle)."""
    data = params.model_dump(mode="json", exclude=set(exclude))
    if isinstance(data.get("scan"), dict):
        data["scan"] = {k: v for k, v in data["scan"].items() if k != "timeout_ms"}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_cursor(program_sha: str, qkey: str, position: Any) -> str:
    body = json.dumps({"p": program_sha[:16], "q": qkey, "o": position}, separators=(",", ":")).encode()
    tag = hmac.new(_KEY, body, hashlib.sha256).digest()[:8]
    return base64.urlsafe_b64encode(tag + body).decode().rstrip("=")


def decode_cursor(cursor: str | None, program_sha: str, qkey: str) -> Any:
    """The position a cursor stands for; None for no cursor; `invalid_argument` if it does not fit."""
    if cursor is None:
        return None
    target = "/params/page/cursor"
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        tag, body = raw[:8], raw[8:]
        if not hmac.compare_digest(tag, hmac.new(_KEY, body, hashlib.sha256).digest()[:8]):
            raise ValueError
        data = json.loads(body)
    except Exception:  # noqa: BLE001
        raise BinlensError("invalid_argument", "the cursor is not one this server issued", target=target) from None
    if data.get("p") != program_sha[:16]:
        raise BinlensError("invalid_argument", "the cursor belongs to another program", target=target)
    if data.get("q") != qkey:
        raise BinlensError("invalid_argument", "the cursor belongs to a different query", target=target)
    return data.get("o")
