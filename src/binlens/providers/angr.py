"""angr as a provider: a decompiler seeded by binlens's own analysis.

The server side (`AngrProvider`, `AngrSession`) says whether angr is installed (package metadata
only: importing angr costs a second and belongs in the session's process) and asks a session
process to decompile one function. The child side lives in `providers/angr_child.py`: it holds
the program's bytes, loads them in angr once per session, and decompiles a function from the
blocks binlens found instead of a CFG of the whole binary.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from binlens.providers.base import Availability, Cancellable
from binlens.providers.process import ProcessSession

if TYPE_CHECKING:
    from binlens.loader.image import Image

REMEDIATION = "pip install 'binlens[decompile]'"
MEMORY_LIMIT = 6 << 30  # angr's loader and decompiler on libc-sized programs stay well under this
START_TIMEOUT = 60.0  # the interpreter and the frame handshake; angr itself loads on the first request
# (distribution, what breaks angr's import when the installed version matches)
_BREAKERS = (("bitstring", "5"), ("pycparser", "3.12"))


class AngrProvider:
    """The angr provider (kind `decompiler`)."""

    id = "angr"
    kind = "decompiler"
    distribution = "angr"  # the package whose metadata says angr is installed

    def __init__(self) -> None:
        self._cache: tuple[tuple[Any, ...], Availability] | None = None
        self._lock = threading.Lock()

    def _key(self) -> tuple[Any, ...]:
        """What would change the answer: the distribution name and the import path's folders' mtimes
        (installing or removing a package changes its site-packages folder)."""
        stamps: list[int | None] = []
        for entry in sys.path:
            try:
                stamps.append(os.stat(entry or ".").st_mtime_ns)
            except OSError:
                stamps.append(None)
        return (self.distribution, tuple(sys.path), tuple(stamps))

    def availability(self) -> Availability:
        """Available when angr's package is installed with versions of its dependencies it imports with."""
        key = self._key()
        with self._lock:
            if self._cache is not None and self._cache[0] == key:
                return self._cache[1]
        got = _probe(self.distribution)
        with self._lock:
            self._cache = (key, got)
        return got

    def open_session(self, image: Image) -> AngrSession:
        """A session over `image`'s bytes (its process starts on the first request)."""
        return AngrSession(image)


def _probe(distribution: str) -> Availability:
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return Availability(False, reason="angr is not installed", remediation=REMEDIATION)
    for dist, bad in _BREAKERS:
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        if have == bad or have.startswith(bad + "."):
            return Availability(
                False,
                version=version,
                reason=f"angr {version} does not import with {dist} {have}",
                remediation=REMEDIATION,
            )
    return Availability(True, version=version)


def link_base(image: Image) -> int:
    """The lowest page of the program's linked addresses: angr maps the program there, so its
    addresses are binlens's."""
    vas = [s.va for s in image.segments if s.vsize]
    return (min(vas) if vas else 0) & ~0xFFF


class AngrSession(ProcessSession):
    """One program's angr session: the program loaded once, one function decompiled per request."""

    def __init__(self, image: Image) -> None:
        super().__init__(
            "angr",
            "binlens.providers.angr_child:AngrHandler",
            open_args={"file_name": image.identity.file_name, "base": link_base(image)},
            open_blob=image.data,
            memory_limit=MEMORY_LIMIT,
            start_timeout=START_TIMEOUT,
        )

    def decompile(
        self,
        request: dict[str, Any],
        *,
        timeout: float,
        ctx: Cancellable | None = None,
        reuse: Callable[[], dict[str, Any] | None] | None = None,
        keep: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Decompile one function: `request` is `{address, regions, names, prototypes, variables}`
        (see `angr_child.AngrHandler.decompile`); the answer is `{code, lines, variables, warnings}`
        (`keep` and `reuse`: `ProcessSession.call`)."""
        result, _ = self.call("decompile", request, timeout=timeout, ctx=ctx, reuse=reuse, keep=keep)
        return result


PROVIDER = AngrProvider()
