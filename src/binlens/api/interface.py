"""interface.*: the catalog of methods, their schemas and effects."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import rfc8785
from pydantic import Field

from binlens.api.models import Params, Result
from binlens.api.registry import READ_ONLY, REGISTRY, MethodSpec, method
from binlens.errors import BinlensError
from binlens.workspace import Workspace


class InterfaceGetParams(Params):
    method: str | None = Field(None, description="One method's full description (dotted name).")
    domain: str | None = Field(None, description="Only the methods of this domain.")
    schemas: bool = Field(True, description="Include input/output JSON Schemas.")


class MethodInfo(Result):
    name: str
    domain: str
    operation: str
    effect: str
    summary: str
    description: str
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None


class InterfaceInfo(Result):
    methods: list[MethodInfo]
    domains: list[str]


def describe(spec: MethodSpec, schemas: bool = True) -> MethodInfo:
    """The catalog entry of one method."""
    return MethodInfo(
        name=spec.name,
        domain=spec.domain,
        operation=spec.operation,
        effect=spec.effect,
        summary=spec.summary,
        description=spec.description,
        input_schema=spec.input_schema() if schemas else None,
        output_schema=spec.output_schema() if schemas else None,
    )


def visible_methods(ws: Workspace) -> list[MethodSpec]:
    """Every method, whatever this server can run now: capabilities are never hidden (SPEC §6). A
    method that cannot run (a mutation under `--read-only`, a missing provider) is listed and
    answers with the reason; `session.get` reports each method's availability."""
    return [s for _, s in sorted(REGISTRY.items())]


_digest: str | None = None
_digest_lock = threading.Lock()


def catalog_digest() -> str:
    """sha256 of the RFC 8785 canonical JSON of the full `interface.get` (every method, schemas
    included): two servers with the same digest offer the same methods with the same schemas."""
    global _digest
    if _digest is None:
        with _digest_lock:
            if _digest is None:
                specs = [s for _name, s in sorted(REGISTRY.items())]
                info = InterfaceInfo(methods=[describe(s) for s in specs], domains=sorted({s.domain for s in specs}))
                _digest = hashlib.sha256(rfc8785.dumps(as_ijson(info.model_dump(mode="json")))).hexdigest()
    return _digest


SAFE_INTEGER = (1 << 53) - 1


def as_ijson(value: Any) -> Any:
    """`value` as an I-JSON reader (RFC 7493, which RFC 8785 assumes) sees it: an integer beyond
    ±(2**53 - 1), such as a schema's `maximum` of 2**64, becomes the double it parses to."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value) if abs(value) > SAFE_INTEGER else value
    if isinstance(value, dict):
        return {k: as_ijson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_ijson(v) for v in value]
    return value


@method("interface.get", effect=READ_ONLY)
def interface_get(ws: Workspace, p: InterfaceGetParams) -> InterfaceInfo:
    """Describe every method (or one, or one domain's): name, effect, summary and JSON Schemas."""
    specs = visible_methods(ws)
    if p.method is not None:
        specs = [s for s in specs if s.name == p.method]
        if not specs:
            raise BinlensError("not_found", f"no method {p.method!r}", target="/params/method")
    if p.domain is not None:
        specs = [s for s in specs if s.domain == p.domain]
        if not specs:
            raise BinlensError("not_found", f"no domain {p.domain!r}", target="/params/domain")
    return InterfaceInfo(
        methods=[describe(s, p.schemas) for s in specs],
        domains=sorted({s.domain for s in visible_methods(ws)}),
    )
