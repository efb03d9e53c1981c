"""Which files of some folders the indexer analyses: executables by magic, each distinct file once.

`discover(paths)` walks every folder recursively (symbolic links to folders are followed once:
a folder already seen by device and inode is not walked again, so a link back up the tree ends
there), keeps the regular files whose first bytes are an ELF, PE (`MZ` with a `PE\\0\\0` header
where `e_lfanew` points) or Mach-O (thin, or fat with a plausible slice count) header, hashes
each with SHA-256 a block at a time (a large library is never held whole), and keeps the first
path of each digest. A file that cannot be read becomes a `FileFailure` (without a digest); a
file that is not an executable is counted, not reported.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from binlens.corpus.records import FileFailure
from binlens.loader.formats import FAT_MAGICS, MACHO_MAGICS
from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES

_HEAD = 4096  # bytes read to decide by magic (a PE's e_lfanew nearly always points inside them)
_BLOCK = 1 << 20  # bytes hashed at a time
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A distinct executable file to index."""

    path: str  # absolute; the first path found with these bytes
    sha256: str
    size: int
    format: str  # elf | pe | macho


@dataclass
class Discovery:
    """What a walk found."""

    files: list[Candidate] = field(default_factory=list)  # distinct executables, in walk order
    duplicates: dict[str, str] = field(default_factory=dict)  # a copy's path -> the path kept for its bytes
    failures: list[FileFailure] = field(default_factory=list)  # files that could not be read
    other: int = 0  # regular files that are not executables
    looped: int = 0  # folders not walked again (a symbolic link to a folder already walked)


def executable_format(head: bytes, read_at: Callable[[int, int], bytes] | None = None) -> str | None:
    """`elf`, `pe` or `macho` from a file's first bytes, else None. A PE's `PE\\0\\0` signature
    may lie past `head`: `read_at(offset, size)` reads it there."""
    magic = head[:4]
    if magic == b"\x7fELF":
        return "elf"
    if magic in MACHO_MAGICS:
        return "macho"
    if magic in FAT_MAGICS and len(head) >= 8:
        # 0xCAFEBABE also starts Java class files, whose next word (a version >= 45) is larger
        (count,) = struct.unpack_from(">I", head, 4)
        return "macho" if 0 < count < 45 else None
    if head[:2] == b"MZ" and len(head) >= 0x40:
        (lfanew,) = struct.unpack_from("<I", head, 0x3C)
        sig = head[lfanew : lfanew + 4] if lfanew + 4 <= len(head) else None
        if sig is None and read_at is not None and lfanew < 1 << 24:
            sig = read_at(lfanew, 4)
        return "pe" if sig == b"PE\0\0" else None
    return None


def walk(paths: Iterable[str | os.PathLike[str]], looped: list[int] | None = None) -> Iterator[str]:
    """Every regular file under `paths` (folders recursively, sorted by name; a named file as
    itself), each folder walked once by device and inode; `looped` gets one entry per folder
    skipped as already walked. Files inside folders that cannot be listed are not seen."""
    seen: set[tuple[int, int]] = set()
    for top in paths:
        top = os.path.abspath(os.fspath(top))
        try:
            st = os.stat(top)
        except OSError:
            yield top  # reported by `discover` when it fails to open it
            continue
        if not stat.S_ISDIR(st.st_mode):
            yield top
            continue
        stack = [top]
        while stack:
            folder = stack.pop()
            try:
                st = os.stat(folder)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                if looped is not None:
                    looped.append(1)
                continue
            seen.add(key)
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                continue
            subfolders = []
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=True):
                        subfolders.append(e.path)
                    elif e.is_file(follow_symlinks=True):
                        yield e.path
                except OSError:
                    continue  # (a dangling link, or one the walk may not follow)
            stack.extend(reversed(subfolders))


def _failure(path: str, err: OSError) -> FileFailure:
    code = "not_found" if err.errno == errno.ENOENT else "invalid_argument"
    return FileFailure(path, None, code, f"cannot read {path}: {err.strerror or err}")


def examine(path: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Candidate | FileFailure | None:
    """One file: a `Candidate` (an executable, hashed), a `FileFailure` (unreadable, too large)
    or None (not a regular file, or not an executable)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        return _failure(path, err)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        head = os.pread(fd, _HEAD, 0)
        fmt = executable_format(head, lambda off, n: os.pread(fd, n, off))
        if fmt is None:
            return None
        if st.st_size > max_bytes:
            return FileFailure(
                path, None, "invalid_argument", f"{path} is {st.st_size} bytes, above the limit of {max_bytes}"
            )
        h = hashlib.sha256()
        size = 0
        while block := os.read(fd, _BLOCK):  # (pread left the offset at 0)
            h.update(block)
            size += len(block)
        return Candidate(path, h.hexdigest(), size, fmt)
    except OSError as err:
        return _failure(path, err)
    finally:
        os.close(fd)


def discover(
    paths: Sequence[str | os.PathLike[str]],
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    on_file: Callable[[int], None] | None = None,
) -> Discovery:
    """The distinct executables under `paths` (see the module's text); `on_file(n)` is told how
    many files were examined so far, now and then."""
    out = Discovery()
    first: dict[str, str] = {}
    looped: list[int] = []
    for n, path in enumerate(walk(paths, looped), 1):
        got = examine(path, max_bytes)
        if isinstance(got, Candidate):
            kept = first.get(got.sha256)
            if kept is None:
                first[got.sha256] = got.path
                out.files.append(got)
            elif kept != got.path:
                out.duplicates[got.path] = kept
        elif isinstance(got, FileFailure):
            out.failures.append(got)
        else:
            out.other += 1
        if on_file is not None and n % 256 == 0:
            on_file(n)
    out.looped = len(looped)
    return out
