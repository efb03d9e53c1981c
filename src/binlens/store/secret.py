"""Secret keys kept under the binlens home, shared by every process that uses that home.

A key file is written whole to a private temporary file and then hard-linked into place, so a
reader never sees a partial key, and of two processes creating it at once one link wins and the
other reads the winner's key.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

KEY_BYTES = 32

_cache: dict[str, bytes] = {}
_lock = threading.Lock()


def _read(path: Path) -> bytes | None:
    """The key stored at `path`; None when there is no file; b"" when the file is not a full key."""
    try:
        with open(path, "rb") as f:
            data = f.read(KEY_BYTES + 1)
    except FileNotFoundError:
        return None
    return data if len(data) == KEY_BYTES else b""


def _write_private(directory: Path, data: bytes) -> Path:
    """A new file in `directory` holding `data`, readable by its owner only (mode 0600), synced."""
    tmp = directory / f".{os.getpid()}-{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _create(path: Path) -> bytes:
    """The key at `path`, creating it when missing (the first of racing creators wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        key = _read(path)
        if key:
            return key
        if key == b"":
            # a file that is not a full key (truncated by hand, say) is dropped and made afresh
            path.unlink(missing_ok=True)
        tmp = _write_private(path.parent, os.urandom(KEY_BYTES))
        try:
            # link, unlike rename, fails when the name exists: a key linked first by another
            # process is kept, and read on the next turn
            os.link(tmp, path)
        except FileExistsError:
            continue
        finally:
            tmp.unlink(missing_ok=True)
    key = _read(path)
    if not key:
        raise OSError(f"{path} does not hold a {KEY_BYTES}-byte key")
    return key


def home_key(home: Path, name: str) -> bytes:
    """The key `name` under `home` (created on first use); a process-only key if home is not writable."""
    path = Path(home) / name
    ident = str(path.absolute())
    with _lock:
        key = _cache.get(ident)
        if key is None:
            try:
                key = _create(path)
            except OSError as e:
                # cursors still work within this process; they just do not outlive it
                log.warning("cannot keep %s (%s); using a key for this process only", path, e)
                key = os.urandom(KEY_BYTES)
            _cache[ident] = key
        return key
