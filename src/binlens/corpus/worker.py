"""One file's indexing, as a Ray worker runs it: analysis into the program database, fingerprints,
strings and imports, returned as a `BinaryRecord`.

The analysis is the one `binlens functions FILE` runs (`jobs/rows.py`'s `analyse`, saved with
`store/analysis_save.py`'s `write_analysis` into the database of the file's digest under the
home), run in this process rather than in an analysis process of its own: the Ray worker is
already a disposable process (the driver kills it past the file's time budget, and a crash loses
only it). An analysis already stored by this engine is reused, as a program opened again reuses
it, and so are stored fingerprints that match it.

Functions here run in the worker; nothing imports Ray.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

from binlens.corpus.records import BinaryRecord

_FORMATS = {"ELF": "elf", "PE": "pe", "MachO": "macho"}
MAX_STRING_CHARS = 1024  # longer strings are kept cut to this many characters
MAX_STRINGS = 20000  # the most distinct strings kept for one binary (the shortest-first rest is dropped)


def prepare() -> None:
    """Import what indexing needs and run analyses in this process alone (a worker is one CPU)."""
    os.environ["BINLENS_SERIAL"] = "1"  # (no forked function builder beside the references)
    import binlens.analysis.engine  # noqa: F401
    import binlens.corpus.fingerprints  # noqa: F401
    import binlens.jobs.rows  # noqa: F401
    import binlens.store.analysis_save  # noqa: F401


def index_file(path: str, sha256: str, home: str, max_bytes: int, parse_timeout: float = 8.0) -> BinaryRecord:
    """Analyse the file at `path` (whose bytes must still hash to `sha256`) into its program
    database under `home`, and return what the corpus keeps of it. Raises BinlensError."""
    from binlens.errors import BinlensError
    from binlens.loader.digest import sha256_hex
    from binlens.loader.input_file import read_input
    from binlens.loader.isolate import parse_bytes
    from binlens.store import ProgramDatabase, database_path

    prepare()
    t0 = time.perf_counter()
    opened = read_input(path, max_bytes=max_bytes, target=None)
    if sha256_hex(opened.data) != sha256:
        raise BinlensError("conflict", f"{path} changed since it was found (its SHA-256 differs)")
    image = parse_bytes(opened.data, opened.path.name, None, timeout=parse_timeout)
    ident = image.identity
    db = ProgramDatabase(database_path(Path(home), ident.sha256, ident.slice), ident.size)
    try:
        db.record_image(ident.sha256, ident.file_name, ident.size, ident.format, ident.arch, ident.slice)
        view = _analysis(image, db)
        from binlens.corpus.fingerprints import new_decoder, stored_or_computed, tail_calls

        fps = stored_or_computed(image, db, view, new_decoder(image))
        tails = tail_calls(db, view)
        strings = _strings(t for _a, _n, _e, t, _s, _r in view.strings())
        imports = sorted({_text(i.name) for i in image.imports if i.name})
    finally:
        db.close()
    record = BinaryRecord(
        sha256=sha256,
        path=path,
        size=ident.size,
        format=_FORMATS.get(ident.format, ident.format.lower()),
        arch=ident.arch,
        bits=ident.bits,
        functions=fps,
        strings=strings,
        imports=imports,
        seconds=round(time.perf_counter() - t0, 4),
        tail_calls=tails,
    )
    del image, view
    gc.collect()  # (the worker lives on: the analysis's cycles go before the next file)
    return record


def _analysis(image: Any, db: Any) -> Any:
    """The stored analysis of `image` by this engine, or a new one saved to `db` first."""
    from binlens.analysis import ENGINE_VERSION
    from binlens.analysis.engine import gc_paused
    from binlens.jobs.rows import analyse, retained
    from binlens.store.analysis import AnalysisView, allocate_run, finish_run, load_run, user_functions
    from binlens.store.analysis_save import write_analysis

    run = load_run(db)
    if run is not None and run.engine == ENGINE_VERSION and run.status == "done":
        return AnalysisView(db)
    run_id = allocate_run(db, "full", ENGINE_VERSION)
    status = "failed"
    try:
        user = user_functions(db)
        extra = sorted(a for a, d in user.items() if d)
        excluded = sorted(a for a, d in user.items() if not d)
        rows = analyse(image, _no_progress, extra, excluded)
        with gc_paused():
            write_analysis(db, rows.figures, rows.functions, rows.references, rows.warnings, run_id)
        if rows.functions.spool is not None:
            rows.functions.spool.close()
        retained.clear()
        del rows
        status = "done"
    finally:
        finish_run(db, run_id, status)
    return AnalysisView(db)


def _no_progress(_done: float, _total: float | None, _message: str | None) -> None:
    return None


def _strings(texts: Any) -> list[str]:
    """Distinct strings, each cut to `MAX_STRING_CHARS`, at most `MAX_STRINGS` of them."""
    out = sorted({_valid(t[:MAX_STRING_CHARS]) for t in texts if t and "\0" not in t})
    if len(out) > MAX_STRINGS:
        keep = set(sorted(out, key=len)[:MAX_STRINGS])
        out = [t for t in out if t in keep]
    return out


def _valid(text: str) -> str:
    """`text` as valid UTF-8 can carry it (a lone surrogate becomes U+FFFD)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _text(name: object) -> str:
    if isinstance(name, str):
        return name
    return bytes(name).decode("latin-1")  # type: ignore[call-overload]
