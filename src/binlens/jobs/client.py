"""The caller's end of the analysis process: a spare started early, one run, its progress.

The server (or CLI) process sends one request over a pipe (`AnalysisRequest`, as a
`binlens.frames` frame): the file path, the sha256 it opened, the program database file and the
user's extra/excluded function starts. The analysis process (`jobs/child.py`) streams
`("progress", done, total, message)` frames back and ends with `("done", functions)` or
`("error", code, message, target)`. The caller kills it on cancellation and past a time budget; a
crash or kill leaves the database as it was, since nothing is committed before the end.

`prestart()` starts a spare analysis process early (the CLI does it before importing the API),
so its start-up and imports overlap the caller's; the next analysis takes it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import pickle
import queue
import signal
import stat
import subprocess
import threading
import time
from typing import Any

from binlens.errors import BinlensError
from binlens.frames import read_frame, write_frame
from binlens.jobs.request import AnalysisRequest, Progress
from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES

_spare_lock = threading.Lock()
_spare: subprocess.Popen[bytes] | None = None
_spare_key: tuple[str, str | None] | None = None  # the file a spare already analyses (an early start)


def _spawn() -> subprocess.Popen[bytes]:
    from binlens.jobs.spawn import spawn_analysis_process

    return spawn_analysis_process()


def prestart(
    path: str | None = None,
    slice_name: str | None = None,
    home: str | None = None,
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Start a spare analysis process now (or take `process`, started by `jobs.spawn`), so its
    start-up overlaps the caller's imports.

    With `path` and `home` (the one-shot CLI) it also starts analysing that file at once; the
    result is saved only when the caller's analysis takes the process over (`AnalysisProcess`),
    and nothing at all when the caller ends without needing it (or the database had it already).
    """
    global _spare, _spare_key
    with _spare_lock:
        if _spare is not None and _spare.poll() is None:
            if process is not None:
                _kill(process)
            return
        _spare, _spare_key = process or _spawn(), None
        if path is not None and home is not None and _fast_format(path):
            real = os.path.realpath(os.path.expanduser(path))
            try:
                write_frame(_spare.stdin, AnalysisRequest(real, "", "", slice_name, home=home))
            except OSError:
                return
            _spare_key = (real, slice_name)


def _fast_format(path: str) -> bool:
    """Is `path` a file the fast ELF reader takes (an ELF file of a machine it knows)? Only those start early: any
    other format would make the early process import LIEF beside the CLI's parser worker, while
    the CLI's own request hands over the image that worker parsed."""
    from binlens.loader.worker import fast_candidate

    try:  # (non-blocking: a FIFO put in the file's place must not hold the command up)
        fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (OSError, ValueError):
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > DEFAULT_MAX_FILE_BYTES:  # the command's open refuses it
            return False
        return fast_candidate(os.read(fd, 64))
    except OSError:
        return False
    finally:
        os.close(fd)


@atexit.register
def _drop_spare() -> None:
    """At exit, an unused spare (maybe analysing a file nobody asked about after all) is killed."""
    global _spare
    with _spare_lock:
        proc, _spare = _spare, None
    if proc is not None and proc.poll() is None:
        _kill(proc)


def _take_process(request: AnalysisRequest) -> tuple[subprocess.Popen[bytes], bool]:
    """A process for `request`: the spare when there is one (and whether it already analyses this file)."""
    global _spare, _spare_key
    with _spare_lock:
        proc, key, _spare, _spare_key = _spare, _spare_key, None, None
    if proc is not None and proc.poll() is None:
        if key is None or key == (request.path, request.slice_name):
            return proc, key is not None
        _kill(proc)
    return _spawn(), False


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


_running: set[threading.Thread] = set()  # the reader threads of analysis processes not yet reaped


def wait_for_processes(timeout: float = 30.0) -> None:
    """Wait until every analysis process this process ran has ended (after "done" one still folds
    its write-ahead log into the database, ~30 ms for libc): a one-shot command calls it before it
    exits, so nothing of it outlives the command."""
    deadline = time.monotonic() + timeout
    for reader in list(_running):
        if reader.is_alive():
            reader.join(max(0.0, deadline - time.monotonic()))


class AnalysisProcess:
    """One analysis run in its own process; `run` blocks until it ends, relaying progress."""

    def __init__(self, request: AnalysisRequest, image: Any = None) -> None:
        """`image`: the caller's parsed Image, sent (`encode_image`) when the request has none and
        goes to a fresh process; an early start has parsed the file itself."""
        self.request = request
        self._image = image
        self.proc, self._early = _take_process(request)
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
        self.proc.wait()  # reaped here: after "done" the process may still checkpoint the database
        _running.discard(threading.current_thread())

    def kill(self) -> None:
        """Kill the analysis process and everything it forked."""
        _kill(self.proc)

    def run(self, progress: Progress, cancelled: threading.Event, budget_s: float) -> int:
        """Send the request and relay progress until the end; the number of functions saved.

        Raises BinlensError: `cancelled` when `cancelled` is set (the process is killed at once),
        `timeout` past `budget_s`, `internal` when the process dies, or the error it reported.
        """
        request = self.request
        if self._early and request.image is not None:
            # an early start parsed the file itself: the caller's image would only cost unpickling there
            # (~50 ms for libc, after the analysis and before the save)
            request = dataclasses.replace(request, image=None)
        elif not self._early and request.image is None and self._image is not None:
            # encoded only to be sent, and let go once it is (libc: ~1 MiB of tuples for the whole wait)
            from binlens.loader.image import encode_image

            request = dataclasses.replace(request, image=encode_image(self._image))
        from binlens.store.analysis import stored_run_row

        # the committed run before this one can commit: a process that dies after its commit and
        # before its "done" frame (a kill landing then) has still saved a whole run
        before = stored_run_row(self.request.db_path)
        with contextlib.suppress(OSError):  # an early start may have stopped already: its frames say why
            write_frame(self.proc.stdin, ("save", request) if self._early else request)
        del request
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        _running.add(self._reader)
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
                    saved = self._saved_since(before)
                    if saved is not None:
                        return saved
                    raise BinlensError("internal", self._death_message())
                kind = frame[0]
                if kind == "progress":
                    progress(frame[1], frame[2], frame[3])
                elif kind == "done":  # (committed; the process checkpoints and ends on its own)
                    return int(frame[1])
                else:  # ("error", code, message, target)
                    raise BinlensError(frame[1], frame[2], target=frame[3] if len(frame) > 3 else None)
        except BaseException:
            self.kill()
            raise

    def _saved_since(self, before: tuple[Any, ...] | None) -> int | None:
        """The functions of a whole run this process committed (the stored run differs from
        `before` and is this engine's), or None when it saved nothing."""
        from binlens.analysis import ENGINE_VERSION
        from binlens.store.analysis import stored_run_row

        self.proc.wait()
        now = stored_run_row(self.request.db_path)
        if now is None or now == before or now[1] != ENGINE_VERSION or now[2] != "done":
            return None
        return int(now[3])

    def _death_message(self) -> str:
        code = self.proc.wait()
        try:
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        except ValueError:
            how = f"signal {-code}"
        return f"the analysis process stopped unexpectedly ({how}); nothing was saved"
