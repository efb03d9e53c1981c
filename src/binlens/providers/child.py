"""The child end of a provider session: `python -m binlens.providers.child [--memory-limit N] MODULE:ATTR`.

The child caps its own address space (`resource.setrlimit`, inherited by whatever it runs), turns
off core files, moves the frame pipe off fd 1 (a library that prints cannot corrupt a frame:
fd 1 becomes the server's stderr), builds the handler `MODULE:ATTR` names and answers one
request frame at a time until told to close or the pipe closes. It exits when the server is
gone, even in the middle of a request.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any

from binlens.providers import frames
from binlens.providers.base import Handler, Progress, ProviderFailure

EXIT_OUT_OF_MEMORY = 3


def _limit_memory(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _exit_with_parent(parent: int) -> None:
    """A thread that ends the process once the server that started it is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    __import__(module)
    return getattr(sys.modules[module], attr)


def _reporter(out: Any) -> Progress:
    """A progress callback that writes a progress frame ahead of the request's answer."""

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        frames.write(out, {"progress": {"done": done, "total": total, "message": message}})

    return progress


def _answer(handler: Handler, message: dict[str, Any], blob: bytes, out: Any) -> None:
    """Run one request and write its answer frame (exits the process when memory ran out)."""
    op = message.get("op")
    args = message.get("args")
    try:
        if not isinstance(op, str) or not isinstance(args, dict):
            raise ProviderFailure("internal", "malformed request frame")
        result, result_blob = handler.handle(op, args, blob, _reporter(out))
    except ProviderFailure as failure:
        frames.write(
            out, {"ok": False, "error": {"code": failure.code, "message": failure.message, "details": failure.details}}
        )
    except MemoryError:
        del blob
        frames.write(
            out,
            {
                "ok": False,
                "fatal": True,
                "error": {
                    "code": "internal",
                    "message": "the provider ran out of memory",
                    "details": {"reason": "memory_limit"},
                },
            },
        )
        os._exit(EXIT_OUT_OF_MEMORY)
    except Exception as err:  # noqa: BLE001 - reported to the server, which logs it
        traceback.print_exc(file=sys.stderr)
        frames.write(
            out,
            {
                "ok": False,
                "error": {
                    "code": "internal",
                    "message": f"{type(err).__name__} in the provider",
                    "details": {"reason": "failed"},
                },
            },
        )
    else:
        frames.write(out, {"ok": True, "result": result}, result_blob)


def serve(handler_ref: str, memory_limit: int) -> int:
    """The child's life: limits, handler, then request after request."""
    _limit_memory(memory_limit)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = os.fdopen(0, "rb", buffering=0)
    _exit_with_parent(os.getppid())
    try:
        handler: Handler = _load(handler_ref)()
    except Exception as err:  # noqa: BLE001 - the server reports the provider unavailable
        traceback.print_exc(file=sys.stderr)
        frames.write(
            out,
            {
                "ok": False,
                "error": {
                    "code": "unavailable",
                    "message": f"{type(err).__name__}: {err}",
                    "details": {"reason": "start_failed"},
                },
            },
        )
        return 1
    frames.write(out, {"ok": True, "result": {"ready": True, "pid": os.getpid()}})
    while True:
        try:
            message, blob = frames.read(inp)
        except (EOFError, frames.FrameError):
            return 0
        if message.get("op") == "close":
            return 0
        _answer(handler, message, blob, out)


def main(argv: list[str]) -> int:
    """Parse `[--memory-limit N] MODULE:ATTR` and serve."""
    limit = 0
    if len(argv) >= 2 and argv[0] == "--memory-limit":
        limit, argv = int(argv[1]), argv[2:]
    if len(argv) != 1 or ":" not in argv[0]:
        print("usage: python -m binlens.providers.child [--memory-limit BYTES] MODULE:ATTR", file=sys.stderr)
        return 2
    return serve(argv[0], limit)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
