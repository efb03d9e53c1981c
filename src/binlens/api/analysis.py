"""analysis.*: status, counts and progress of the engine's analysis; starting it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from binlens.analysis import ENGINE_VERSION
from binlens.api.models import Params, ProgramRef, Result, Selector
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of
from binlens.store.analysis import AnalysisView, FunctionRow, load_run
from binlens.workspace import Program, Workspace

Status = Literal["not_started", "running", "done", "failed", "cancelled"]


class NeedsAnalysis(Params):
    """Fields shared by methods that need the analysis: wait for it (bounded) or not."""

    program: ProgramRef | None = None
    wait: bool = Field(True, description="Wait for the analysis if it is not done yet; false: fail with 'unavailable'.")
    timeout_ms: int = Field(120000, ge=100, le=3600000, description="How long to wait for the analysis.")


def need_view(ws: Workspace, p: NeedsAnalysis, ctx: CallContext | None) -> tuple[Program, AnalysisView]:
    """The program and its analysis view, waiting as the params say."""
    prog = ws.program(p.program)
    view = analysis_of(prog).require(ctx, wait=p.wait, timeout_s=p.timeout_ms / 1000)
    if ctx is not None:
        for w in run_warnings(prog, view):
            ctx.warn(f"analysis: {w}")
    return prog, view


def run_warnings(prog: Program, view: AnalysisView) -> list[str]:
    """What of the program the stored analysis left out or cut (read once per analysis view)."""
    cached = prog.extensions.get("analysis.run_warnings")
    if cached is None or cached[0] is not view:
        run = load_run(prog.db)
        cached = (view, run.warnings if run is not None else [])
        prog.extensions["analysis.run_warnings"] = cached
    return list(cached[1])


def select_function(prog: Program, view: AnalysisView, sel: Selector) -> FunctionRow:
    """The function a selector names: its entry or any address inside it."""
    if sel.name is not None:
        target = "/params/selector/name"
        va = prog.resolve(sel.name, target)
    else:
        target = "/params/selector/address"
        va = prog.resolve(sel.address or "", target)
    f = view.function_at(va)
    if f is None:
        raise BinlensError("not_found", f"no function at or around {hex(va)}", target=target)
    return f


def select_address(prog: Program, sel: Selector) -> tuple[int, str]:
    """The address a selector names, with the JSON pointer of the field that named it."""
    if sel.name is not None:
        return prog.resolve(sel.name, "/params/selector/name"), "/params/selector/name"
    return prog.resolve(sel.address or "", "/params/selector/address"), "/params/selector/address"


class AnalysisGetParams(Params):
    program: ProgramRef | None = None


class AnalysisStartParams(Params):
    program: ProgramRef | None = None
    wait: bool = Field(False, description="Wait until the analysis is done (progress is reported meanwhile).")
    timeout_ms: int = Field(600000, ge=100, le=3600000, description="How long to wait when 'wait' is true.")


class AnalysisCounts(Result):
    functions: int = 0
    blocks: int = 0
    instructions: int = 0
    xrefs: int = 0
    strings: int = 0


class AnalysisStatus(Result):
    status: Status
    run_id: str | None = Field(
        None,
        description="The run this status is of: the one that stored the analysis, or the one allocated to produce it.",
    )
    engine_version: str
    progress: float = Field(description="Share of the work done, 0..1.")
    message: str
    counts: AnalysisCounts | None = None
    code_bytes: int | None = None
    coverage: float | None = Field(None, description="Share of code bytes inside analysed functions.")
    seconds: float | None = None
    finished_at: str | None = None
    error: str | None = None
    warnings: list[str] = Field(
        default_factory=list,
        description="What of the program the analysis left out or cut, and why (odd section or segment tables).",
    )


def status_of(prog: Program) -> AnalysisStatus:
    """analysis.get's report for one program."""
    st = analysis_of(prog)
    out = AnalysisStatus(
        status=st.status,  # type: ignore[arg-type]  # ProgramAnalysis.status is a str of the same five values
        run_id=st.run_id,
        engine_version=ENGINE_VERSION,
        progress=round(st.fraction, 4),
        message=st.message,
        error=st.error,
    )
    if st.status == "done":
        run = load_run(prog.db)
        if run is not None:
            out.counts = AnalysisCounts(**run.counts)
            out.code_bytes = run.code_bytes
            out.coverage = round(run.covered_bytes / run.code_bytes, 4) if run.code_bytes else 0.0
            out.seconds = round(run.seconds, 3)
            out.finished_at = run.finished_at
            out.warnings = run.warnings
    return out


@method("analysis.get", effect=READ_ONLY)
def analysis_get(ws: Workspace, p: AnalysisGetParams) -> AnalysisStatus:
    """Status, progress and counts of the program's analysis (never waits)."""
    return status_of(ws.program(p.program))


@method("analysis.start", effect=READ_ONLY, long_running=True)
def analysis_start(ws: Workspace, p: AnalysisStartParams, ctx: CallContext) -> AnalysisStatus:
    """Start the analysis in the background (a no-op when it runs or is done); optionally wait for it."""
    prog = ws.program(p.program)
    st = analysis_of(prog)
    st.start()
    if p.wait:
        st.require(ctx, wait=True, timeout_s=p.timeout_ms / 1000)
    return status_of(prog)
