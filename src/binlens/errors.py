"""The one error type that crosses the wire, and JSON-pointer helpers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

STATUS: dict[str, int] = {
    "invalid_argument": 400,
    "read_only": 403,
    "permission_denied": 403,  # the caller may not do this (session.shutdown from a remote, unauthenticated peer)
    "not_found": 404,
    "conflict": 409,
    "response_too_large": 413,
    "cancelled": 499,
    "internal": 500,
    "unsupported": 501,
    "unavailable": 503,
    "busy": 429,
    "timeout": 504,
    "process_exited": 410,  # the debugged process is gone
    "process_changed": 412,  # the debugged pid names another process or executable than the one pinned
}


def pointer(parts: Iterable[str | int]) -> str:
    """Build an RFC 6901 JSON pointer from path parts (escaping `~` and `/`)."""
    out = []
    for part in parts:
        text = str(part).replace("~", "~0").replace("/", "~1")
        out.append(text)
    return "/" + "/".join(out) if out else ""


class BinlensError(Exception):
    """A method failure: stable `code`, HTTP-like `status`, and a JSON pointer `target`."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        target: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        if code not in STATUS:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.target = target
        self.details = details or {}

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def to_dict(self) -> dict[str, Any]:
        """The wire form `{status, code, message, target, details}`."""
        return {
            "status": self.status,
            "code": self.code,
            "message": self.message,
            "target": self.target,
            "details": self.details,
        }


def invalid(message: str, target: str | None = None, **details: Any) -> BinlensError:
    return BinlensError("invalid_argument", message, target=target, details=details)


def not_found(message: str, target: str | None = None, **details: Any) -> BinlensError:
    return BinlensError("not_found", message, target=target, details=details)
