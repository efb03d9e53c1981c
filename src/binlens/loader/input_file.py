"""Open and read an input file: the one way a binary's bytes enter binlens.

Every path a user or client names (`program.open`, the CLI's FILE and `-b FILE`, `binlens mcp`
and `binlens serve` FILEs, the analysis process re-reading a program) goes through `read_input`,
so the same checks hold everywhere:

- the path is text the OS can take (no NUL, not too long), else `invalid_argument`;
- under roots, the path's real location must be inside one of them, checked on the file that
  was opened (its `/proc/self/fd` link, or its device and inode), not only on the name before
  opening: a name swapped for a symbolic link between the check and the open is refused;
- only a regular file is read: a FIFO, device, socket or directory is refused before it is
  opened where that can block (a FIFO is opened with O_NONBLOCK), and again on the opened file;
- the size is taken with `fstat` on the opened file and checked against `max_bytes` before a
  byte is read, so an oversized (or sparse) file costs nothing to refuse.

Errors are BinlensErrors at `target` (`/params/path` for program.open).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from binlens.errors import BinlensError

DEFAULT_MAX_FILE_BYTES = 512 * 1024 * 1024
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@dataclass(frozen=True)
class InputFile:
    """The bytes of one input file and the real path they were read from."""

    path: Path
    data: bytes


def _error(code: str, message: str, target: str | None, **details: object) -> BinlensError:
    return BinlensError(code, message, target=target, details=dict(details))


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _shown(path: str) -> str:
    """A path as an error message shows it: at most 200 characters."""
    return path if len(path) <= 200 else path[:100] + "..." + path[-97:]


def clean_path(path: str | os.PathLike[str], target: str | None = "/params/path") -> str:
    """`path` with `~` expanded, or `invalid_argument` for a path no file can have (empty, a NUL
    character, text the file system encoding cannot carry)."""
    text = os.fspath(path)
    if not text:
        raise _error("invalid_argument", "the path is empty", target)
    if "\0" in text:
        raise _error("invalid_argument", "the path contains a NUL character, which no file name can", target)
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise _error("invalid_argument", "the path is not valid text for a file name", target) from None
    return os.path.expanduser(text)


def _os_error(err: OSError, path: str, target: str | None, doing: str) -> BinlensError:
    """The BinlensError for an OSError met while resolving, opening or reading `path`."""
    shown = _shown(path)
    if err.errno == errno.ENOENT:
        return _error("not_found", f"no such file: {shown}", target)
    if err.errno == errno.ENOTDIR:
        return _error("not_found", f"no such file: {shown} (a part of the path is not a folder)", target)
    if err.errno in (errno.EACCES, errno.EPERM):
        return _error("invalid_argument", f"cannot {doing} {shown}: permission denied", target)
    if err.errno == errno.ENAMETOOLONG:
        return _error("invalid_argument", f"the path or one of its names is too long ({len(path)} characters)", target)
    if err.errno == errno.ELOOP:
        return _error("invalid_argument", f"{shown}: too many levels of symbolic links", target)
    if err.errno == errno.EISDIR:
        return _error("invalid_argument", f"{shown} is a directory, not a regular file", target)
    if err.errno == errno.ENXIO:
        return _error("invalid_argument", f"{shown} is not a regular file (a socket or a device without one)", target)
    return _error("invalid_argument", f"cannot {doing} {shown}: {err.strerror or type(err).__name__}", target)


def within(real: Path, roots: Sequence[Path]) -> bool:
    """Is the resolved path `real` one of `roots` (resolved) or inside one?"""
    return any(real == r or r in real.parents for r in roots)


def resolved_roots(roots: Sequence[Path]) -> list[Path]:
    """The roots with `~` expanded and symbolic links resolved."""
    return [Path(os.path.realpath(os.path.expanduser(r))) for r in roots]


def _outside(path: str, roots: Sequence[Path], target: str | None) -> BinlensError:
    return _error(
        "invalid_argument",
        f"{_shown(path)} is outside the allowed roots",
        target,
        roots=[str(r) for r in roots],
    )


def _changed(path: str, target: str | None) -> BinlensError:
    return _error(
        "invalid_argument",
        f"{_shown(path)} changed while it was being opened (a symbolic link or folder was replaced); try again",
        target,
    )


def real_path(path: str | os.PathLike[str], target: str | None = "/params/path") -> Path:
    """The absolute path with every symbolic link resolved, or a BinlensError at `target`."""
    text = clean_path(path, target)
    try:
        return Path(os.path.realpath(text))
    except (OSError, RuntimeError, ValueError):  # a loop, or a name that changed while being resolved
        raise _changed(text, target) from None


def check_within(path: str | os.PathLike[str], roots: Sequence[Path], target: str | None = "/params/path") -> Path:
    """The real path of `path`, or `invalid_argument` when it is outside `roots` (when there are any)."""
    real = real_path(path, target)
    if roots and not within(real, resolved_roots(roots)):
        raise _outside(os.fspath(path), roots, target)
    return real


def _opened_path(fd: int) -> str | None:
    """The path the kernel gives for open file `fd` (Linux `/proc/self/fd`), or None where there is none."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def read_input(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    roots: Sequence[Path] = (),
    target: str | None = "/params/path",
) -> InputFile:
    """Open and read the regular file at `path` (inside `roots` when there are any), at most
    `max_bytes` of it; the real path it was read from comes back with the bytes."""
    text = clean_path(path, target)
    real = real_path(text, target)
    allowed = resolved_roots(roots)
    if roots and not within(real, allowed):
        raise _outside(text, roots, target)
    try:
        before = os.stat(real)
    except OSError as err:
        raise _os_error(err, text, target, "open") from None
    if not stat.S_ISREG(before.st_mode):  # refused before an open that could block or act on a device
        raise _error("invalid_argument", f"{_shown(text)} is {_kind(before.st_mode)}, not a regular file", target)
    try:
        # `real` has no symbolic link left: O_NOFOLLOW makes one put in its place since fail
        fd = os.open(real, _OPEN_FLAGS | _NOFOLLOW)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _changed(text, target) from None
        raise _os_error(err, text, target, "open") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _error("invalid_argument", f"{_shown(text)} is {_kind(st.st_mode)}, not a regular file", target)
        opened = _opened_path(fd)
        if opened is not None:
            if opened != str(real):  # a folder on the way was swapped for a link after `real` was resolved
                if roots and not within(Path(opened), allowed):
                    raise _outside(text, roots, target)
                raise _changed(text, target)
        elif (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise _changed(text, target)
        if st.st_size > max_bytes:
            raise _error(
                "invalid_argument",
                f"{_shown(text)} is {st.st_size} bytes, over the {max_bytes}-byte input limit (--max-file-bytes)",
                target,
                size=st.st_size,
                limit=max_bytes,
            )
        data = _read(fd, st.st_size, max_bytes, text, target)
    finally:
        os.close(fd)
    return InputFile(real, data)


def _read(fd: int, size: int, max_bytes: int, path: str, target: str | None) -> bytes:
    """Read the `size` bytes `fstat` reported; a file that has more (it grew, or its size is not
    real, as under /proc) is refused rather than read without a bound."""
    try:
        with open(fd, "rb", buffering=0, closefd=False) as fh:
            data = fh.read(size) if size else b""
            while len(data) < size:  # a regular file reads short only at its end: it shrank
                chunk = fh.read(size - len(data))
                if not chunk:
                    break
                data += chunk
            more = fh.read(1)
    except OSError as err:
        raise _os_error(err, path, target, "read") from None
    if more:
        raise _error(
            "invalid_argument",
            f"{_shown(path)} has more bytes than its size says ({size}): it is growing, or is not a "
            "file on disk (as under /proc)",
            target,
            size=size,
            limit=max_bytes,
        )
    return data
