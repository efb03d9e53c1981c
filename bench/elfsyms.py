"""A minimal ELF reader (standard library only) for the benchmark's ground truth.

It reads section headers and the symbol tables; nothing else. Kept independent of binlens's own
loader on purpose, so the ground truth does not share code (or bugs) with what it judges.
"""

from __future__ import annotations

import struct
from pathlib import Path

SHF_EXECINSTR = 0x4
SHT_SYMTAB = 2
SHT_DYNSYM = 11
SHT_NOBITS = 8
STT_NOTYPE = 0
STT_FUNC = 2
STT_GNU_IFUNC = 10
SHN_UNDEF = 0
SHN_LORESERVE = 0xFF00
EM_ARM = 40


def _sections(data: bytes) -> tuple[list[dict], str, bool]:
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        shoff, shentsize, shnum, shstrndx = (
            struct.unpack_from(end + "Q", data, 0x28)[0],
            *struct.unpack_from(end + "HHH", data, 0x3A),
        )
        fmt = end + "IIQQQQIIQQ"
    else:
        shoff, shentsize, shnum, shstrndx = (
            struct.unpack_from(end + "I", data, 0x20)[0],
            *struct.unpack_from(end + "HHH", data, 0x2E),
        )
        fmt = end + "IIIIIIIIII"
    secs = []
    for i in range(shnum):
        name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from(
            fmt, data, shoff + i * shentsize
        )
        secs.append(
            {"name_off": name, "type": typ, "flags": flags, "addr": addr, "offset": off, "size": size, "link": link}
        )
    if secs and shstrndx < len(secs):
        strtab = secs[shstrndx]
        for s in secs:
            raw = data[strtab["offset"] + s["name_off"] : strtab["offset"] + strtab["size"]]
            s["name"] = raw.split(b"\0", 1)[0].decode("ascii", "replace")
    return secs, end, is64


def executable_ranges(path: Path, exclude_prefixes: tuple[str, ...] = ()) -> list[tuple[int, int]]:
    """[start, end) of every executable section with contents, minus those whose name starts with a prefix."""
    secs, _end, _is64 = _sections(Path(path).read_bytes())
    return [
        (s["addr"], s["addr"] + s["size"])
        for s in secs
        if s["flags"] & SHF_EXECINSTR
        and s["type"] != SHT_NOBITS
        and s["size"]
        and not s.get("name", "").startswith(exclude_prefixes)
    ]


# Local labels GNU ld gives the call stubs it writes into .text itself (PowerPC 32 secure-PLT `plt_pic32`
# / `plt_call32` stubs): PLT stubs outside any .plt section.
LINKER_STUB_MARKERS = (".plt_pic32.", ".plt_call32.", ".plt_call.")
# ... and its lazy-binding entries there: `__glink` (one `b __glink_PLTresolve` per import) and the resolver.
LINKER_STUB_NAMES = ("__glink", "__glink_PLTresolve")


def function_symbols(path: Path, sized: bool = True, stubs: bool = False) -> dict[int, str]:
    """Ground truth: address -> name of every defined FUNC (or IFUNC) symbol with a nonzero size (or, with
    `sized=False`, with size zero: crt assembly such as `_init` or `frame_dummy`) that lies in an executable
    section, from `.symtab` (falling back to `.dynsym`). Aliases keep one name.

    Reads ELF32 and ELF64 of either byte order. On ARM, bit 0 of a function symbol's value marks Thumb code
    and is cleared (the function starts at the even address); the mapping symbols `$a`/`$t`/`$d` are
    STT_NOTYPE and so never taken."""
    data = Path(path).read_bytes()
    secs, end, is64 = _sections(data)
    thumb_mask = ~1 if struct.unpack_from(end + "H", data, 0x12)[0] == EM_ARM else ~0
    tables = [s for s in secs if s["type"] == SHT_SYMTAB] or [s for s in secs if s["type"] == SHT_DYNSYM]
    out: dict[int, str] = {}
    for tab in tables:
        strs = secs[tab["link"]]
        if is64:
            fmt, entsize = end + "IBBHQQ", 24
        else:
            fmt, entsize = end + "IIIBBH", 16
        for i in range(1, tab["size"] // entsize):
            fields = struct.unpack_from(fmt, data, tab["offset"] + i * entsize)
            if is64:
                name, info, _other, shndx, value, size = fields
            else:
                name, value, size, info, _other, shndx = fields
            if stubs:
                if info & 0xF != STT_NOTYPE:
                    continue
            elif info & 0xF not in (STT_FUNC, STT_GNU_IFUNC) or (size != 0) != sized:
                continue
            if shndx == SHN_UNDEF or shndx >= SHN_LORESERVE or shndx >= len(secs):
                continue
            if not secs[shndx]["flags"] & SHF_EXECINSTR:
                continue
            value &= thumb_mask
            raw = data[strs["offset"] + name : strs["offset"] + strs["size"]]
            label = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
            if stubs and not (label in LINKER_STUB_NAMES or any(m in label for m in LINKER_STUB_MARKERS)):
                continue
            prev = out.get(value)
            # Prefer the shortest, non-underscore name among aliases: readable, deterministic.
            if prev is None or (label.startswith("_"), len(label), label) < (prev.startswith("_"), len(prev), prev):
                out[value] = label
    if stubs and out:
        out.update(_unlabelled_ppc_stubs(data, secs, end, out))
    return out


MTCTR_R11, BCTR = 0x7D6903A6, 0x4E800420


def _unlabelled_ppc_stubs(data: bytes, secs: list[dict], end: str, labelled: dict[int, str]) -> dict[int, str]:
    """GNU ld labels only some of the 16-byte PowerPC 32 PLT call stubs it packs together in .text; the
    neighbours of a labelled stub that have the same shape (`mtctr r11; bctr` inside the slot) are stubs too."""
    found: dict[int, str] = {}
    for addr, name in labelled.items():
        if name != "__glink":
            continue
        sec = next((x for x in secs if x["flags"] & SHF_EXECINSTR and x["addr"] <= addr < x["addr"] + x["size"]), None)
        a = addr + 4
        while sec and a + 4 <= sec["addr"] + sec["size"] and a not in labelled:
            word = struct.unpack_from(end + "I", data, sec["offset"] + a - sec["addr"])[0]
            if word >> 26 != 18:  # not a `b`: past the glink entries
                break
            found[a] = "__glink entry"
            a += 4
    for addr, name in labelled.items():
        if name in LINKER_STUB_NAMES:
            continue
        sec = next((x for x in secs if x["flags"] & SHF_EXECINSTR and x["addr"] <= addr < x["addr"] + x["size"]), None)
        if sec is None:
            continue
        for step in (16, -16):
            a = addr + step
            while sec["addr"] <= a and a + 16 <= sec["addr"] + sec["size"] and a not in labelled:
                words = struct.unpack_from(end + "4I", data, sec["offset"] + a - sec["addr"])
                if not any(words[i] == MTCTR_R11 and words[i + 1] == BCTR for i in range(3)):
                    break
                found[a] = "plt_pic32 stub"
                a += step
    return found
