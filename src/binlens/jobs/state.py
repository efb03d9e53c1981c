"""Per-program analysis state: run the engine in the background once, cache it in the database.

Attached to every program when it opens (`components.OPEN_HOOKS`, `Program.extensions["analysis"]`).
Methods that need the analysis call `require()`: it starts the analysis on first need, relays
its progress to the waiting call's `CallContext.progress`, honours cancellation, and either
returns the stored view, fails with `timeout` past the caller's bound, or with `unavailable`
(plus progress) when the caller asked not to wait.

The full analysis runs in its own process (`jobs/child.py`, driven by `jobs/client.py`): it
loads the image, analyses it and saves the result to the program database, while this process
only relays its progress, kills it on cancellation or past `budget_s`, and reads the committed
result. Local re-analysis (`define_function`/`undefine_function`) stays in-process: it is small.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any

from binlens.analysis import ENGINE_VERSION
from binlens.analysis.model import function_display_name
from binlens.errors import BinlensError
from binlens.jobs.client import AnalysisProcess
from binlens.jobs.request import AnalysisRequest
from binlens.store.analysis import (
    AnalysisView,
    FunctionRow,
    allocate_run,
    finish_run,
    load_run,
    name_stored_run,
    set_user_function,
    user_functions,
)
from binlens.store.analysis_save import replace_functions
from binlens.store.annotations import flow_override_rows
from binlens.workspace import Program, Workspace

log = logging.getLogger("binlens.analysis")
_SUB_RE = re.compile(r"^sub_([0-9a-fA-F]+)$")
DEFAULT_ANALYSIS_BUDGET_S = 900.0  # the analysis process is killed past this (BINLENS_ANALYSIS_BUDGET_S)
# how long program.close waits for the analysis process it stops to be gone
CLOSE_DRAIN_S = float(os.environ.get("BINLENS_CLOSE_DRAIN_S", "10"))


class ProgramAnalysisState:
    """The analysis of one program: status, progress, and the stored view once done."""

    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.status = "not_started"  # not_started | running | done | failed | cancelled
        self.fraction = 0.0
        self.message = ""
        self.error: str | None = None
        self.error_target: str | None = None  # the JSON pointer of what the failure concerns, when one does
        self.view: AnalysisView | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._waiters = 0
        self.worker: AnalysisProcess | None = None  # the analysis process while one runs
        self.budget_s = float(os.environ.get("BINLENS_ANALYSIS_BUDGET_S", DEFAULT_ANALYSIS_BUDGET_S))
        self.started_at: float | None = None
        # the run whose analysis this program has (or will have): a stored analysis names its
        # run; otherwise the full analysis's run is allocated now, before any of its work starts
        self.run_id: str | None = None
        self._run_started = False  # whether `run_id`'s run has started (a restart allocates a new one)
        run = load_run(prog.db)
        if run is not None and run.engine == ENGINE_VERSION and run.status == "done":
            self.view = AnalysisView(prog.db)
            self.status = "done"
            self.fraction = 1.0
            self.message = f"loaded from the program database ({len(self.view.functions)} functions)"
            self.run_id = run.run_id
            if self.run_id is None:  # (saved before run ids: named once, then kept)
                self.run_id = allocate_run(prog.db, "stored", run.engine)
                finish_run(prog.db, self.run_id, "done")
                name_stored_run(prog.db, self.run_id)
                named = load_run(prog.db)  # (another process may have named it first)
                self.run_id = named.run_id if named is not None else self.run_id
            self._run_started = True
            self._done.set()
        else:
            self.run_id = allocate_run(prog.db, "full", ENGINE_VERSION)

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        """Start the analysis (in its own process, watched by a thread) unless it runs or is done."""
        with self._lock:
            if self.status in ("running", "done"):
                return
            if self._run_started or self.run_id is None:  # (a run that ended: this one is new)
                self.run_id = allocate_run(self.prog.db, "full", ENGINE_VERSION)
            self._run_started = True
            self.status = "running"
            self.error = None
            self.error_target = None
            self.fraction = 0.0
            self.message = "starting"
            self._done.clear()
            self._cancel.clear()
            self.started_at = time.monotonic()
            self._thread = threading.Thread(target=self._run, name=f"analysis-{self.prog.handle}", daemon=True)
            self._thread.start()

    def _progress(self, done: float, total: float | None, message: str | None) -> None:
        if total:  # passes re-walk the code: keep the reported share monotonic
            self.fraction = max(self.fraction, min(1.0, done / total))
        if message:
            self.message = message

    def _request(self, with_bytes: bool = False) -> AnalysisRequest:
        ident = self.prog.image.identity
        return AnalysisRequest(
            path=str(self.prog.path),
            sha256=ident.sha256,
            db_path=str(self.prog.db.path),
            slice_name=ident.slice,
            data=bytes(self.prog.image.data) if with_bytes else None,
            max_file_bytes=len(self.prog.image.data),
            run_id=self.run_id,
            flow_overrides=flow_override_rows(self.prog.db.connect()),
            **self._user_starts(),
        )

    def _analyse_in_process(self) -> int:
        """Run the analysis process to the end: the number of functions it saved."""
        request = self._request()
        for attempt in range(2):
            self.worker = AnalysisProcess(request, self.prog.image)
            try:
                return self.worker.run(self._progress, self._cancel, self.budget_s)
            except BinlensError as err:
                if err.code != "conflict" or attempt:
                    raise
                request = self._request(with_bytes=True)  # the file changed or went: send the opened bytes
            finally:
                self.worker = None
        raise AssertionError("unreachable")

    def _run(self) -> None:
        try:
            self._analyse_in_process()
            view = AnalysisView(self.prog.db)
            with self._lock:
                self.view = view
                self.status = "done"
                self.fraction = 1.0
                self.message = f"{len(view.functions)} functions"
                stored = load_run(self.prog.db)
                if stored is not None and stored.run_id is not None:
                    self.run_id = stored.run_id  # (another process's run may have saved the rows first)
        except BinlensError as err:
            with self._lock:
                if err.code == "cancelled":
                    self.status = "cancelled"
                    self.message = "cancelled"
                else:
                    self.status = "failed"
                    self.error = err.message
                    self.error_target = err.target
        except Exception as err:  # noqa: BLE001 - reported through analysis.get, logged here
            log.exception("analysis of %s failed", self.prog.path)
            with self._lock:
                self.status = "failed"
                self.error = f"internal error: {type(err).__name__}"
        finally:
            if self.run_id is not None:
                try:
                    finish_run(self.prog.db, self.run_id, self.status)
                except Exception:  # noqa: BLE001 - the log line is bookkeeping; the run's result stands
                    log.exception("could not log the end of run %s", self.run_id)
            self._done.set()

    def _user_starts(self) -> dict[str, Any]:
        user = user_functions(self.prog.db)
        if not user:
            return {}
        return {
            "extra_starts": sorted(a for a, d in user.items() if d),
            "excluded_starts": sorted(a for a, d in user.items() if not d),
        }

    def cancel(self) -> None:
        """Stop a running analysis: its process is killed within ~20 ms."""
        self._cancel.set()

    def drain(self, timeout_s: float | None = None) -> list[str]:
        """Stop the running analysis (the program closes) and wait up to `timeout_s` for its
        process to be gone; what still runs after that, named (empty when nothing does)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return []
        self.cancel()
        thread.join(CLOSE_DRAIN_S if timeout_s is None else timeout_s)
        if not thread.is_alive():
            return []
        worker = self.worker
        pid = worker.proc.pid if worker is not None else None
        return [f"analysis run {self.run_id} (process {pid})" if pid else f"analysis run {self.run_id}"]

    # ------------------------------------------------------------------ waiting
    def require(self, ctx: Any = None, *, wait: bool = True, timeout_s: float = 60.0) -> AnalysisView:
        """The analysis view, starting and waiting for the analysis as needed."""
        if self.view is not None and self.status == "done":
            return self.view
        if self.status == "failed":
            raise BinlensError(
                "unavailable", f"the analysis failed: {self.error}", target=self.error_target, details=self.snapshot()
            )
        self.start()
        if not wait:
            raise BinlensError(
                "unavailable", "the analysis is still running; retry later or wait", details=self.snapshot()
            )
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._waiters += 1
        try:
            while not self._done.wait(0.1):
                if ctx is not None:
                    try:
                        ctx.progress(round(self.fraction * 100, 1), 100, self.message)
                    except BinlensError:
                        with self._lock:
                            last = self._waiters == 1
                        if last:
                            self.cancel()
                            self._done.wait(5.0)  # its process killed and reaped before the call answers
                        raise
                if time.monotonic() > deadline:
                    raise BinlensError(
                        "timeout",
                        f"the analysis did not finish within {timeout_s:g} s; it keeps running in the background",
                        details=self.snapshot(),
                    )
        finally:
            with self._lock:
                self._waiters -= 1
        if self.status != "done" or self.view is None:
            raise BinlensError(
                "unavailable",
                f"the analysis {self.status}: {self.error or self.message}",
                target=self.error_target if self.status == "failed" else None,
                details=self.snapshot(),
            )
        if ctx is not None:
            ctx.progress(100, 100, self.message)
        return self.view

    def snapshot(self) -> dict[str, Any]:
        """Status and progress as plain data."""
        return {
            "status": self.status,
            "progress": round(self.fraction, 4),
            "message": self.message,
            "run_id": self.run_id,
        }

    # ------------------------------------------------------------------ for other layers
    def _ready(self) -> AnalysisView | None:
        """The view, running the analysis first if needed; None when it cannot run (unsupported code)."""
        try:
            return self.require(None, wait=True, timeout_s=3600)
        except BinlensError:
            return None

    @property
    def functions(self) -> list[FunctionRow]:
        """All functions in address order (runs the analysis first if needed)."""
        view = self._ready()
        return view.functions if view is not None else self._metadata_functions()

    def function_at(self, va: int) -> FunctionRow | None:
        """The function that starts at `va`, or None (runs the analysis first if needed)."""
        view = self._ready()
        if view is None:
            return next((f for f in self._metadata_functions() if f.address == va), None)
        return view.by_address.get(va)

    def function_containing(self, va: int) -> FunctionRow | None:
        """The function starting at `va`, else the one with a block containing it (runs the analysis if needed)."""
        view = self._ready()
        return view.function_at(va) if view is not None else self.function_at(va)

    def _metadata_functions(self) -> list[FunctionRow]:
        """When the engine cannot analyse the code: entry, function symbols and exports in code."""
        img = self.prog.image
        rows: dict[int, FunctionRow] = {}
        code = [s for s in img.sections if s.kind == "code" and s.size]

        def in_code(va: int) -> bool:
            return any(s.va <= va < s.end for s in code)

        for s in img.symbols:
            if s.kind == "function" and in_code(s.address):
                rows.setdefault(
                    s.address, FunctionRow(s.address, s.size, _text(s.name), None, ("symbol",), False, 0, 0)
                )
        for e in img.exports:
            if in_code(e.address):
                rows.setdefault(e.address, FunctionRow(e.address, 0, _text(e.name), None, ("export",), False, 0, 0))
        if img.identity.entry and in_code(img.identity.entry):
            rows.setdefault(img.identity.entry, FunctionRow(img.identity.entry, 0, None, None, ("entry",), False, 0, 0))
        return sorted(rows.values(), key=lambda f: f.address)

    def define_function(self, va: int, ctx: Any = None, timeout_s: float = 600.0) -> FunctionRow | None:
        """Make `va` a function start: re-analyse it and the function it was part of, update the database.

        The choice is kept (`user_function`), so a later full analysis honours it too.
        """
        view = self.require(ctx, timeout_s=timeout_s)
        set_user_function(self.prog.db, va, True)
        current = view.by_address.get(va)
        container = view.function_at(va) if current is None else current
        entries = [va] + ([container.address] if container is not None and container.address != va else [])
        sources = {va: tuple(dict.fromkeys((*current.sources, "user"))) if current else ("user",)}
        if container is not None and container.address != va:
            sources[container.address] = container.sources
        self._reanalyse(view, entries, set(view.starts) | {va}, {va} | set(entries), sources)
        return self.function_at(va)

    def undefine_function(self, va: int, ctx: Any = None, timeout_s: float = 600.0) -> None:
        """Stop treating `va` as a function start: re-analyse the functions that ran into it, update the database."""
        view = self.require(ctx, timeout_s=timeout_s)
        set_user_function(self.prog.db, va, False)
        if va not in view.by_address:
            return
        affected = {fn for _s, _d, _k, fn in view.xrefs_to(va, ("jump", "tail_call")) if fn is not None}
        before = view.function_at(va - 1) if va else None
        if before is not None:
            affected.add(before.address)
        affected.discard(va)
        sources = {fn: view.by_address[fn].sources for fn in affected if fn in view.by_address}
        self._reanalyse(view, sorted(affected), set(view.starts) - {va}, {va} | affected, sources)

    def reload(self) -> None:
        """Re-read the stored analysis: a rolled-back transaction (an all_or_none batch) took back
        the rows of the local re-analyses made inside it."""
        with self._lock:
            if self.status != "done":
                return
            self.view = AnalysisView(self.prog.db)
            stored = load_run(self.prog.db)
            if stored is not None and stored.run_id is not None:
                self.run_id = stored.run_id

    def reanalyse_flow(self, va: int, ctx: Any = None, timeout_s: float = 600.0) -> list[int]:
        """Re-analyse the functions whose code holds the instruction at `va`, whose flow override
        changed (the overrides are read from the database); the entries re-analysed."""
        view = self.require(ctx, timeout_s=timeout_s)
        affected = view.functions_containing(va)
        if affected:
            sources = {fn: view.by_address[fn].sources for fn in affected if fn in view.by_address}
            self._reanalyse(view, affected, set(view.starts), set(affected), sources)
        return affected

    def _reanalyse(
        self,
        view: AnalysisView,
        entries: list[int],
        starts: set[int],
        remove: set[int],
        sources: dict[int, tuple[str, ...]],
    ) -> None:
        noret = {f.address for f in view.functions if f.noreturn}
        strings = {a for a, *_rest in view.strings()}
        from binlens.analysis.local import analyze_functions  # (the engine loads for the first edit)

        # (ARM: a Thumb function is walked again in Thumb state, named by bit 0 as a pointer to it is)
        walked = [e | 1 if (f := view.by_address.get(e)) is not None and f.mode == "thumb" else e for e in entries]
        run_id = allocate_run(self.prog.db, "local", ENGINE_VERSION)
        try:
            overrides = flow_override_rows(self.prog.db.connect())
            functions, xrefs = analyze_functions(self.prog.image, walked, starts, noret, strings, overrides)
            replace_functions(self.prog.db, remove, functions, xrefs, sources, run_id)
        except BaseException:
            finish_run(self.prog.db, run_id, "failed")
            raise
        finish_run(self.prog.db, run_id, "done")
        with self._lock:
            self.view = AnalysisView(self.prog.db)
            self.run_id = run_id

    def resolve_name(self, name: str) -> int | None:
        """`sub_<hex>` and import-thunk names of analysed functions."""
        view = self.view
        m = _SUB_RE.match(name)
        if m:
            va = int(m.group(1), 16)
            if view is None:  # before the analysis: any address in code
                sec = self.prog.image.section_at(va)
                return va if sec is not None and sec.kind == "code" else None
            return va if va in view.by_address else None
        return view.thunks.get(name) if view is not None else None


def analysis_of(prog: Program) -> ProgramAnalysisState:
    """The program's analysis state (created on first use)."""
    st = prog.extensions.get("analysis")
    if st is None:
        st = ProgramAnalysisState(prog)
        prog.extensions["analysis"] = st
        prog.name_resolvers.append(st.resolve_name)
    return st


def function_name(prog: Program, f: FunctionRow) -> str:
    """The one displayed name of a function: its user name or the name at its address, else
    `function_display_name` (its symbol, else its thunk's import, else `sub_<hex>`)."""
    return _text(prog.name_at(f.address)) or function_display_name(f.address, f.symbol, f.thunk)


def _text(name: object) -> str | None:
    if name is None or isinstance(name, str):
        return name
    return bytes(name).decode("latin-1")  # type: ignore[call-overload]


def name_for_address(prog: Program, va: int) -> str | None:
    """A display name for any address: a function's name, else a symbol, else None."""
    st = prog.extensions.get("analysis")
    if st is not None and st.view is not None:
        f = st.view.by_address.get(va)
        if f is not None:
            return function_name(prog, f)
    name = _text(prog.name_at(va))
    if name:
        return name
    for imp in prog.image.imports:
        if imp.slot == va:
            return _text(imp.name)
    return None


def on_open(_ws: Workspace, prog: Program) -> None:
    """Attach the program's analysis state when it opens (`components.OPEN_HOOKS`); closing the
    program stops its analysis and waits for the process (`drain`)."""
    state = analysis_of(prog)
    prog.on_close.append(state.drain)
