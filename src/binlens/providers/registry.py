"""The registered providers (`components.PROVIDERS`, in its order), choosing one, and the sessions
each open program holds."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from binlens import components
from binlens.errors import BinlensError
from binlens.providers.base import Availability, Provider, Session

if TYPE_CHECKING:
    from binlens.loader.image import Image
    from binlens.workspace import Program

SESSIONS_KEY = "providers.sessions"  # Program.extensions key of a program's `ProgramSessions`

_table: dict[str, Provider] | None = None
_table_lock = threading.Lock()


def providers() -> dict[str, Provider]:
    """Every registered provider by id, in `components.PROVIDERS` order (loaded on first use)."""
    global _table
    if _table is None:
        with _table_lock:
            if _table is None:
                loaded: dict[str, Provider] = {}
                for ref in components.PROVIDERS:
                    provider = components.load(ref)
                    if provider.id in loaded:
                        raise ValueError(f"provider {provider.id!r} is registered twice")
                    loaded[provider.id] = provider
                _table = loaded
    return _table


def get(provider_id: str) -> Provider | None:
    """The provider registered as `provider_id`, or None."""
    return providers().get(provider_id)


def unavailable(provider: Provider, availability: Availability, target: str | None = None) -> BinlensError:
    """The `unavailable` error of a provider that cannot run here: its reason and remedy in `details`."""
    return BinlensError(
        "unavailable",
        f"the {provider.id} {provider.kind} is unavailable: {availability.reason}",
        target=target,
        details={"provider": provider.id, "reason": availability.reason, "remediation": availability.remediation},
    )


def choose(requested: str, kind: str, target: str = "/params/provider") -> tuple[Provider, Availability]:
    """The provider a call asked for: `auto` is the first available one of `kind` in
    `components.PROVIDERS` order; an id is that provider, and only that one (never swapped)."""
    of_kind = [p for p in providers().values() if p.kind == kind]
    if requested == "auto":
        checked = [(p, p.availability()) for p in of_kind]
        for provider, availability in checked:
            if availability.available:
                return provider, availability
        if not checked:
            raise BinlensError(
                "unavailable",
                f"no {kind} provider is registered",
                details={"reason": f"no {kind} provider is registered", "remediation": None},
            )
        raise unavailable(*checked[0])
    named = get(requested)
    if named is None or named.kind != kind:
        raise BinlensError(
            "invalid_argument",
            f"{requested!r} is not a {kind} provider; provider.list names them",
            target=target,
            details={"providers": ["auto", *(p.id for p in of_kind)]},
        )
    availability = named.availability()
    if not availability.available:
        raise unavailable(named, availability)
    return named, availability


class ProgramSessions:
    """The provider sessions of one open program, by provider id; closed with the program."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, provider: Provider, image: Image) -> Session:
        """`provider`'s session over `image`, opened on first use."""
        with self._lock:
            if self._closed:
                raise BinlensError("not_found", "the program was closed", target="/params/program")
            session = self._sessions.get(provider.id)
            if session is None:
                session = self._sessions[provider.id] = provider.open_session(image)
            return session

    def close(self) -> None:
        """Close every session (their processes exit)."""
        with self._lock:
            self._closed = True
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()


def session(prog: Program, provider: Provider) -> Session:
    """`provider`'s session over `prog` (opened on first use, closed when the program closes)."""
    with prog.lock:
        held = prog.extensions.get(SESSIONS_KEY)
        if held is None:
            held = prog.extensions[SESSIONS_KEY] = ProgramSessions()
            prog.on_close.append(held.close)
    assert isinstance(held, ProgramSessions)
    return held.get(provider, prog.image)
