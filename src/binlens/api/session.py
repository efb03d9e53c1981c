"""session.*: who this server is, what is open, and its limits."""

from __future__ import annotations

from pydantic import Field

from binlens.api.common import ProgramIdentity
from binlens.api.models import Params, Result
from binlens.api.registry import READ_ONLY, REGISTRY, method
from binlens.api.requirements import first_missing
from binlens.workspace import Workspace


class SessionGetParams(Params):
    pass


class SessionLimits(Result):
    max_response_bytes: int
    max_concurrent: int
    parse_timeout_s: float
    max_read_bytes: int


class MethodAvailability(Result):
    available: bool
    reason: str | None = Field(None, description="Why a call would fail here (read-only, a missing provider, ...).")
    remediation: str | None = Field(None, description="What would make the method available.")


class SessionInfo(Result):
    server: str
    version: str
    read_only: bool
    home: str
    roots: list[str]
    programs: list[ProgramIdentity]
    limits: SessionLimits
    methods: dict[str, MethodAvailability] = Field(
        description="Every method of interface.get, and whether it can run on this server now."
    )


def method_availability(ws: Workspace) -> dict[str, MethodAvailability]:
    """Each method's availability on `ws`: its first unmet requirement's reason and remedy."""
    out = {}
    for name, spec in sorted(REGISTRY.items()):
        unmet = first_missing(ws, spec.requires)
        if unmet is None:
            out[name] = MethodAvailability(available=True, reason=None, remediation=None)
        else:
            out[name] = MethodAvailability(available=False, reason=unmet[1].reason, remediation=unmet[1].remediation)
    return out


@method("session.get", effect=READ_ONLY)
def session_get(ws: Workspace, p: SessionGetParams) -> SessionInfo:
    """Server name and version, open programs, roots, limits, and which methods can run here and why not."""
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
        methods=method_availability(ws),
    )
