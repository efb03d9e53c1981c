"""The frames a provider's session process and the server exchange over a pipe.

A frame is a header (the lengths of its two parts), a JSON object, then raw bytes (an image's
bytes to the child, a blob of output to the parent; often empty). JSON rather than pickle: the
child runs a deep engine over a hostile file and may be subverted by it, so nothing it sends is
allowed to run code in the server when it is read.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from binlens.frames import read_exact

HEADER = struct.Struct(">IQ")  # JSON length, blob length
# what a frame may claim before it is refused unread: the child takes a whole image's bytes; the
# server takes at most `ProcessSession.max_answer_bytes` of an answer
MAX_JSON = 256 << 20
MAX_BLOB = 1 << 40


class FrameError(ValueError):
    """The bytes on the pipe are not a frame (a broken or subverted peer)."""


def encode(message: dict[str, Any], blob: bytes = b"") -> list[bytes | memoryview]:
    """One frame as the parts to write, in order (the blob is not copied)."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return [HEADER.pack(len(body), len(blob)), body, memoryview(blob)]


def decode_header(head: bytes, limit: int = MAX_BLOB) -> tuple[int, int]:
    """The (JSON length, blob length) of a frame header; FrameError when they are out of bounds
    (the JSON part over `MAX_JSON`, the whole over `limit`)."""
    size, blob = HEADER.unpack(head)
    if size > MAX_JSON or size + blob > limit:
        raise FrameError(f"frame header claims {size} + {blob} bytes, over the {limit}-byte limit")
    return size, blob


def decode_body(body: bytes) -> dict[str, Any]:
    """A frame's JSON part; FrameError unless it is a JSON object."""
    try:
        message = json.loads(body)
    except ValueError as err:
        raise FrameError(f"frame is not JSON: {err}") from None
    if not isinstance(message, dict):
        raise FrameError("frame is not a JSON object")
    return message


def write(stream: Any, message: dict[str, Any], blob: bytes = b"") -> None:
    """Write one frame to a blocking binary stream (the child's side)."""
    for part in encode(message, blob):
        stream.write(part)
    stream.flush()


def read(stream: Any) -> tuple[dict[str, Any], bytes]:
    """Read one frame from a blocking binary stream (the child's side); EOFError when the peer is gone."""
    size, blob = decode_header(read_exact(stream, HEADER.size))
    return decode_body(read_exact(stream, size)), read_exact(stream, blob)
