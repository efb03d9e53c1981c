"""The parser worker process: reads requests on stdin, forks a child per file, answers on stdout.

Run as `python -m binlens.loader.worker`. Each child parses one file with LIEF and pipes back
the pickled Image (without its bytes, which the parent already has). The worker survives a
crash, an abort or a hang of the child and turns each into a clean error.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
from typing import Any

from binlens.errors import BinlensError
from binlens.loader.isolate import read_frame, write_frame


def _child(data: bytes, file_name: str, slice_name: str | None, wfd: int) -> None:
    from binlens.loader.parse_lief import parse_image

    try:
        img = parse_image(data, file_name, slice_name)
        img.data = b""
        out: Any = ("ok", img)
    except BinlensError as err:
        out = ("error", (err.code, err.message, err.target, err.details))
    except Exception as err:  # noqa: BLE001 - any parser exception is a malformed file
        out = (
            "error",
            ("invalid_argument", f"malformed file: the parser rejected it ({type(err).__name__})", None, {}),
        )
    body = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(body)
    while view:
        n = os.write(wfd, view)
        view = view[n:]
    os.close(wfd)


def _collect(pid: int, rfd: int, timeout: float) -> tuple[str, Any]:
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rfd)
            msg = f"malformed file: parsing took longer than {timeout:g} s and was stopped"
            return "error", ("invalid_argument", msg, None, {"timeout_s": timeout})
        ready, _, _ = select.select([rfd], [], [], left)
        if not ready:
            continue
        chunk = os.read(rfd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    if chunks and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return pickle.loads(b"".join(chunks))  # noqa: S301 - our own child
    how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
    return "error", ("invalid_argument", "malformed file: the format parser crashed on it", None, {"parser": how})


def serve(stdin: Any, stdout: Any) -> None:
    """Answer parse requests until stdin closes."""
    import binlens.loader.parse_lief  # noqa: F401 - import LIEF once, before forking

    while True:
        try:
            data, file_name, slice_name, timeout = read_frame(stdin)
        except EOFError:
            return
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(rfd)
            try:
                _child(data, file_name, slice_name, wfd)
            finally:
                os._exit(0)
        os.close(wfd)
        write_frame(stdout, _collect(pid, rfd, timeout))


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
