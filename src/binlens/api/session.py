"""session.*: who this server is, what is open, and its limits."""

from __future__ import annotations

from binlens.api.common import ProgramIdentity
from binlens.api.models import Params, Result
from binlens.api.registry import READ_ONLY, method
from binlens.workspace import Workspace


class SessionGetParams(Params):
    pass


class SessionLimits(Result):
    max_response_bytes: int
    max_concurrent: int
    parse_timeout_s: float
    max_read_bytes: int


class SessionInfo(Result):
    server: str
    version: str
    read_only: bool
    home: str
    roots: list[str]
    programs: list[ProgramIdentity]
    limits: SessionLimits


@method("session.get", effect=READ_ONLY)
def session_get(ws: Workspace, p: SessionGetParams) -> SessionInfo:
    """Server name and version, open programs, roots and limits."""
    lim = ws.limits
    return SessionInfo(
        server=ws.config.server_name,
        version=ws.version,
        read_only=ws.read_only,
        home=str(ws.config.home),
        roots=[str(r) for r in ws.config.roots],
        programs=[ProgramIdentity(**prog.identity) for prog in ws.programs.values()],
        limits=SessionLimits(
            max_response_bytes=lim.max_response_bytes,
            max_concurrent=lim.max_concurrent,
            parse_timeout_s=lim.parse_timeout_s,
            max_read_bytes=lim.max_read_bytes,
        ),
    )
