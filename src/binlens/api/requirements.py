"""What a method needs to run here (`@method(requires=...)`): a provider, a permission, a writable
server, a feature the calling client negotiated (`client:sampling`). A method whose requirement is
missing stays in the catalog and answers `unavailable` (or `read_only`, for a mutation on a
read-only server) with the reason and the remedy in `details`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from binlens.errors import BinlensError

# What starts a server with each permission a method may require.
PERMISSIONS: dict[str, str] = {
    "debug": "start the server with --allow-debug",
    "live": "start the server on the program's file with --allow-live-pid PID (binlens mcp FILE --allow-live-pid PID)",
}
FORMS = (
    "'provider:<id>', 'provider-kind:<kind>', 'permission:<name>', 'client:<feature>', 'caller:trusted' or 'writable'"
)


@dataclass(frozen=True)
class Missing:
    """Why a requirement is not met here, and what would meet it."""

    reason: str
    remediation: str | None


@dataclass(frozen=True)
class Requirement:
    """One requirement, as written in `requires=` (`provider:angr`, `permission:debug`, `writable`)."""

    kind: str  # provider | provider-kind | permission | client | caller | writable
    name: str

    @property
    def text(self) -> str:
        """The requirement as written."""
        return self.kind if self.kind == "writable" else f"{self.kind}:{self.name}"

    def missing(self, ws: Any, ctx: Any = None) -> Missing | None:
        """None when `ws` (and the calling client, `ctx`: a CallContext or None) meets the
        requirement, else the reason and the remedy."""
        if self.kind == "client":
            features = getattr(ctx, "client_features", None)
            if features is not None and self.name in features:
                return None
            return Missing(
                f"the client did not negotiate '{self.name}'",
                f"use a client that declares the '{self.name}' capability when it connects",
            )
        if self.kind == "caller":  # trusted: this machine (in-process, stdio, loopback) or the token's holder
            if ctx is None or getattr(ctx, "trusted", True):
                return None
            return Missing(
                "the caller is neither on this machine's loopback nor authenticated with the server's token",
                "call from the server's own machine, or start the server with --token and send it",
            )
        if self.kind == "writable":
            return Missing("the server is read-only", "start the server without --read-only") if ws.read_only else None
        if self.kind == "permission":
            if self.name in ws.config.permissions:
                return None
            return Missing(f"the server does not allow {self.name}", PERMISSIONS[self.name])
        return self._provider_missing()

    def _provider_missing(self) -> Missing | None:
        from binlens.providers import registry as providers  # (only methods that need a provider load them)

        if self.kind == "provider":
            provider = providers.get(self.name)
            if provider is None:
                return Missing(f"no provider {self.name!r} is registered", None)
            candidates = [provider]
        else:
            candidates = [p for p in providers.providers().values() if p.kind == self.name]
            if not candidates:
                return Missing(f"no {self.name} provider is registered", None)
        first: Missing | None = None
        for provider in candidates:
            got = provider.availability()
            if got.available:
                return None
            first = first or Missing(got.reason or f"{provider.id} is unavailable", got.remediation)
        return first

    def error(self, method: str, missing: Missing) -> BinlensError:
        """The error a call of `method` answers while this requirement is missing."""
        details = {"requirement": self.text, "reason": missing.reason, "remediation": missing.remediation}
        if self.kind == "caller":
            return BinlensError("permission_denied", f"{method} is not allowed: {missing.reason}", details=details)
        if self.kind == "writable":  # (SPEC §6: a method the server cannot run now is `unavailable`)
            message = f"{method} changes the database and the server is read-only"
            return BinlensError("unavailable", message, details=details)
        return BinlensError("unavailable", f"{method} is unavailable: {missing.reason}", details=details)


def is_loopback_address(address: str) -> bool:
    """Whether a peer address (IPv4, IPv6, `localhost`) is this machine's loopback."""
    import ipaddress

    text = address.strip().strip("[]")
    if text.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def parse(text: str) -> Requirement:
    """A requirement from its written form; ValueError for anything else."""
    if text == "writable":
        return Requirement("writable", "")
    kind, sep, name = text.partition(":")
    if kind == "caller" and name != "trusted":
        raise ValueError(f"requirement {text!r}: the only caller requirement is 'caller:trusted'")
    if not sep or not name or kind not in ("provider", "provider-kind", "permission", "client", "caller"):
        raise ValueError(f"requirement {text!r} is not one of {FORMS}")
    if kind == "permission" and name not in PERMISSIONS:
        raise ValueError(f"unknown permission {name!r} (known: {', '.join(sorted(PERMISSIONS))})")
    return Requirement(kind, name)


def first_missing(
    ws: Any, requirements: tuple[Requirement, ...], ctx: Any = None
) -> tuple[Requirement, Missing] | None:
    """The first requirement `ws` (and the client calling through `ctx`) does not meet, with why;
    None when all are met."""
    for requirement in requirements:
        missing = requirement.missing(ws, ctx)
        if missing is not None:
            return requirement, missing
    return None
