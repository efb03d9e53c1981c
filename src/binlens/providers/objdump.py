"""GNU objdump as a provider: a second, independent disassembler to cross-check binlens's decoding.

The server side (`ObjdumpProvider`, `ObjdumpSession`) finds the executable (`$BINLENS_OBJDUMP`,
else `objdump` on the PATH) and asks a session process to disassemble an address range; the
child side (`ObjdumpHandler`) holds the program's bytes in a memory file (never the file on
disk, which may have changed since it was opened) and runs objdump over it. objdump runs in the
session's process group, so a timeout or a cancellation kills it with the session.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import TYPE_CHECKING, Any

from binlens.providers.base import (
    Availability,
    Cancellable,
    DisassembledInstruction,
    Progress,
    ProviderFailure,
    ToolVersions,
)
from binlens.providers.process import ProcessSession

if TYPE_CHECKING:
    from binlens.loader.image import Image

ENV = "BINLENS_OBJDUMP"
REMEDIATION = "apt-get install binutils (or set $BINLENS_OBJDUMP to an objdump executable)"
MULTIARCH = "apt-get install binutils-multiarch (this objdump does not know the program's format or architecture)"
MEMORY_LIMIT = 1 << 30
MAX_OUTPUT = 64 << 20  # bytes of objdump output read for one request
_LINE = re.compile(r"^\s*([0-9a-f]+):\t([0-9a-f ]+?)\s*(?:\t(.*))?$")
_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)*)\s*$")


class ObjdumpProvider:
    """The objdump provider (kind `disassembler`)."""

    id = "objdump"
    kind = "disassembler"

    def __init__(self) -> None:
        self._versions = ToolVersions("objdump", REMEDIATION, _probe)

    def executable(self) -> str | None:
        """The objdump to run: `$BINLENS_OBJDUMP` when set, else the PATH's."""
        named = os.environ.get(ENV)
        if named:
            return named
        return shutil.which("objdump")

    def availability(self) -> Availability:
        """Available when the executable runs and says its version (probed once per file version)."""
        return self._versions.check(self.executable())

    def open_session(self, image: Image) -> ObjdumpSession:
        """A session over `image`'s bytes (its process starts on the first request)."""
        return ObjdumpSession(image, self.executable() or "objdump")


def _probe(exe: str) -> Availability:
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        return Availability(False, reason=f"{exe} does not run: {type(err).__name__}", remediation=REMEDIATION)
    first = (done.stdout.splitlines() or [""])[0]
    m = _VERSION.search(first)
    if done.returncode != 0 or "objdump" not in first or m is None:
        return Availability(False, reason=f"{exe} is not GNU objdump", remediation=REMEDIATION)
    return Availability(True, version=m.group(1))


def _options(arch: str) -> list[str]:
    """objdump's options for an architecture: Intel syntax on x86, as binlens's listings."""
    return ["-M", "intel"] if arch in ("x86", "x86-64") else []


class ObjdumpSession(ProcessSession):
    """One program's objdump session."""

    def __init__(self, image: Image, executable: str) -> None:
        super().__init__(
            "objdump",
            "binlens.providers.objdump:ObjdumpHandler",
            open_args={"file_name": image.identity.file_name},
            open_blob=image.data,
            memory_limit=MEMORY_LIMIT,
        )
        self.arch = image.identity.arch
        self.executable = executable

    def disassemble(
        self, start: int, end: int, *, timeout: float, ctx: Cancellable | None = None
    ) -> list[DisassembledInstruction]:
        """objdump's instructions that start in [start, end)."""
        result, _ = self.call(
            "disassemble",
            {
                "objdump": self.executable,
                "start": start,
                "end": end,
                "options": _options(self.arch),
                "timeout": timeout,
            },
            timeout=timeout,
            ctx=ctx,
        )
        out = []
        for row in result.get("instructions", []):
            address, data, text = row
            out.append(DisassembledInstruction(int(address), bytes.fromhex(data), str(text)))
        return out


class ObjdumpHandler:
    """The child side: the program's bytes in a memory file, objdump run over it per request."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.path: str | None = None

    def handle(self, op: str, args: dict[str, Any], blob: bytes, progress: Progress) -> tuple[dict[str, Any], bytes]:
        """`open` (the program's bytes) or `disassemble` (an address range)."""
        if op == "open":
            self._hold(blob)
            return {}, b""
        if op == "disassemble":
            return {"instructions": self._disassemble(args)}, b""
        raise ProviderFailure("internal", f"unknown request {op!r}")

    def _hold(self, data: bytes) -> None:
        try:
            fd = os.memfd_create("binlens-image")  # (objdump inherits it through `pass_fds`)
        except (AttributeError, OSError):
            fd, self.path = tempfile.mkstemp(prefix="binlens-objdump-")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        self.fd = fd

    def _disassemble(self, args: dict[str, Any]) -> list[list[Any]]:
        if self.fd is None:
            raise ProviderFailure("internal", "no program is open in this session")
        start, end = int(args["start"]), int(args["end"])
        target = self.path or f"/dev/fd/{self.fd}"
        cmd = [
            str(args["objdump"]),
            "-d",
            "-w",
            "-z",
            *map(str, args.get("options", [])),
            f"--start-address={start:#x}",
            f"--stop-address={end:#x}",
            target,
        ]
        try:
            done = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                pass_fds=(self.fd,),
                timeout=float(args.get("timeout", 60)) + 5,
            )
        except (OSError, subprocess.SubprocessError) as err:
            raise ProviderFailure(
                "unavailable",
                f"objdump did not run: {type(err).__name__}",
                reason="objdump did not run",
                remediation=REMEDIATION,
            ) from None
        err_text = done.stderr.decode(errors="replace").replace(target, "<program>")
        last = (err_text.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:300]
        if "file format not recognized" in err_text or "can't disassemble" in err_text:
            raise ProviderFailure(
                "unsupported",
                f"objdump cannot disassemble this program: {last}",
                reason=last,
                remediation=MULTIARCH,
            )
        if done.returncode < 0:
            raise ProviderFailure(
                "internal", f"objdump was killed by signal {-done.returncode}", reason="objdump_crashed"
            )
        if done.returncode != 0:
            raise ProviderFailure("internal", f"objdump failed: {last}", reason="objdump_failed")
        return _parse(done.stdout[:MAX_OUTPUT].decode(errors="replace"), start, end)


def _parse(text: str, start: int, end: int) -> list[list[Any]]:
    """[address, hex bytes, text] of each instruction line in [start, end)."""
    out: list[list[Any]] = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        address = int(m.group(1), 16)
        if not start <= address < end:
            continue
        out.append([address, m.group(2).replace(" ", ""), " ".join((m.group(3) or "").split())])
    return out


PROVIDER = ObjdumpProvider()
