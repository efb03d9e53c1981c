"""Format sniffing from magic bytes, before any native parser sees the file."""

from __future__ import annotations

import struct

from binlens.errors import BinlensError

MACHO_MAGICS = {
    b"\xfe\xed\xfa\xce",
    b"\xce\xfa\xed\xfe",
    b"\xfe\xed\xfa\xcf",
    b"\xcf\xfa\xed\xfe",
}
FAT_MAGICS = {b"\xca\xfe\xba\xbe", b"\xca\xfe\xba\xbf"}


def sniff_format(data: bytes) -> str:
    """Return "ELF", "PE" or "MachO" from the magic, or raise `unsupported`/`invalid_argument`."""
    if len(data) < 4:
        raise BinlensError("invalid_argument", f"file is {len(data)} bytes: too short for any executable format")
    head = data[:4]
    if head == b"\x7fELF":
        need = 64 if data[4:5] == b"\x02" else 52
        _need(data, need, "ELF header")
        return "ELF"
    if head[:2] == b"MZ":
        _need(data, 0x40, "DOS header")
        (lfanew,) = struct.unpack_from("<I", data, 0x3C)
        _need(data, lfanew + 24, "PE header")
        if data[lfanew : lfanew + 4] != b"PE\0\0":
            raise BinlensError("unsupported", "an MZ file without a PE header (DOS executables are not supported)")
        return "PE"
    if head in MACHO_MAGICS:
        _need(data, 32 if head in (b"\xfe\xed\xfa\xcf", b"\xcf\xfa\xed\xfe") else 28, "Mach-O header")
        return "MachO"
    if head in FAT_MAGICS and len(data) >= 8:
        # Java class files share 0xCAFEBABE; a fat header has a small slice count.
        (count,) = struct.unpack(">I", data[4:8])
        if 0 < count < 45:  # class files have major version >= 45 there
            return "MachO"
    raise BinlensError(
        "unsupported",
        "not an ELF, PE/COFF or Mach-O executable (unrecognised magic bytes)",
    )  # the bytes themselves are not echoed: an error about a file never carries its content


def _need(data: bytes, size: int, what: str) -> None:
    if len(data) < size:
        raise BinlensError(
            "invalid_argument",
            f"truncated file: the {what} needs {size} bytes, the file has {len(data)}",
            details={"size": len(data), "needed": size},
        )
