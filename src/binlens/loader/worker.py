"""The parser worker process: reads requests on stdin, forks a child per file, answers on stdout.

Run as `python -m binlens.loader.worker`. Each child parses one file and pipes back the Image as
plain tuples (`image.encode_image`, without the bytes, which the parent already has); the worker
relays the child's answer as it is, without decoding it. The worker survives a crash, an abort or
a hang of the child and turns each into a clean error.

Plain ELF files of the machines in `elf_machines.MACHINES` (x86, x86-64, AArch64, ARM, MIPS,
PowerPC, RISC-V; either byte order) go to the pure-Python reader (`parse_elf`) first; LIEF, which takes
~0.6 s to import, is imported by the worker only when a file needs it (any other format, or an
ELF file the fast reader leaves to LIEF), and from then on every child inherits it.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

from binlens.errors import BinlensError
from binlens.frames import FALLBACK, STATUS_ERROR, STATUS_OK, read_frame, write_answer
from binlens.loader.elf_machines import fast_machine
from binlens.loader.image import Image, cap_names, encode_image

Parser = Callable[[bytes, str, "str | None"], Image]


def _fast(data: bytes, file_name: str, slice_name: str | None) -> Image:
    from binlens.loader.parse_elf import NeedsLief, parse_elf

    if data[:4] != b"\x7fELF":
        raise NeedsLief("not ELF")
    return parse_elf(data, file_name)


def fast_candidate(data: bytes) -> bool:
    """An ELF header (its first 20 bytes or more) of a machine and class the fast reader knows
    (`elf_machines.MACHINES`), in either byte order: worth a try of the fast reader. With the
    whole header, PowerPC64 ELFv1 files (declined by the reader) are left out too."""
    if len(data) < 20 or data[:4] != b"\x7fELF" or data[5] not in (1, 2) or data[4] not in (1, 2):
        return False
    order: Literal["little", "big"] = "little" if data[5] == 1 else "big"
    machine = int.from_bytes(data[18:20], order)
    if fast_machine(machine, 64 if data[4] == 2 else 32) is None:
        return False
    return machine != 21 or len(data) < 0x34 or int.from_bytes(data[0x30:0x34], order) & 3 == 2


def _lief(data: bytes, file_name: str, slice_name: str | None) -> Image:
    from binlens.loader.parse_lief import parse_image

    return parse_image(data, file_name, slice_name)


def _child(parse: Parser, data: bytes, file_name: str, slice_name: str | None, wfd: int) -> None:
    try:
        image = cap_names(parse(data, file_name, slice_name))
        body = STATUS_OK + pickle.dumps(encode_image(image), pickle.HIGHEST_PROTOCOL)
    except BinlensError as err:
        body = STATUS_ERROR + pickle.dumps((err.code, err.message, err.target, err.details))
    except Exception as err:  # noqa: BLE001 - any parser exception is a malformed file
        if parse is _fast:  # the fast reader declined (or tripped): LIEF decides
            body = FALLBACK
        else:
            msg = f"malformed file: the parser rejected it ({type(err).__name__})"
            body = STATUS_ERROR + pickle.dumps(("invalid_argument", msg, None, {}))
    view = memoryview(body)
    while view:
        n = os.write(wfd, view)
        view = view[n:]
    os.close(wfd)


def _error(code: str, message: str, details: dict[str, Any]) -> bytes:
    return STATUS_ERROR + pickle.dumps((code, message, None, details))


def _collect(pid: int, rfd: int, timeout: float) -> bytes:
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rfd)
            msg = f"malformed file: parsing took longer than {timeout:g} s and was stopped"
            return _error("invalid_argument", msg, {"timeout_s": timeout})
        ready, _, _ = select.select([rfd], [], [], left)
        if not ready:
            continue
        chunk = os.read(rfd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    if chunks and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return b"".join(chunks)
    how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
    return _error("invalid_argument", "malformed file: the format parser crashed on it", {"parser": how})


def _run_child(parse: Parser, data: bytes, file_name: str, slice_name: str | None, timeout: float) -> bytes:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        try:
            _child(parse, data, file_name, slice_name, wfd)
        finally:
            os._exit(0)
    os.close(wfd)
    return _collect(pid, rfd, timeout)


def serve(stdin: Any, stdout: Any) -> None:
    """Answer parse requests until stdin closes."""
    import binlens.loader.parse_elf  # noqa: F401 - cheap (no LIEF); every child inherits it

    while True:
        try:
            data, file_name, slice_name, timeout = read_frame(stdin)
        except EOFError:
            return
        write_answer(stdout, parse_isolated(data, file_name, slice_name, timeout))


def parse_isolated(data: bytes, file_name: str, slice_name: str | None, timeout: float) -> bytes:
    """Parse in a forked child (the fast reader first, then LIEF): the answer bytes for `read_answer`."""
    answer = _run_child(_fast, data, file_name, slice_name, timeout) if fast_candidate(data) else FALLBACK
    if answer == FALLBACK:
        import binlens.loader.parse_lief  # noqa: F401 - import LIEF once, before forking

        answer = _run_child(_lief, data, file_name, slice_name, timeout)
    return answer


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
