"""Run the native parser out of process, under a time budget.

LIEF is C++: a malformed file can crash or hang it. The parser lives in one long-lived worker
process (`python -m binlens.loader.worker`, so the server never imports LIEF). For each file the
worker forks a child that parses and sends back the Image as plain tuples; a crash or a timeout
kills only that child. If the worker itself dies, the next call starts a new one. `prestart()`
starts the worker early, so its start-up overlaps the caller's own imports.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import Any

from binlens.errors import BinlensError
from binlens.loader.formats import sniff_format
from binlens.loader.image import Image, decode_image
from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES, read_input

DEFAULT_PARSE_TIMEOUT = 8.0
_HEADER = struct.Struct(">Q")
# The worker's answer: one status byte, then (for ok and error) a pickle.
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
    head = _read_exact(stream, _HEADER.size)
    (size,) = _HEADER.unpack(head)
    return pickle.loads(_read_exact(stream, size))  # noqa: S301 - frames come from our own worker


def load_frame(stream: Any) -> Any:
    """Read one frame (`write_frame`'s or `write_last_frame`'s) as `read_frame` does, but unpickle
    it straight from the stream, without a copy of the whole frame in memory (the analysis's
    function rows from its forked child: 5.7 MiB for libc, read while the rows it builds itself are
    held). For a stream with nothing after the frame; EOFError when the peer is gone or stopped
    part-way."""
    _read_exact(stream, _HEADER.size)
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
    (size,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    answer = _read_exact(stream, size)
    return answer[:1], pickle.loads(memoryview(answer)[1:])  # noqa: S301 - frames come from our own worker


def _read_exact(stream: Any, n: int) -> bytes:
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


class ParserWorker:
    """The parent's handle on the worker process; one request at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the worker now (if it is not running), without waiting for it."""
        with self._lock:
            self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            env = dict(os.environ)
            src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "binlens.loader.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                close_fds=True,
            )
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()

    def parse(self, data: bytes, file_name: str, slice_name: str | None, timeout: float) -> Image:
        """Parse in the worker; raise BinlensError on bad input, a parser crash, or a timeout."""
        sniff_format(data)  # refuse non-executables without waking the native parser
        with self._lock:
            proc = self._start()
            watchdog = threading.Timer(2 * timeout + 10.0, self._stop)  # the worker itself hung (fast try + LIEF)
            watchdog.start()
            try:
                write_frame(proc.stdin, (data, file_name, slice_name, timeout))
                status, payload = read_answer(proc.stdout)
            except (EOFError, BrokenPipeError, OSError):
                self._stop()
                raise BinlensError("internal", "the parser worker stopped unexpectedly; try again") from None
            finally:
                watchdog.cancel()
        if status == STATUS_OK:
            return decode_image(payload, data)
        code, message, target, details = payload
        raise BinlensError(code, message, target=target, details=details)

    def close(self) -> None:
        with self._lock:
            self._stop()


_WORKER = ParserWorker()


def prestart() -> None:
    """Start the parser worker in the background, ahead of the first `load_image`."""
    _WORKER.start()


def load_image(
    path: str,
    slice_name: str | None = None,
    timeout: float = DEFAULT_PARSE_TIMEOUT,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Image:
    """Read `path` once (`input_file.read_input`: a regular file of at most `max_bytes`) and parse
    it in the isolated worker."""
    opened = read_input(path, max_bytes=max_bytes)
    return parse_bytes(opened.data, os.path.basename(opened.path), slice_name, timeout)


def parse_bytes(
    data: bytes, file_name: str, slice_name: str | None = None, timeout: float = DEFAULT_PARSE_TIMEOUT
) -> Image:
    """Parse a file's bytes (read with `input_file.read_input`) in the isolated worker."""
    return _WORKER.parse(data, file_name, slice_name, timeout)
