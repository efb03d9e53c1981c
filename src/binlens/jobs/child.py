"""The analysis process: one program's full analysis, in a disposable process of its own.

Run as `python -m binlens.jobs.child` (its own session, so it can be killed with everything it
forked; `jobs/spawn.py` starts it). It reads one `AnalysisRequest` frame on stdin, loads the image
itself through the loader's forked parser child (the fast ELF reader, else LIEF) unless the
request carries the caller's parsed image, checks that the bytes are the ones the caller opened,
builds the analysis's rows (`jobs/rows.py`) and writes them with `write_analysis` (one SQLite
transaction, in WAL mode beside the caller's readers). It streams `("progress", done, total,
message)` frames back on stdout and ends with `("done", functions)` or `("error", code, message,
target)` (`jobs/client.py` reads them).

An early start (the one-shot CLI, `AnalysisRequest.home` set) analyses at once and saves only
when the caller's full request follows (`analyse_early`).
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from binlens.errors import BinlensError
from binlens.frames import STATUS_OK, read_frame, write_frame
from binlens.jobs.request import AnalysisRequest, Progress
from binlens.jobs.rows import Rows, analyse, retained
from binlens.loader.digest import sha256_hex
from binlens.loader.input_file import read_input

_PROGRESS_EVERY_S = 0.05


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
    """`send` as a progress callback: at most one frame per `_PROGRESS_EVERY_S`, and each new message."""
    sent_at, sent_message = 0.0, ""

    def progress(done: float, total: float | None, message: str | None) -> None:
        nonlocal sent_at, sent_message
        now = time.monotonic()
        if now - sent_at >= _PROGRESS_EVERY_S or (message and message != sent_message):
            sent_at, sent_message = now, message or sent_message
            send(("progress", done, total, message))

    return progress


def analyse_and_save(req: AnalysisRequest, send: Callable[[Any], None]) -> None:
    """In the analysis process: load, analyse, save, and report through `send`."""
    send(("progress", 0, None, "loading the image"))
    image = _load(req)
    _save(req, analyse(image, _throttled(send), req.extra_starts, req.excluded_starts, req.flow_overrides), send)


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
        rows = analyse(image, _throttled(send), extra, excluded)
    try:
        _verb, full = read_frame(stdin)
    except EOFError:
        return  # the caller did not need it
    if full.sha256 != ident.sha256:
        raise BinlensError("conflict", f"{req.path} changed on disk since it was opened")
    full.data = image.data
    if rows is None or (full.extra_starts, full.excluded_starts) != (extra, excluded) or full.flow_overrides:
        analyse_and_save(full, send)
        return
    _save(full, rows, send)


def _save(req: AnalysisRequest, rows: Rows, send: Callable[[Any], None]) -> None:
    from binlens.analysis.engine import gc_paused
    from binlens.store import ProgramDatabase
    from binlens.store.analysis_save import write_analysis

    send(("progress", 1, 1, "saving to the program database"))
    db = ProgramDatabase(Path(req.db_path))
    # The commit only appends to the write-ahead log; copying it into the database (~30 ms for
    # libc) happens after "done", while the caller already reads.
    db.defer_checkpoints()
    with gc_paused():
        write_analysis(db, rows.figures, rows.functions, rows.references, rows.warnings, req.run_id)
    if rows.functions.spool is not None:
        rows.functions.spool.close()  # (a temporary file: gone once closed)
    retained.append(rows)  # freed by the exit, not object by object as the frames unwind
    send(("done", rows.functions.counts[0]))
    db.checkpoint()
    db.close()


def main() -> None:
    """Entry point of `python -m binlens.jobs.child`: one request on stdin, frames on stdout."""
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
