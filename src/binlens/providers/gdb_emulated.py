"""Targets of another architecture than the machine's, debugged under QEMU's user-mode emulator.

An AArch64 program runs as `qemu-aarch64 -g SOCKET PROGRAM ARGS` (Debian's `qemu-user`), stopped
before its first instruction with QEMU's gdb stub listening on a Unix socket in the session's
private directory (no TCP port); `gdb-multiarch` connects to it (`target remote SOCKET`). The
target's process is QEMU's: its pid and start time are QEMU's, its `/proc/PID/exe` is the
emulator (pinned as `emulator`), and the program is the file QEMU maps (pinned by device, inode
and sha256 as for a native target), at the same addresses as the guest's while QEMU maps the
guest without an offset (a 64-bit guest on a 64-bit machine), so /proc/PID/maps gives the slide.
QEMU's stub has no hardware breakpoints or watchpoints, and a process cannot be attached.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from binlens.errors import BinlensError
from binlens.providers.target import (
    TargetIdentity,
    file_identity,
    process_exited_error,
    process_start_time,
    read_maps,
)

if TYPE_CHECKING:
    from binlens.loader.image import Image

HOST_ARCHES = ("x86-64", "x86")  # what gdb runs natively here
EMULATED = {"aarch64": ("qemu-aarch64", "aarch64-linux-gnu")}  # binlens arch -> (QEMU user binary, Debian triple)
REMEDIATION = "apt-get install qemu-user gdb-multiarch (and the target's C library: libc6-arm64-cross)"
MULTIARCH_ENV = "BINLENS_GDB_MULTIARCH"


@dataclass(frozen=True)
class Emulator:
    """How a program of another architecture runs here."""

    arch: str
    qemu: str  # the emulator's executable
    gdb: str  # a gdb that debugs the architecture (gdb-multiarch)
    sysroot: str | None  # the target's libraries (/usr/<triple>), for dynamically linked programs


def emulator_for(image: Image) -> Emulator | None:
    """The emulator an image of another architecture needs (None for the machine's own; an
    `unavailable` error when its architecture is emulated but QEMU or gdb-multiarch is missing)."""
    arch = image.identity.arch
    if arch in HOST_ARCHES or arch not in EMULATED or image.identity.format != "ELF":
        return None
    qemu_name, triple = EMULATED[arch]
    qemu = shutil.which(qemu_name)
    gdb = os.environ.get(MULTIARCH_ENV) or shutil.which("gdb-multiarch")
    if qemu is None or gdb is None:
        missing = " and ".join(n for n, p in ((qemu_name, qemu), ("gdb-multiarch", gdb)) if p is None)
        raise BinlensError(
            "unavailable",
            f"{arch} programs are debugged under QEMU here; {missing} is not installed",
            details={"reason": "emulator_missing", "arch": arch, "remediation": REMEDIATION},
        )
    sysroot = f"/usr/{triple}"
    return Emulator(arch, qemu, gdb, sysroot if os.path.isdir(sysroot) else None)


def spawn(
    emulator: Emulator,
    path: str,
    args: list[str],
    env: dict[str, str],
    cwd: str | None,
    stdin_path: str,
    output: str,
    socket: str,
    timeout: float,
) -> subprocess.Popen[bytes]:
    """Start QEMU on the program, stopped before its first instruction until gdb connects to
    `socket` (its stdin reads `stdin_path`, its stdout and stderr go to the FIFO `output`)."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TERM")}
    argv = [emulator.qemu, *(["-L", emulator.sysroot] if emulator.sysroot else []), "-g", socket, path, *args]
    with open(stdin_path, "rb") as stdin:
        out = os.open(output, os.O_WRONLY)  # (the session's drain thread holds the reading end)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**base, **env},
                cwd=cwd,
                close_fds=True,
                start_new_session=True,
            )
        finally:
            os.close(out)
    deadline = time.monotonic() + timeout
    while not os.path.exists(socket):
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait(5)
            raise BinlensError(
                "unavailable",
                f"{os.path.basename(emulator.qemu)} did not start the program",
                details={"reason": "start_failed", "exit_code": proc.returncode},
            )
        time.sleep(0.005)
    return proc


def pin(pid: int, path: str, emulator: Emulator) -> TargetIdentity:
    """The identity of QEMU's process `pid` running the program `path`: QEMU's pid and start time,
    the program's device, inode and sha256 (the file must be mapped in the process)."""
    start = process_start_time(pid)
    if start is None:
        raise process_exited_error(pid)
    exe, device, inode, sha256 = file_identity(path)
    if not any(m.device == device and m.inode == inode for m in read_maps(pid)):
        raise BinlensError("unavailable", "the emulator has not mapped the program", details={"reason": "start_failed"})
    qemu = os.stat(emulator.qemu)
    return TargetIdentity(
        pid,
        start,
        exe,
        device,
        inode,
        sha256,
        emulator=emulator.qemu,
        emulator_device=qemu.st_dev,
        emulator_inode=qemu.st_ino,
    )
