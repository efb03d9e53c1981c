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
        return "ELF"
    if head[:2] == b"MZ":
        return "PE"
    if head in MACHO_MAGICS:
        return "MachO"
    if head in FAT_MAGICS and len(data) >= 8:
        # Java class files share 0xCAFEBABE; a fat header has a small slice count.
        (count,) = struct.unpack(">I", data[4:8])
        if 0 < count <= 64:
            return "MachO"
    raise BinlensError(
        "unsupported",
        "not an ELF, PE/COFF or Mach-O executable (unrecognised magic bytes)",
        details={"magic": head.hex()},
    )
