"""The process that runs client regular expressions (started by `binlens.api._regex_pool`).

A pattern that backtracks catastrophically cannot be interrupted inside the `regex` engine (its
`timeout=` counts this process's CPU time, not the wall clock), so it runs here, where the caller
kills the whole process at its deadline or on cancellation. Run as a script (`python -P FILE`):
it imports the standard library and `regex` only.

Frames both ways: a 4-byte little-endian length, then a pickle. It answers "ready" once, then
one frame per request (kind, pattern, flags, payload, stop, want):
- "bytes": payload is the bytes to search, or (path, inode, offset, length) of a window of the
  caller's shared copy of the image (a memfd opened through /proc, mapped once); the answer is
  [(start, end, first 64 bytes), ...] for at most `want` matches starting before `stop`;
- "text": payload is a list of str; the answer is the indices of at most `want` of them the
  pattern finds something in.
A request that fails is answered ("error", message).
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
import sys
import threading
import time
from typing import Any

import regex

HEAD = struct.Struct("<I")
_maps: dict[tuple[str, int], mmap.mmap] = {}


def _read_exactly(inp: Any, size: int) -> bytes | None:
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = inp.readinto(view[got:])
        if not n:
            return None
        got += n
    return bytes(buf)


def _read(inp: Any) -> Any:
    head = _read_exactly(inp, HEAD.size)
    body = _read_exactly(inp, HEAD.unpack(head)[0]) if head is not None else None
    return pickle.loads(body) if body is not None else None


def _write(out: Any, obj: Any) -> None:
    blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(HEAD.pack(len(blob)) + blob)
    out.flush()


def _watch_parent(parent: int) -> None:
    """End this process when the server that started it is gone (it may be stuck in a match)."""
    while True:
        time.sleep(0.25)
        if os.getppid() != parent:
            os._exit(0)


def _window(payload: Any) -> bytes:
    """The bytes a "bytes" request searches."""
    if isinstance(payload, bytes):
        return payload
    path, inode, offset, length = payload
    mapped = _maps.get((path, inode))
    if mapped is None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_ino != inode:
                raise OSError(f"{path} is not the caller's image any more")
            mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        if len(_maps) >= 4:
            _maps.pop(next(iter(_maps))).close()
        _maps[(path, inode)] = mapped
    return mapped[offset : offset + length]


def scan(rx: Any, data: bytes, stop: int, want: int) -> list[tuple[int, int, bytes]]:
    """Up to `want` matches of `rx` in `data` that start before `stop`: (start, end, first 64 bytes)."""
    found: list[tuple[int, int, bytes]] = []
    for m in rx.finditer(data, concurrent=True):
        if m.start() >= stop or len(found) >= want:
            break
        found.append((m.start(), m.end(), m.group()[:64]))
    return found


def _pick(rx: Any, texts: list[str], want: int) -> list[int]:
    picked = []
    for i, text in enumerate(texts):
        if rx.search(text, concurrent=True) is not None:
            picked.append(i)
            if len(picked) >= want:
                break
    return picked


def _answer(req: tuple[Any, ...], compiled: dict[tuple[Any, int], Any]) -> Any:
    kind, pattern, flags, payload, stop, want = req
    rx = compiled.get((pattern, flags))
    if rx is None:
        compiled.clear()
        rx = compiled[(pattern, flags)] = regex.compile(pattern, flags)
    if kind == "bytes":
        return scan(rx, _window(payload), stop, want)
    return _pick(rx, payload, want)


def main() -> None:
    """Answer requests until the input closes."""
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    stdin, out = sys.stdin.buffer, sys.stdout.buffer
    inp = stdin.raw if isinstance(stdin, io.BufferedReader) else stdin  # the file itself: no read-ahead
    compiled: dict[tuple[Any, int], Any] = {}
    _write(out, "ready")
    while (req := _read(inp)) is not None:
        try:
            answer = _answer(req, compiled)
        except Exception as err:  # noqa: BLE001 - the caller reports it; this process goes on
            answer = ("error", f"{type(err).__name__}: {err}")
        _write(out, answer)


if __name__ == "__main__":
    main()
