"""What every provider is: an id, a kind, whether it can run here, and a session per program."""

from __future__ import annotations

import os
import threading
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

    def decompile(
        self,
        request: dict[str, Any],
        *,
        timeout: float,
        ctx: Cancellable | None = None,
        reuse: Callable[[], dict[str, Any] | None] | None = None,
        keep: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """One function decompiled: `request` names it, its blocks and the user's annotations;
        the answer is `{code, lines, variables, warnings}`, within `timeout` seconds. `keep(answer)`
        runs before the next call on the session starts, and a call that waited for another first
        takes `reuse()`'s answer when it gives one."""
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


class ToolVersions:
    """An external tool's availability, probed once per version of its file (path, inode, mtime):
    a tool installed or upgraded while the server runs is seen at the next call."""

    def __init__(self, name: str, remediation: str, probe: Callable[[str], Availability]) -> None:
        self.name = name
        self.remediation = remediation
        self._probe = probe
        self._known: dict[tuple[str, int, int], Availability] = {}
        self._lock = threading.Lock()

    def check(self, exe: str | None) -> Availability:
        """The availability of `exe` (None: not found), from the probe's cached answer for its file."""
        if exe is None:
            return Availability(False, reason=f"{self.name} is not on the PATH", remediation=self.remediation)
        try:
            st = os.stat(exe)
        except OSError:
            return Availability(False, reason=f"{exe} does not exist", remediation=self.remediation)
        key = (exe, st.st_ino, st.st_mtime_ns)
        with self._lock:
            known = self._known.get(key)
        if known is None:
            known = self._probe(exe)
            with self._lock:
                self._known[key] = known
        return known
