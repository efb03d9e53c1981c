"""Strings in an image's data: ASCII/UTF-8 runs and UTF-16LE runs, found with C-speed regexes."""

from __future__ import annotations

import re

from binlens.analysis.codemap import warning_name
from binlens.analysis.model import FoundString
from binlens.loader.image import ADDRESS_END, Image, Section

# Sections that hold metadata rather than program data.
METADATA_SECTIONS = frozenset(
    [
        ".eh_frame",
        ".eh_frame_hdr",
        ".gcc_except_table",
        ".dynsym",
        ".symtab",
        ".dynstr",
        ".strtab",
        ".shstrtab",
        ".gnu.hash",
        ".hash",
        ".gnu.version",
        ".gnu.version_r",
        ".gnu.version_d",
        ".dynamic",
        ".got",
        ".got.plt",
        ".init_array",
        ".fini_array",
        ".preinit_array",
        ".note.gnu.build-id",
        ".note.ABI-tag",
        ".note.gnu.property",
        ".note.package",
        ".rela.dyn",
        ".rela.plt",
        ".rel.dyn",
        ".rel.plt",
        ".relr.dyn",
        ".reloc",
        ".pdata",
        ".xdata",
        ".pdata$",
        "__unwind_info",
        "__eh_frame",
        "__la_symbol_ptr",
        "__nl_symbol_ptr",
        "__got",
        "__auth_got",
        "__mod_init_func",
        "__mod_term_func",
        "__chain_starts",
        "__objc_methname",
    ]
)
# Mach-O sections in executable segments that are code (the rest of __TEXT is data).
MACHO_CODE = ("__text", "__stubs", "__stub_helper", "__symbol_stub", "__symbol_stub1", "__picsymbolstub4", "__init")

_PRINT = rb"[\x20-\x7e\t\n\r]"
_UTF8 = rb"(?:[\x20-\x7e\t\n\r]|[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3})"


def section_short_name(s: Section) -> str:
    return s.name.rsplit(",", 1)[-1]


def is_data_section(image: Image, s: Section) -> bool:
    """Does this section hold program data (not code, not loader metadata)?"""
    if s.size == 0 or s.fsize == 0 or s.va == 0:
        return False
    short = section_short_name(s)
    if short in METADATA_SECTIONS or s.name in METADATA_SECTIONS or short.startswith((".note", ".rela", ".rel.")):
        return False
    if image.identity.format == "MachO":
        return short not in MACHO_CODE and not short.startswith("__symbol_stub")
    return s.kind == "data"


def readable_size(s: Section) -> int:
    """How many of the section's bytes to read: those the file holds, up to the end of the address
    space (`ADDRESS_END`; a crafted table's section may run past it)."""
    return max(0, min(s.fsize, s.size, ADDRESS_END - s.va))


def past_the_top(image: Image) -> list[str]:
    """A warning for each data section (as `is_data_section` says) that runs past `ADDRESS_END`:
    its bytes there are not read."""
    return [
        f"data section {warning_name(s.name)} at {s.va:#x}: runs past the end of the address space;"
        " what lies past it is not read"
        for s in image.sections
        if is_data_section(image, s) and s.va + min(s.fsize, s.size) > ADDRESS_END
    ][:20]


def find_strings(image: Image, min_length: int = 4) -> list[FoundString]:
    """Every string of at least `min_length` characters in the data sections and in the data ranges
    of code sections (`Image.data_ranges`), by address."""
    utf8 = re.compile(_UTF8 + rb"{%d,}" % min_length)
    utf16 = re.compile(rb"(?:" + _PRINT + rb"\x00){%d,}" % min_length)
    out: list[FoundString] = []
    pieces = [
        (s.va, bytes(image.data[s.offset : s.offset + readable_size(s)]), s.name)
        for s in image.sections
        if is_data_section(image, s)
    ]
    # data the loader located inside code sections (`Image.data_ranges`: MSVC's `.rdata` merged into `.text`)
    for lo, hi, _kind in image.data_ranges:
        sec = image.section_at(lo)
        raw = image.read(lo, hi - lo)
        if raw is not None and sec is not None:
            pieces.append((lo, raw, sec.name))
    for va, data, name in pieces:
        for m in utf8.finditer(data):
            raw = m.group()
            enc = "ascii" if raw.isascii() else "utf-8"
            out.append(FoundString(va + m.start(), len(raw), enc, raw.decode("utf-8", "replace"), name))
        for m in utf16.finditer(data):
            raw = m.group()
            out.append(FoundString(va + m.start(), len(raw), "utf-16le", raw.decode("utf-16le", "replace"), name))
    out.sort(key=lambda x: (x.address, -x.size))
    # overlapping sections of odd files can yield the same address twice: keep the longest
    return [x for i, x in enumerate(out) if i == 0 or out[i - 1].address != x.address]
