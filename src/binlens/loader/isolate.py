"""Run the native parser out of process, under a time budget.

LIEF is C++: a malformed file can crash or hang it. The parser lives in one long-lived worker
process (`python -m binlens.loader.worker`, so the server never imports LIEF). For each file the
worker forks a child that parses and sends back the Image as plain tuples; a crash or a timeout
kills only that child. If the worker itself dies, the next call starts a new one. `prestart()`
starts the worker early, so its start-up overlaps the caller's own imports. Requests and answers
travel as `binlens.frames` frames.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from binlens.errors import BinlensError
from binlens.frames import STATUS_OK, read_answer, write_frame
from binlens.loader.formats import sniff_format
from binlens.loader.image import Image, decode_image
from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES, read_input

DEFAULT_PARSE_TIMEOUT = 8.0


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
