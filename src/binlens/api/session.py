"""session.*: who this server is (package, build, path, MCP SDK, catalog), what the connection
negotiated, what is open, its limits, and which methods can run here and why not; and
`session.shutdown`, which stops the serving transport (`Workspace.stop_server`, given by `binlens
serve` and `binlens mcp`) for a caller on this machine or holding the token."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import threading
from pathlib import Path

from pydantic import Field

import binlens
from binlens.api.common import ProgramIdentity
from binlens.api.interface import catalog_digest
from binlens.api.models import Params, Result
from binlens.api.registry import LIFECYCLE, READ_ONLY, REGISTRY, CallContext, method
from binlens.api.requirements import first_missing
from binlens.errors import BinlensError
from binlens.workspace import Workspace


class SessionGetParams(Params):
    expected_package_version: str | None = Field(
        None, max_length=128, description="The binlens version the client expects; a difference is reported."
    )
    expected_catalog_digest: str | None = Field(
        None, max_length=128, description="The catalog_digest the client was built against; a difference is reported."
    )
    expected_server_path: str | None = Field(
        None,
        max_length=4096,
        description="The binlens the client means to run (its package folder, python or command); "
        "another one is reported.",
    )


class SessionLimits(Result):
    max_response_bytes: int
    max_concurrent: int
    parse_timeout_s: float
    max_read_bytes: int


class MethodAvailability(Result):
    available: bool
    reason: str | None = Field(None, description="Why a call would fail here (read-only, a missing provider, ...).")
    remediation: str | None = Field(None, description="What would make the method available.")
    required_client_features: list[str] = Field(
        default_factory=list, description="Client capabilities the method needs (MCP: sampling, elicitation, ...)."
    )
    missing_client_features: list[str] = Field(
        default_factory=list, description="Those of them this connection's client did not negotiate."
    )


class Mismatch(Result):
    field: str = Field(description="The expected_* input that differs.")
    expected: str
    actual: str | None


class SessionInfo(Result):
    server: str
    version: str = Field(description="The binlens package version.")
    build_revision: str | None = Field(
        description="The source revision (git commit) this binlens runs from, when known "
        "($BINLENS_BUILD_REVISION, else the checkout's git HEAD)."
    )
    server_path: str = Field(description="The folder of the binlens package this server runs.")
    python: str = Field(description="The Python interpreter running it.")
    mcp_sdk_version: str | None = Field(description="The version of the official MCP SDK (the `mcp` package).")
    transport: str = Field(description="How this call arrived: mcp, websocket or local (CLI, library).")
    protocol_version: str | None = Field(
        description="The protocol version the connection negotiated (MCP); null where the transport has none."
    )
    client_features: list[str] | None = Field(
        description="The capabilities the client declared (MCP); null where the transport has none."
    )
    catalog_digest: str = Field(description="sha256 of the RFC 8785 canonical JSON of the full interface.get.")
    read_only: bool
    home: str
    roots: list[str]
    programs: list[ProgramIdentity]
    limits: SessionLimits
    tool_availability: dict[str, MethodAvailability] = Field(
        description="Every method of interface.get (and tools/list), and whether it can run for this client now."
    )
    mismatches: list[Mismatch] = Field(description="The expected_* inputs this server does not match.")


def method_availability(ws: Workspace, ctx: CallContext | None = None) -> dict[str, MethodAvailability]:
    """Each method's availability on `ws` for the client calling through `ctx`: its first unmet
    requirement's reason and remedy, and the client features it needs and lacks."""
    out = {}
    for name, spec in sorted(REGISTRY.items()):
        unmet = first_missing(ws, spec.requires, ctx)
        needed = [r.name for r in spec.requires if r.kind == "client"]
        lacking = [r.name for r in spec.requires if r.kind == "client" and r.missing(ws, ctx) is not None]
        out[name] = MethodAvailability(
            available=unmet is None,
            reason=None if unmet is None else unmet[1].reason,
            remediation=None if unmet is None else unmet[1].remediation,
            required_client_features=needed,
            missing_client_features=lacking,
        )
    return out


_revision: list[str | None] = []
_revision_lock = threading.Lock()


def build_revision() -> str | None:
    """$BINLENS_BUILD_REVISION, else the git HEAD of the checkout binlens runs from (None when it
    runs from an installed package, or git is missing)."""
    env = os.environ.get("BINLENS_BUILD_REVISION")
    if env:
        return env
    with _revision_lock:
        if not _revision:
            root = Path(binlens.__file__).resolve().parents[2]
            found = None
            if (root / ".git").exists():
                try:
                    done = subprocess.run(
                        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
                    )
                    if done.returncode == 0 and done.stdout.strip():
                        found = done.stdout.strip()
                except (OSError, subprocess.SubprocessError):
                    found = None
            _revision.append(found)
        return _revision[0]


def mcp_sdk_version() -> str | None:
    """The installed `mcp` package's version, or None."""
    try:
        return importlib.metadata.version("mcp")
    except importlib.metadata.PackageNotFoundError:
        return None


def server_path() -> Path:
    """The folder of the running binlens package."""
    return Path(binlens.__file__).resolve().parent


def _is_this_server(expected: str) -> bool:
    """Whether `expected` names this server: its package folder (or the folder above it), its
    Python, or the command it was started as."""
    try:
        want = Path(expected).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    pkg = server_path()
    candidates = {pkg, pkg.parent, Path(sys.executable).resolve()}
    if sys.argv and sys.argv[0]:
        candidates.add(Path(sys.argv[0]).resolve())
    return want in candidates


def mismatches(p: SessionGetParams, version: str, digest: str) -> list[Mismatch]:
    """The expected_* inputs of `p` that this server does not match."""
    out = []
    if p.expected_package_version is not None and p.expected_package_version != version:
        out.append(Mismatch(field="expected_package_version", expected=p.expected_package_version, actual=version))
    if p.expected_catalog_digest is not None and p.expected_catalog_digest != digest:
        out.append(Mismatch(field="expected_catalog_digest", expected=p.expected_catalog_digest, actual=digest))
    if p.expected_server_path is not None and not _is_this_server(p.expected_server_path):
        out.append(Mismatch(field="expected_server_path", expected=p.expected_server_path, actual=str(server_path())))
    return out


@method("session.get", effect=READ_ONLY)
def session_get(ws: Workspace, p: SessionGetParams, ctx: CallContext) -> SessionInfo:
    """Who this server is (version, build, path, MCP SDK, catalog digest), what this connection
    negotiated, open programs, limits, and which methods can run here and why not."""
    lim = ws.limits
    digest = catalog_digest()
    return SessionInfo(
        server=ws.config.server_name,
        version=ws.version,
        build_revision=build_revision(),
        server_path=str(server_path()),
        python=sys.executable,
        mcp_sdk_version=mcp_sdk_version(),
        transport=ctx.transport,
        protocol_version=ctx.protocol_version,
        client_features=None if ctx.client_features is None else sorted(ctx.client_features),
        catalog_digest=digest,
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
        tool_availability=method_availability(ws, ctx),
        mismatches=mismatches(p, ws.version, digest),
    )


class SessionShutdownParams(Params):
    grace_ms: int = Field(
        5000, ge=0, le=60000, description="How long calls already running may take to finish before they are cancelled."
    )


class ShutdownAccepted(Result):
    stopping: bool = Field(description="True: the server refuses new calls and exits (status 0) after the grace.")
    grace_ms: int
    transport: str = Field(description="The interface that stops: mcp (stdio or HTTP) or websocket.")


@method("session.shutdown", effect=LIFECYCLE, requires=("caller:trusted",))
def session_shutdown(ws: Workspace, p: SessionShutdownParams, ctx: CallContext) -> ShutdownAccepted:
    """Stop the server: refuse new calls, let running ones finish (grace_ms), close programs, exit 0."""
    if ws.stop_server is None:
        raise BinlensError(
            "unsupported", "this interface has no server to stop (a one-shot call ends by itself)", target="/method"
        )
    ws.stopping = True
    ws.stop_server(p.grace_ms / 1000)
    return ShutdownAccepted(stopping=True, grace_ms=p.grace_ms, transport=ctx.transport)
