"""memory.write and program.export: byte patches kept in the database, and a patched copy of the file."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from binlens.api.edits import EditResult, edit, store
from binlens.api.models import AddressText, HexAddress, Params, ProgramRef, Result
from binlens.api.registry import MUTATION, CallContext, method
from binlens.api.symbol_edit import storable
from binlens.errors import BinlensError
from binlens.store.annotations import Change
from binlens.workspace import Program, Workspace

MAX_WRITE = 65536


class MemoryWriteParams(Params):
    """Bytes to patch at an address."""

    program: ProgramRef | None = None
    address: AddressText
    data: Annotated[str, Field(min_length=1, max_length=4 * MAX_WRITE, description="The bytes to write.")]
    encoding: Literal["hex", "base64"] = "hex"


class MemoryWritten(EditResult):
    """What a memory.write patched."""

    address: HexAddress
    length: int
    patched_bytes: int = Field(description="Bytes in the range that now differ from the file.")


class ProgramExportParams(Params):
    """Where to write the patched copy."""

    program: ProgramRef | None = None
    path: Annotated[str, Field(min_length=1, max_length=4096, description="Where to write the patched copy.")]
    overwrite: bool = Field(False, description="Replace an existing file at `path`.")


class ProgramExported(Result):
    """The patched copy that was written."""

    path: str
    size: int
    sha256: str
    patched_bytes: int


def _decode(p: MemoryWriteParams) -> bytes:
    try:
        if p.encoding == "hex":
            data = bytes.fromhex(p.data.replace(" ", ""))
        else:
            data = base64.b64decode(p.data, validate=True)
    except (ValueError, binascii.Error):
        raise BinlensError("invalid_argument", f"data is not valid {p.encoding}", target="/params/data") from None
    if not data or len(data) > MAX_WRITE:
        raise BinlensError("invalid_argument", f"write 1..{MAX_WRITE} bytes at a time", target="/params/data")
    return data


def _runs_of(va: int, data: bytes, base: bytes) -> list[list[Any]]:
    runs: list[list[Any]] = []
    i = 0
    while i < len(data):
        if data[i] == base[i]:
            i += 1
            continue
        j = i
        while j < len(data) and data[j] != base[j]:
            j += 1
        runs.append([va + i, data[i:j].hex()])
        i = j
    return runs


@method("memory.write", effect=MUTATION)
def memory_write(ws: Workspace, p: MemoryWriteParams, ctx: CallContext) -> MemoryWritten:
    """Patch bytes in the database (never in the file); memory.read then shows them with `patched: true`."""
    prog = ws.program(p.program)
    va = storable(prog.resolve(p.address, "/params/address"), "/params/address")
    data = _decode(p)
    img = prog.image
    first, last = img.va_to_offset(va), img.va_to_offset(va + len(data) - 1)
    if first is None or last is None or last - first != len(data) - 1:
        raise BinlensError(
            "invalid_argument",
            f"{hex(va)}..{hex(va + len(data))} is not entirely backed by file bytes (patches must be exportable)",
            target="/params/address",
        )
    base = img.read(va, len(data)) or b""
    runs = _runs_of(va, data, base)

    def plan(conn: sqlite3.Connection) -> list[Change]:
        return [("patch", (va, len(data)), {"runs": runs} if runs else None)]

    entry = edit(prog, ctx, "memory.write", f"write {len(data)} bytes at {hex(va)}", plan)
    return MemoryWritten(
        journal_id=entry, address=hex(va), length=len(data), patched_bytes=sum(len(r[1]) // 2 for r in runs)
    )


def patched_file(prog: Program) -> tuple[bytes, int]:
    """The file's bytes with every patch applied, and how many bytes differ."""
    out = bytearray(prog.image.data)
    count = 0
    for _key, value in store(prog).rows("patch"):
        for addr, hexbytes in value["runs"]:
            chunk = bytes.fromhex(hexbytes)
            off = prog.image.va_to_offset(addr)
            if off is None:
                continue
            out[off : off + len(chunk)] = chunk
            count += len(chunk)
    return bytes(out), count


def write_atomically(target: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` to a temporary file beside `target`, fsync it, then rename it over `target`."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@method("program.export", effect=MUTATION)
def program_export(ws: Workspace, p: ProgramExportParams) -> ProgramExported:
    """Write a copy of the file with every patch applied, atomically (temporary file, then rename)."""
    prog = ws.program(p.program)
    target = ws.check_export(Path(p.path), prog, "/params/path")
    if target == Path(prog.path).resolve():
        raise BinlensError("conflict", "the export would overwrite the program's own file", target="/params/path")
    if not target.parent.is_dir():
        raise BinlensError("not_found", f"folder {target.parent} does not exist", target="/params/path")
    if target.exists() and not p.overwrite:
        raise BinlensError("conflict", f"{target} exists (set overwrite to replace it)", target="/params/path")
    if target.exists() and not target.is_file():
        raise BinlensError("invalid_argument", f"{target} is not a regular file", target="/params/path")
    data, count = patched_file(prog)
    try:
        mode = os.stat(prog.path).st_mode & 0o777
    except OSError:
        mode = None
    try:
        write_atomically(target, data, mode)
    except OSError as err:
        raise BinlensError("unavailable", f"cannot write {target}: {err.strerror}", target="/params/path") from None
    return ProgramExported(
        path=str(target), size=len(data), sha256=hashlib.sha256(data).hexdigest(), patched_bytes=count
    )
