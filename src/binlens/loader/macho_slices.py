"""Slices of a universal (fat) Mach-O file: their names and where their bytes lie.

A slice is named by its architecture ("x86-64", "aarch64", ...). Where several slices share an
architecture (arm64 and arm64e, armv7 and armv7s), each of them is named as `lipo` names it
("arm64e", "armv7s"), so that every slice can be opened by a name of its own; the bare
architecture still opens the first of them.
"""

from __future__ import annotations

import struct

from binlens.errors import BinlensError

FAT_MAGIC, FAT_MAGIC_64 = b"\xca\xfe\xba\xbe", b"\xca\xfe\xba\xbf"
_CPU_ARCH_ABI64 = 0x01000000
_CPU_SUBTYPE_MASK = 0x00FFFFFF  # the high byte holds capability bits (CPU_SUBTYPE_LIB64, PtrAuth ABI)

# (cputype without the ABI bit, subtype) -> the name `lipo` prints
_APPLE_NAMES = {
    (7, 3): "i386",
    (7 | _CPU_ARCH_ABI64, 3): "x86_64",
    (7 | _CPU_ARCH_ABI64, 8): "x86_64h",
    (12, 5): "armv4t",
    (12, 6): "armv6",
    (12, 7): "armv5",
    (12, 9): "armv7",
    (12, 10): "armv7f",
    (12, 11): "armv7s",
    (12, 12): "armv7k",
    (12, 13): "armv8",
    (12, 14): "armv6m",
    (12, 15): "armv7m",
    (12, 16): "armv7em",
    (12 | _CPU_ARCH_ABI64, 0): "arm64",
    (12 | _CPU_ARCH_ABI64, 1): "arm64v8",
    (12 | _CPU_ARCH_ABI64, 2): "arm64e",
    (0x0200000C, 1): "arm64_32",
    (18, 0): "ppc",
    (18, 10): "ppc7400",
    (18, 11): "ppc7450",
    (18, 100): "ppc970",
    (18 | _CPU_ARCH_ABI64, 0): "ppc64",
}


def fat_ranges(data: bytes) -> dict[int, int]:
    """A universal file's slices as {file offset: size}, read from its fat header ({} when the
    file is thin or the header is cut short)."""
    magic = data[:4]
    if magic not in (FAT_MAGIC, FAT_MAGIC_64) or len(data) < 8:
        return {}
    (count,) = struct.unpack_from(">I", data, 4)
    entry = struct.Struct(">iiQQI" if magic == FAT_MAGIC_64 else ">iiIII")
    out: dict[int, int] = {}
    for i in range(min(count, (len(data) - 8) // entry.size)):
        _cpu, _sub, offset, size, _align = entry.unpack_from(data, 8 + i * entry.size)
        out.setdefault(offset, size)
    return out


def slice_names(slices: list[tuple[str, int, int]]) -> list[str]:
    """One unique name per slice, from each slice's (arch, cputype, cpusubtype)."""
    archs = [arch for arch, _cpu, _sub in slices]
    names = []
    for arch, cpu, sub in slices:
        if archs.count(arch) == 1:
            names.append(arch)
            continue
        key = (cpu & 0xFFFFFFFF, sub & _CPU_SUBTYPE_MASK)
        names.append(_APPLE_NAMES.get(key) or f"{arch}.{key[1]}")
    for i, name in enumerate(names):  # the same cputype and subtype twice: number the later ones
        if names.index(name) != i:
            names[i] = f"{name}-{i}"
    return names


def pick_slice(names: list[str], archs: list[str], wanted: str | None) -> int:
    """The index of the slice to open: `wanted` by name (or by bare architecture: the first slice
    of it), else the x86-64 slice, else the first one."""
    if wanted is None:
        return archs.index("x86-64") if "x86-64" in archs else 0
    if wanted in names:
        return names.index(wanted)
    if wanted in archs:
        return archs.index(wanted)
    raise BinlensError(
        "not_found",
        f"no slice {wanted!r} in this universal file",
        target="/params/slice",
        details={"slices": names},
    )
