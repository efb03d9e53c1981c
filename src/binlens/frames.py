"""Length-prefixed pickle frames over a pipe, shared by the two out-of-process jobs.

The loader's parser worker (`loader/isolate.py`, `loader/worker.py`) and the analysis job
(`jobs/`) talk to their own child processes through these frames: an 8-byte big-endian length,
then a pickle. Both ends are binlens's own processes, so the pickles are trusted.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

_HEADER = struct.Struct(">Q")
# The parser worker's answer: one status byte, then (for ok and error) a pickle.
STATUS_OK, STATUS_ERROR, FALLBACK = b"O", b"E", b"F"


def write_frame(stream: Any, obj: Any) -> None:
    """Write one length-prefixed pickle frame."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)))
    stream.write(body)
    stream.flush()


def write_last_frame(stream: Any, obj: Any) -> None:
    """Write one frame for `load_frame`, pickled straight into the stream: no copy of the whole
    pickle in memory (the analysis's function rows from its forked child: 5.7 MiB for libc, which
    the child held beside the rows). Its length is not known ahead: the header says 0, so only
    `load_frame` reads it, and nothing may follow it."""
    stream.write(_HEADER.pack(0))
    pickle.dump(obj, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


def read_frame(stream: Any) -> Any:
    """Read one frame; EOFError when the peer is gone."""
    head = read_exact(stream, _HEADER.size)
    (size,) = _HEADER.unpack(head)
    return pickle.loads(read_exact(stream, size))  # noqa: S301 - frames come from our own worker


def load_frame(stream: Any) -> Any:
    """Read one frame (`write_frame`'s or `write_last_frame`'s) as `read_frame` does, but unpickle
    it straight from the stream, without a copy of the whole frame in memory (the analysis's
    function rows from its forked child: 5.7 MiB for libc, read while the rows it builds itself are
    held). For a stream with nothing after the frame; EOFError when the peer is gone or stopped
    part-way."""
    read_exact(stream, _HEADER.size)
    try:
        return pickle.load(stream)  # noqa: S301 - frames come from our own worker
    except pickle.UnpicklingError as err:  # (a frame cut short by the writer's death)
        raise EOFError(f"peer stopped: {err}") from None


def write_answer(stream: Any, answer: bytes) -> None:
    """Write the worker's answer (status byte + body) as one length-prefixed frame."""
    stream.write(_HEADER.pack(len(answer)))
    stream.write(answer)
    stream.flush()


def read_answer(stream: Any) -> tuple[bytes, Any]:
    """Read one answer frame: (status byte, decoded body)."""
    (size,) = _HEADER.unpack(read_exact(stream, _HEADER.size))
    answer = read_exact(stream, size)
    return answer[:1], pickle.loads(memoryview(answer)[1:])  # noqa: S301 - frames come from our own worker


def read_exact(stream: Any, n: int) -> bytes:
    """Exactly `n` bytes from a blocking binary stream; EOFError when the peer closes first."""
    chunk = stream.read(n)  # a buffered reader returns short only at EOF
    if len(chunk) == n:
        return chunk
    buf = bytearray(chunk)
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError("peer closed")
        buf += chunk
    return bytes(buf)
