"""provider.*: the deep engines (disassemblers, decompilers, debuggers) and whether they can run here."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from binlens.api.models import Listing, Params, Result
from binlens.api.registry import READ_ONLY, method
from binlens.providers import registry as providers


class ProviderListParams(Params):
    """Which providers to list."""

    kind: str | None = Field(None, max_length=64, description="Only providers of this kind (e.g. 'decompiler').")


class ProviderItem(Result):
    """One provider and whether it can run here."""

    id: str
    kind: str = Field(description="disassembler, decompiler, debugger")
    available: bool
    version: str | None = None
    reason: str | None = Field(None, description="Why it cannot run here (null when available).")
    remediation: str | None = Field(None, description="What would make it available.")


@method("provider.list", effect=READ_ONLY)
def provider_list(ws: Any, p: ProviderListParams) -> Listing[ProviderItem]:
    """Every registered provider, in the order `auto` picks from: id, kind, and whether it can run here and why not."""
    items = []
    for provider in providers.providers().values():
        if p.kind is not None and provider.kind != p.kind:
            continue
        got = provider.availability()
        items.append(
            ProviderItem(
                id=provider.id,
                kind=provider.kind,
                available=got.available,
                version=got.version,
                reason=got.reason,
                remediation=got.remediation,
            )
        )
    return Listing[ProviderItem](items=items, next_cursor=None)
