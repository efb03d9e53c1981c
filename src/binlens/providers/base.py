"""What every provider is: an id, a kind, whether it can run here, and a session per program."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from binlens.loader.image import Image


@dataclass(frozen=True)
class Availability:
    """Whether a provider can run on this machine, and if not, why and what to do about it."""

    available: bool
    version: str | None = None
    reason: str | None = None
    remediation: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON object."""
        return asdict(self)


class Cancellable(Protocol):
    """What a session needs of a call's context: whether the client gave up. A context that also
    has `progress(done, total, message)` (the API's `CallContext`) gets the child's reports."""

    @property
    def cancelled(self) -> bool:
        """True once the call was cancelled."""
        ...


class Session(Protocol):
    """A provider's live state for one program (a process of its own)."""

    def close(self) -> None:
        """Stop the session and release what it holds (its process, its files)."""


@dataclass(frozen=True)
class DisassembledInstruction:
    """One instruction as a disassembler provider decoded it."""

    address: int
    data: bytes
    text: str


class DisassemblerSession(Session, Protocol):
    """The session of a provider of kind `disassembler`."""

    def disassemble(
        self, start: int, end: int, *, timeout: float, ctx: Cancellable | None = None
    ) -> list[DisassembledInstruction]:
        """The instructions that start in [start, end), within `timeout` seconds."""
        ...


class DecompilerSession(Session, Protocol):
    """The session of a provider of kind `decompiler`."""

    def decompile(self, request: dict[str, Any], *, timeout: float, ctx: Cancellable | None = None) -> dict[str, Any]:
        """One function decompiled: `request` names it, its blocks and the user's annotations;
        the answer is `{code, lines, variables, warnings}`, within `timeout` seconds."""
        ...


class Provider(Protocol):
    """A deep engine discovered at run time: `components.PROVIDERS` names each one.

    `availability()` must be cheap enough to answer on every call of a method that requires the
    provider (cache what costs, keyed by what would change the answer); `open_session` starts
    nothing yet: the session's process starts on its first use.
    """

    @property
    def id(self) -> str:
        """The provider's stable name (`objdump`, `angr`, `gdb`)."""
        ...

    @property
    def kind(self) -> str:
        """What it provides (`disassembler`, `decompiler`, `debugger`)."""
        ...

    def availability(self) -> Availability:
        """Whether it can run here, its version, or the reason it cannot and the remedy."""
        ...

    def open_session(self, image: Image) -> Session:
        """A session over one program's image."""
        ...


class ProviderFailure(Exception):
    """A request the handler cannot answer: becomes a BinlensError of `code` in the server."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


# progress(done, total, message): a handler's report on the request it runs, relayed to the client
Progress = Callable[[float, "float | None", "str | None"], None]


class Handler(Protocol):
    """The child side of a provider: answers the session's requests."""

    def handle(self, op: str, args: dict[str, Any], blob: bytes, progress: Progress) -> tuple[dict[str, Any], bytes]:
        """Answer one request `op` (the session's first is `open`) with a JSON result and a blob,
        reporting progress on long work."""
        ...
