"""Run the full analysis of a program in a separate, disposable process.

The server (or CLI) process sends one request over a pipe: the file path, the sha256 it opened,
the program database file and the user's extra/excluded function starts. The analysis process
(`python -m binlens.analysis_worker`, its own session so it can be killed with everything it
forked) loads the image itself through the loader's forked parser child (the fast ELF reader,
else LIEF), checks that the bytes are the ones the caller opened, runs `analyze` and writes the
result with `save_analysis` (one SQLite transaction, in WAL mode beside the caller's readers).
It streams `("progress", done, total, message)` frames back and ends with `("done", functions)`
or `("error", code, message, target)`. The caller kills it on cancellation and past a time budget; a
crash or kill leaves the database as it was, since nothing is committed before the end.

`prestart()` starts a spare analysis process early (the CLI does it before importing the API),
so its start-up and imports overlap the caller's; the next analysis takes it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import os
import pickle
import queue
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from binlens.errors import BinlensError
from binlens.loader.digest import sha256_hex
from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES, read_input
from binlens.loader.isolate import STATUS_OK, load_frame, read_frame, write_frame, write_last_frame

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
    home: str | None = None  # an early start (the CLI, before it opened the program): the database's home
    image: tuple | None = None  # the caller's parsed image (`encode_image`): no second parse here
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # the most of the file read again (the caller's opened size)


# ---------------------------------------------------------------------------------- caller side
_spare_lock = threading.Lock()
_spare: subprocess.Popen[bytes] | None = None
_spare_key: tuple[str, str | None] | None = None  # the file a spare already analyses (an early start)


def _spawn() -> subprocess.Popen[bytes]:
    from binlens.analysis_spawn import spawn_analysis_process

    return spawn_analysis_process()


def prestart(
    path: str | None = None,
    slice_name: str | None = None,
    home: str | None = None,
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Start a spare analysis process now (or take `process`, started by `analysis_spawn`), so its
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


# ---------------------------------------------------------------------------------- analysis side
def _load(req: AnalysisRequest) -> Any:
    from binlens.loader.image import decode_image
    from binlens.loader.worker import parse_isolated

    data = req.data
    if data is None:
        try:
            data = read_input(req.path, max_bytes=req.max_file_bytes, target=None).data
        except BinlensError as err:
            raise BinlensError("conflict", f"cannot read {req.path} again: {err.message}") from None
    if req.image is not None:
        # the caller parsed these bytes already (in its own isolated child): reuse its answer, once
        # the bytes are shown to be the same (PE and Mach-O would otherwise import LIEF here again)
        if sha256_hex(data) != req.sha256:
            raise BinlensError("conflict", f"{req.path} changed on disk since it was opened")
        return decode_image(req.image, data)
    answer = parse_isolated(data, os.path.basename(req.path), req.slice_name, req.parse_timeout_s)
    payload = pickle.loads(memoryview(answer)[1:])  # noqa: S301 - our own forked child's answer
    if answer[:1] != STATUS_OK:
        code, message, target, details = payload
        if req.data is None:  # the caller parsed these bytes before: the file must have changed
            raise BinlensError("conflict", f"{req.path} no longer parses as it did when it was opened: {message}")
        raise BinlensError(code, message, target=target, details=details)
    image = decode_image(payload, data)
    if req.sha256 and image.identity.sha256 != req.sha256:
        raise BinlensError("conflict", f"{req.path} changed on disk since it was opened")
    return image


def _throttled(send: Callable[[Any], None]) -> Progress:
    last_at, last_message = 0.0, ""

    def progress(done: float, total: float | None, message: str | None) -> None:
        nonlocal last_at, last_message
        now = time.monotonic()
        if now - last_at >= _PROGRESS_EVERY_S or (message and message != last_message):
            last_at, last_message = now, message or last_message
            send(("progress", done, total, message))

    return progress


def analyse_and_save(req: AnalysisRequest, send: Callable[[Any], None]) -> None:
    """In the analysis process: load, analyse, save, and report through `send`."""
    send(("progress", 0, None, "loading the image"))
    image = _load(req)
    _save(req, _analyse(image, _throttled(send), req.extra_starts, req.excluded_starts), send)


def analyse_early(req: AnalysisRequest, stdin: Any, send: Callable[[Any], None]) -> None:
    """An early start: analyse `req.path` now, save once the caller takes over with the full request.

    The database is only read here (read-only, and only if it exists) until then: the caller
    creates and migrates it while this process analyses.
    """
    from binlens.analysis import ENGINE_VERSION
    from binlens.store import database_path
    from binlens.store.analysis import stored_state

    send(("progress", 0, None, "loading the image"))
    image = _load(req)
    ident = image.identity
    db_path = database_path(Path(req.home or "."), ident.sha256, ident.slice)
    cached, extra, excluded = stored_state(db_path, ENGINE_VERSION)
    rows = None
    if not cached:
        rows = _analyse(image, _throttled(send), extra, excluded)
    try:
        _verb, full = read_frame(stdin)
    except EOFError:
        return  # the caller did not need it
    if full.sha256 != ident.sha256:
        raise BinlensError("conflict", f"{req.path} changed on disk since it was opened")
    full.data = image.data
    if rows is None or (full.extra_starts, full.excluded_starts) != (extra, excluded):
        analyse_and_save(full, send)
        return
    _save(full, rows, send)


_retained: list[Any] = []  # the rows (and the engine's state until they are built), kept until the process exits


@dataclass
class _Rows:
    """An analysis as the rows to store (`binlens.store.analysis_save`)."""

    figures: tuple[str, int, int, float]
    functions: Any  # FunctionRows
    references: Any  # ReferenceRows
    warnings: list[str] = field(default_factory=list)  # what of the image was not analysed, and why


def _parallel() -> bool:
    """Build the functions in a forked process beside the references: where fork exists, this
    process may run on two CPUs or more, and the machine has memory for the child's copied pages
    (BINLENS_SERIAL=1 turns it off)."""
    if not hasattr(os, "fork") or os.environ.get("BINLENS_SERIAL") == "1":
        return False
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cpus >= 2 and _memory_allows_fork()


def _memory_allows_fork(meminfo: str = "/proc/meminfo") -> bool:
    """Is this process's resident memory under half of what the machine has available? The child
    copies the pages both touch: on gcc's cc1 (1,079 MiB) the machine's used memory rose 1.47 GiB.
    True where /proc does not say (not Linux)."""
    try:
        with open(meminfo) as fh:
            info = {line.split(":")[0]: line.split()[1] for line in fh}
        with open("/proc/self/statm") as fh:
            resident_pages = int(fh.read().split()[1])
        available_kib = int(info["MemAvailable"])
    except (OSError, KeyError, ValueError, IndexError):
        return True
    return resident_pages * os.sysconf("SC_PAGE_SIZE") // 1024 < available_kib // 2


def _analyse(image: Any, progress: Progress, extra: list[int], excluded: list[int]) -> _Rows:
    """The analysis of `image` as rows to store.

    Once every function's code is found (`explore`), what remains splits into independent parts:
    the references with the strings, and each function's blocks. With two CPUs a forked child
    builds the first functions (by address) and their rows while this process collects the
    references and then builds the other functions, each on its own CPU.
    The child writes its rows to a temporary file a batch at a time and sends only their spans and
    counts; the save reads the batches back one at a time, so neither process holds the child's
    rows whole.
    The engine's state goes once the functions' rows are built, as they have consumed most of it
    (~9 ms on libc); the rows are kept to the end (`_retained`): freeing the whole analysis object
    by object on return takes ~60 ms.
    """
    from binlens.analysis.engine import explore, gc_paused
    from binlens.store.analysis_save import reference_rows, streamed_function_rows

    _retained.clear()  # (an earlier analysis in this process, whose user starts were not the caller's)
    with gc_paused():  # the rows are acyclic tuples; collections would re-scan the whole analysis
        explored = explore(image, progress, extra, excluded)
        _retained.append(explored)
        if _parallel():
            strings, refs, frows = _in_two_processes(explored)
        else:
            strings, refs = explored.references()
            frows = streamed_function_rows(explored.iter_functions())
        _retained.append(refs)
        # The functions' rows are built: the engine's state can go, and the references' rows and
        # the save then fit in the memory it frees, lowering this process's peak for ~9 ms of work
        # (libc). One collection: the explorer and its backend hold each other.
        facts = (explored.codemap.total_bytes, explored.covered, explored.t0)
        warnings = explored.warnings
        _retained.remove(explored)
        del explored
        gc.collect()
        rrows = reference_rows(refs, strings, frows.spans)
        frows.spans = ([], [], [])  # (three arrays of ~70k entries for libc, of no further use)
        return _Rows(_figures(facts, frows, progress), frows, rrows, warnings)


def _in_two_processes(explored: Any) -> tuple[list, Any, Any]:
    """(strings, references, function rows): a forked child builds the first functions' rows
    (`_CHILD_SHARE`) while this process collects the references and builds the others."""
    from binlens.store.analysis_save import merge_function_rows, streamed_function_rows

    split = _split(explored.bodies)
    try:
        spool = tempfile.TemporaryFile(prefix="binlens-rows-")  # noqa: SIM115 - kept with the rows
        _retained.append(spool)
    except OSError:  # (no writable temporary directory: the child's rows come through the pipe)
        spool = None
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its functions, then straight out (nothing of the parent's to flush)
        code = 1
        try:
            os.close(read_fd)
            with open(write_fd, "wb") as out:
                try:
                    rows = streamed_function_rows(explored.iter_functions((0, split)), spool=spool)
                except OSError as err:  # (the temporary file's disk is full, ...): the parent says so
                    write_last_frame(out, ("error", f"its function builder could not write its rows: {err}"))
                    raise
                write_last_frame(out, rows)
            code = 0
        except BaseException:  # noqa: BLE001 - the parent reports it; the trace goes to stderr
            import traceback

            traceback.print_exc(file=sys.stderr)
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    child = open(read_fd, "rb")  # noqa: SIM115 - closed before the child is waited for
    frows = None
    try:
        strings, refs = explored.references()
        explored.drop((0, split))  # (the child's functions: their chunks' memory serves the rows)
        mine = streamed_function_rows(explored.iter_functions())
        theirs = load_frame(child)
        if isinstance(theirs, tuple):  # ("error", what the child could not do)
            raise BinlensError("internal", f"the analysis failed: {theirs[1]}")
        if theirs.spooled:
            theirs.spool = spool  # (their rows are in it: `write_analysis` reads them a batch at a time)
        frows = merge_function_rows(theirs, mine)
    except EOFError:
        child.close()
        raise BinlensError("internal", f"the analysis failed: {_child_death(pid)}") from None
    finally:
        child.close()  # (a child still writing gets EPIPE and ends)
        if frows is None:  # this process failed: the child's work is of no use
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return strings, refs, frows


def _figures(facts: tuple[int, int, float], frows: Any, progress: Progress) -> tuple[str, int, int, float]:
    """The run's figures (`store.analysis_save.run_figures` of the analysis) from (code bytes,
    covered bytes, start time), once it is done."""
    from binlens.analysis.engine import ENGINE_VERSION

    code_bytes, covered, t0 = facts
    progress(1.0, 1.0, f"{frows.counts[0]} functions")
    return ENGINE_VERSION, code_bytes, covered, time.perf_counter() - t0


# The child's share of the functions (by chunks): on libc the parent's references and strings take
# about as long as building the other 38% of the functions with their rows.
_CHILD_SHARE = 0.62


def _split(bodies: dict) -> int:
    """How many bodies, in address order, the child builds: its share of all their chunks."""
    sizes = [len(bodies[f].chunks) for f in sorted(bodies)]
    goal = _CHILD_SHARE * sum(sizes)
    done = 0
    for i, n in enumerate(sizes):
        if done >= goal:
            return i
        done += n
    return len(sizes)


def _child_death(pid: int) -> str:
    """How the function builder ended, as words."""
    try:
        _pid, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return "its function builder stopped"
    if os.WIFSIGNALED(status):
        return f"its function builder was killed by signal {os.WTERMSIG(status)}"
    return f"its function builder stopped (exit status {os.waitstatus_to_exitcode(status)})"


def _save(req: AnalysisRequest, rows: _Rows, send: Callable[[Any], None]) -> None:
    from binlens.analysis.engine import gc_paused
    from binlens.store import ProgramDatabase
    from binlens.store.analysis_save import write_analysis

    send(("progress", 1, 1, "saving to the program database"))
    db = ProgramDatabase(Path(req.db_path))
    # The commit only appends to the write-ahead log; copying it into the database (~30 ms for
    # libc) happens after "done", while the caller already reads.
    conn = db.connect()
    conn.execute("PRAGMA wal_autocheckpoint=0")
    with gc_paused():
        write_analysis(db, rows.figures, rows.functions, rows.references, rows.warnings)
    if rows.functions.spool is not None:
        rows.functions.spool.close()  # (a temporary file: gone once closed)
    _retained.append(rows)  # freed by the exit, not object by object as the frames unwind
    send(("done", rows.functions.counts[0]))
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    db.close()


def main() -> None:
    """Entry point of `python -m binlens.analysis_worker`: one request on stdin, frames on stdout."""
    # One analysis and out: its objects are acyclic or live to the end, and a cyclic collection
    # after the engine (which pauses the collector while it runs) would walk all of them (~50 ms).
    gc.disable()
    import binlens.analysis  # noqa: F401 - import while the caller still prepares the request
    import binlens.loader.parse_elf  # noqa: F401
    import binlens.store.analysis_save  # noqa: F401

    out = sys.stdout.buffer
    try:
        req = read_frame(sys.stdin.buffer)
    except EOFError:
        return  # an unused spare
    try:
        if req.home is not None:
            analyse_early(req, sys.stdin.buffer, lambda frame: write_frame(out, frame))
        else:
            analyse_and_save(req, lambda frame: write_frame(out, frame))
    except BinlensError as err:
        write_frame(out, ("error", err.code, err.message, err.target))
    except BrokenPipeError:
        return
    except Exception as err:  # noqa: BLE001 - reported to the caller as a clean error, the trace goes to stderr
        import traceback

        traceback.print_exc(file=sys.stderr)
        write_frame(out, ("error", "internal", f"the analysis failed: internal error ({type(err).__name__})", None))


if __name__ == "__main__":
    main()
    # Everything is saved and reported (the database is closed): skip the interpreter's teardown,
    # which frees the analysis object by object (~60 ms for libc) while the caller waits for the exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
