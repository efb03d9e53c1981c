"""PowerPC64 ELFv1 function descriptors: where a function symbol's code is.

In the ELFv1 ABI (big-endian PowerPC64 before ELFv2) a function symbol, the entry point and a
function pointer name a descriptor in `.opd`, three doublewords: the code's entry address, the
TOC pointer and an environment pointer. The code itself has no symbol (objdump shows a synthetic
`.name`). The LIEF reader moves each function symbol, export and the entry point that name a
descriptor to the code it describes, and lists every descriptor's entry as a function-start hint
(`opd`): every function whose address is taken or exported has one.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from binlens.loader.image import Section

DESCRIPTOR = 24  # entry, TOC, environment


def is_elfv1(arch: str, bits: int, flags: int) -> bool:
    """A PowerPC64 ELF file of the ELFv1 ABI (`e_flags` & 3 is 1, or 0 for files before the flag)."""
    return arch == "ppc" and bits == 64 and flags & 3 != 2


def descriptors(data: bytes, sections: Sequence[Section], big: bool) -> dict[int, int]:
    """Descriptor address -> the code address it names, for each descriptor of `.opd` (empty
    entries, and a section outside the file, give nothing)."""
    opd = next((s for s in sections if s.name == ".opd" and s.fsize and s.va), None)
    if opd is None or opd.offset + opd.fsize > len(data):
        return {}
    n = opd.fsize // DESCRIPTOR
    words = struct.unpack_from(f"{'>' if big else '<'}{3 * n}Q", data, opd.offset)
    return {opd.va + DESCRIPTOR * i: words[3 * i] for i in range(n) if words[3 * i]}
