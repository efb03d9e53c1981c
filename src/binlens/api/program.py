"""program.*: open, list, describe and close programs."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from binlens.api.common import ProgramIdentity
from binlens.api.models import Params, ProgramRef, Result
from binlens.api.registry import LIFECYCLE, READ_ONLY, method
from binlens.workspace import Program, Workspace


class ProgramOpenParams(Params):
    path: Annotated[str, Field(min_length=1, max_length=4096, description="File to open (under the roots).")]
    slice: str | None = Field(None, description="Architecture slice of a universal Mach-O (e.g. 'x86-64').")


class ProgramRefParams(Params):
    program: ProgramRef | None = None


class ProgramListParams(Params):
    pass


class SectionSummary(Result):
    name: str
    start: str
    end: str
    size: int
    perms: str
    kind: str


class ProgramDetails(Result):
    identity: ProgramIdentity
    run_id: str | None = Field(
        None,
        description="The analysis run of this program (analysis.get): the stored analysis's run, or the one "
        "allocated at open to produce it.",
    )
    path: str
    database: str
    slices: list[str]
    sections: list[SectionSummary]
    counts: dict[str, int]
    warnings: list[str]


class ProgramList(Result):
    items: list[ProgramIdentity]


class Closed(Result):
    closed: str
    cleanup_incomplete: bool = Field(
        False, description="True when some of the program's work could not be stopped in time (see remaining)."
    )
    remaining: list[str] = Field(
        default_factory=list, description="What of the program's work still runs (an analysis process, ...)."
    )


def details(prog: Program) -> ProgramDetails:
    """Everything program.get reports about one program."""
    img = prog.image
    st = prog.extensions.get("analysis")
    return ProgramDetails(
        identity=ProgramIdentity(**prog.identity),
        run_id=getattr(st, "run_id", None),
        path=str(prog.path),
        database=str(prog.db.path),
        slices=img.slices,
        sections=[
            SectionSummary(name=s.name, start=hex(s.va), end=hex(s.end), size=s.size, perms=s.perms, kind=s.kind)
            for s in img.sections
            if s.size
        ],
        counts={
            "segments": len(img.segments),
            "sections": len(img.sections),
            "symbols": len(img.symbols),
            "imports": len(img.imports),
            "exports": len(img.exports),
            "relocations": len(img.relocations),
        },
        warnings=img.warnings,
    )


@method("program.open", effect=LIFECYCLE)
def program_open(ws: Workspace, p: ProgramOpenParams) -> ProgramDetails:
    """Open an executable (ELF, PE, Mach-O) under the allowed roots and return its handle and identity."""
    return details(ws.open(p.path, p.slice))


@method("program.list", effect=READ_ONLY)
def program_list(ws: Workspace, p: ProgramListParams) -> ProgramList:
    """List the open programs."""
    return ProgramList(items=[ProgramIdentity(**prog.identity) for prog in ws.programs.values()])


@method("program.get", effect=READ_ONLY)
def program_get(ws: Workspace, p: ProgramRefParams) -> ProgramDetails:
    """Identity, sections, counts and database path of one program."""
    return details(ws.program(p.program))


@method("program.close", effect=LIFECYCLE)
def program_close(ws: Workspace, p: ProgramRefParams) -> Closed:
    """Close a program: stop its work (a running analysis is stopped and its process waited for;
    what cannot be stopped in time is reported), and keep its database on disk for the next open."""
    prog = ws.program(p.program)
    remaining = ws.close(prog.handle)
    return Closed(closed=prog.handle, cleanup_incomplete=bool(remaining), remaining=remaining)
