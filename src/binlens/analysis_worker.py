"""Run the full analysis of a program in a separate, disposable process.

The server (or CLI) process sends one request over a pipe: the file path, the sha256 it opened,
the program database file and the user's extra/excluded function starts. The analysis process
(`python -m binlens.analysis_worker`, its own session so it can be killed with everything it
forked) loads the image itself through the loader's forked parser child (the fast ELF reader,
else LIEF), checks that the bytes are the ones the caller opened, runs `analyze` and writes the
result with `save_analysis` (one SQLite transaction, in WAL mode beside the caller's readers).
It streams `("progress", done, total, message)` frames back and ends with `("done", functions)`
or `("error", code, message)`. The caller kills it on cancellation and past a time budget; a
crash or kill leaves the database as it was, since nothing is committed before the end.

`prestart()` starts a spare analysis process early (the CLI does it before importing the API),
so its start-up and imports overlap the caller's; the next analysis takes it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from binlens.errors import BinlensError
from binlens.loader.isolate import STATUS_OK, read_frame, write_frame

Progress = Callable[[float, float | None, str | None], None]
_PROGRESS_EVERY_S = 0.05


@dataclass
class AnalysisRequest:
    """What the analysis process needs: which file, which bytes, where to save, the user's starts."""

    path: str
    sha256: str
    db_path: str
    slice_name: str | None = None
    extra_starts: list[int] = field(default_factory=list)
    excluded_starts: list[int] = field(default_factory=list)
    parse_timeout_s: float = 8.0
    data: bytes | None = None  # the bytes themselves, when the file changed on disk since it was opened


# ---------------------------------------------------------------------------------- caller side
_spare_lock = threading.Lock()
_spare: subprocess.Popen[bytes] | None = None


def _spawn() -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "binlens.analysis_worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        close_fds=True,
        start_new_session=True,  # one process group: a kill takes the parser child with it
    )


def prestart() -> None:
    """Start a spare analysis process now, so its start-up overlaps the caller's imports."""
    global _spare
    with _spare_lock:
        if _spare is None or _spare.poll() is not None:
            _spare = _spawn()


def _take_process() -> subprocess.Popen[bytes]:
    global _spare
    with _spare_lock:
        proc, _spare = _spare, None
    if proc is not None and proc.poll() is None:
        return proc
    return _spawn()


class AnalysisProcess:
    """One analysis run in its own process; `run` blocks until it ends, relaying progress."""

    def __init__(self, request: AnalysisRequest) -> None:
        self.request = request
        self.proc = _take_process()
        self._frames: queue.Queue[Any] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"analysis-reader-{self.proc.pid}", daemon=True)

    @property
    def pid(self) -> int:
        """The analysis process's id."""
        return self.proc.pid

    def _read(self) -> None:
        try:
            while True:
                self._frames.put(read_frame(self.proc.stdout))
        except (EOFError, OSError, pickle.UnpicklingError):
            self._frames.put(None)

    def kill(self) -> None:
        """Kill the analysis process and everything it forked."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def run(self, progress: Progress, cancelled: threading.Event, budget_s: float) -> int:
        """Send the request and relay progress until the end; the number of functions saved.

        Raises BinlensError: `cancelled` when `cancelled` is set (the process is killed at once),
        `timeout` past `budget_s`, `internal` when the process dies, or the error it reported.
        """
        try:
            write_frame(self.proc.stdin, self.request)
            self.proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            self.kill()
            raise BinlensError("internal", "the analysis process could not be started") from None
        self._reader.start()
        deadline = time.monotonic() + budget_s
        try:
            while True:
                if cancelled.is_set():
                    raise BinlensError("cancelled", "the analysis was cancelled")
                if time.monotonic() > deadline:
                    raise BinlensError(
                        "timeout", f"the analysis took longer than {budget_s:g} s and was stopped; nothing was saved"
                    )
                try:
                    frame = self._frames.get(timeout=0.02)
                except queue.Empty:
                    continue
                if frame is None:
                    raise BinlensError("internal", self._death_message())
                kind = frame[0]
                if kind == "progress":
                    progress(frame[1], frame[2], frame[3])
                elif kind == "done":
                    self.proc.wait()
                    return int(frame[1])
                else:
                    raise BinlensError(frame[1], frame[2])
        except BaseException:
            self.kill()
            raise

    def _death_message(self) -> str:
        code = self.proc.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return f"the analysis process stopped unexpectedly ({how}); nothing was saved"


# ---------------------------------------------------------------------------------- analysis side
def _load(req: AnalysisRequest) -> Any:
    from binlens.loader.image import decode_image
    from binlens.loader.worker import parse_isolated

    data = req.data
    if data is None:
        try:
            with open(req.path, "rb") as fh:
                data = fh.read()
        except OSError as err:
            raise BinlensError("conflict", f"cannot read {req.path} again: {err.strerror}") from None
    answer = parse_isolated(data, os.path.basename(req.path), req.slice_name, req.parse_timeout_s)
    payload = pickle.loads(memoryview(answer)[1:])  # noqa: S301 - our own forked child's answer
    if answer[:1] != STATUS_OK:
        code, message, target, details = payload
        if req.data is None:  # the caller parsed these bytes before: the file must have changed
            raise BinlensError("conflict", f"{req.path} no longer parses as it did when it was opened: {message}")
        raise BinlensError(code, message, target=target, details=details)
    image = decode_image(payload, data)
    if image.identity.sha256 != req.sha256:
        raise BinlensError("conflict", f"{req.path} changed on disk since it was opened")
    return image


def _throttled(send: Callable[[Any], None]) -> Progress:
    last = [0.0, ""]

    def progress(done: float, total: float | None, message: str | None) -> None:
        now = time.monotonic()
        if now - last[0] >= _PROGRESS_EVERY_S or (message and message != last[1]):
            last[0], last[1] = now, message or last[1]
            send(("progress", done, total, message))

    return progress


def analyse_and_save(req: AnalysisRequest, send: Callable[[Any], None]) -> None:
    """In the analysis process: load, analyse, save, and report through `send`."""
    from pathlib import Path

    from binlens.analysis import analyze
    from binlens.store import ProgramDatabase
    from binlens.store.analysis import save_analysis

    send(("progress", 0, None, "loading the image"))
    image = _load(req)
    result = analyze(
        image, progress=_throttled(send), extra_starts=req.extra_starts, excluded_starts=req.excluded_starts
    )
    send(("progress", 1, 1, "saving to the program database"))
    db = ProgramDatabase(Path(req.db_path))
    save_analysis(db, result)
    db.close()
    send(("done", len(result.functions)))


def main() -> None:
    """Entry point of `python -m binlens.analysis_worker`: one request on stdin, frames on stdout."""
    import binlens.analysis  # noqa: F401 - import while the caller still prepares the request
    import binlens.loader.parse_elf  # noqa: F401
    import binlens.store.analysis  # noqa: F401

    out = sys.stdout.buffer
    try:
        req = read_frame(sys.stdin.buffer)
    except EOFError:
        return  # an unused spare
    try:
        analyse_and_save(req, lambda frame: write_frame(out, frame))
    except BinlensError as err:
        write_frame(out, ("error", err.code, err.message))
    except BrokenPipeError:
        return
    except Exception as err:  # noqa: BLE001 - reported to the caller as a clean error, the trace goes to stderr
        import traceback

        traceback.print_exc(file=sys.stderr)
        write_frame(out, ("error", "internal", f"the analysis failed: internal error ({type(err).__name__})"))


if __name__ == "__main__":
    main()
