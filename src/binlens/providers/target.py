"""A debugged process as /proc shows it: its identity (pid, start time, executable device/inode and
sha256), pinned and re-checked on every call, and its memory mappings."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from binlens.errors import BinlensError

if TYPE_CHECKING:
    pass


# --- the target's identity ------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetIdentity:
    """What a pid must still be for a call to act on it."""

    pid: int
    start_time: int  # clock ticks after boot (/proc/PID/stat field 22)
    exe: str
    exe_device: int
    exe_inode: int
    sha256: str
    emulator: str | None = None  # an emulated target: the emulator's executable (/proc/PID/exe)
    emulator_device: int | None = None
    emulator_inode: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON object."""
        return asdict(self)

    @classmethod
    def pin(cls, pid: int) -> TargetIdentity:
        """The identity of the live process `pid` (process_exited when there is none)."""
        start = process_start_time(pid)
        if start is None:
            raise process_exited_error(pid)
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            st = os.stat(f"/proc/{pid}/exe")
            digest = hashlib.sha256()
            with open(f"/proc/{pid}/exe", "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
        except FileNotFoundError:
            raise process_exited_error(pid) from None
        except PermissionError:
            raise BinlensError(
                "unavailable",
                f"process {pid}'s executable cannot be read by the server",
                target="/params/pid",
                details={"reason": "permission_denied"},
            ) from None
        return cls(pid, start, exe.removesuffix(" (deleted)"), st.st_dev, st.st_ino, digest.hexdigest())

    def check(self) -> None:
        """Raise process_exited when the process is gone, process_changed when the pid names another
        process or another executable."""
        start = process_start_time(self.pid)
        if start is None:
            raise process_exited_error(self.pid)
        try:
            st = os.stat(f"/proc/{self.pid}/exe")
        except FileNotFoundError:
            raise process_exited_error(self.pid) from None
        except PermissionError:
            st = None
        exe = (
            (self.exe_device, self.exe_inode) if self.emulator is None else (self.emulator_device, self.emulator_inode)
        )
        if start != self.start_time or (st is not None and (st.st_dev, st.st_ino) != exe):
            raise BinlensError(
                "process_changed",
                f"pid {self.pid} is no longer the process this debug session pinned",
                details={"pid": self.pid, "pinned_start_time": self.start_time, "start_time": start},
            )


def file_identity(path: str) -> tuple[str, int, int, str]:
    """A program file's (path, device, inode, sha256)."""
    st = os.stat(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return path, st.st_dev, st.st_ino, digest.hexdigest()


def process_start_time(pid: int) -> int | None:
    """A live process's start time (None when it is gone or a zombie)."""
    try:
        text = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - one read
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of the whole line


def process_exited_error(pid: int) -> BinlensError:
    """The `process_exited` error for `pid`."""
    return BinlensError("process_exited", f"the target process {pid} has exited", details={"pid": pid})


# --- memory maps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    device: int
    inode: int
    path: str


def read_maps(pid: int) -> list[Mapping]:
    """The process's memory mappings (process_exited when it is gone)."""
    try:
        lines = open(f"/proc/{pid}/maps").read().splitlines()  # noqa: SIM115 - one read
    except (FileNotFoundError, ProcessLookupError):
        raise process_exited_error(pid) from None
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        lo, hi = parts[0].split("-")
        major, minor = parts[3].split(":")
        out.append(
            Mapping(
                int(lo, 16),
                int(hi, 16),
                parts[1],
                int(parts[2], 16),
                os.makedev(int(major, 16), int(minor, 16)),
                int(parts[4]),
                parts[5].strip() if len(parts) > 5 else "",
            )
        )
    return out
