"""The Image: one file's exact bytes plus the facts the loader read from its headers.

An Image is pure data (picklable) so the native parser can run in a child process and a crash
in it cannot take the server down. Virtual addresses map to file offsets through a sorted
region table searched with bisect.
"""

from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

EF_ARM_BE8 = 0x00800000  # ELF e_flags: a big-endian ARM image whose instructions are little-endian
# Where every mapped region and every run of code ends at the latest: the last byte of the 64-bit
# address space is left out, so that each end address fits in 64 bits (the C parts take them so).
ADDRESS_END = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a program is: the fields every response about it carries."""

    sha256: str
    size: int
    format: str  # "ELF" | "PE" | "MachO"
    arch: str  # "x86-64", "x86", "aarch64", "arm", "mips", "ppc", "riscv", ... or "unknown"
    bits: int
    endian: str  # "little" | "big"
    image_base: int | None  # None: nothing loadable (an ELF file without PT_LOAD)
    entry: int
    file_name: str
    slice: str | None = None  # the chosen slice of a fat Mach-O


@dataclass(frozen=True, slots=True)
class Segment:
    """A loadable segment (ELF PT_LOAD, Mach-O segment, PE image header + sections)."""

    name: str
    va: int
    vsize: int
    offset: int
    fsize: int
    perms: str  # "rwx" with '-' for missing

    @property
    def end(self) -> int:
        return self.va + self.vsize


@dataclass(frozen=True, slots=True)
class Section:
    """A named section with its virtual and file ranges."""

    name: str
    va: int
    size: int
    offset: int
    fsize: int
    perms: str
    kind: str  # "code" | "data" | "bss" | "other"
    segment: str | None = None

    @property
    def end(self) -> int:
        return self.va + self.size


def perms_text(r: bool, w: bool, x: bool) -> str:
    """`Segment.perms`/`Section.perms` from the three permission bits: "r-x" and the like."""
    return ("r" if r else "-") + ("w" if w else "-") + ("x" if x else "-")


def section_kind(perms: str, nobits: bool) -> str:
    """`Section.kind` of a mapped section: code if executable, else bss if it holds no file bytes,
    else data if readable."""
    if "x" in perms:
        return "code"
    if nobits:
        return "bss"
    return "data" if perms[0] == "r" else "other"


SymbolKind = Literal["function", "object", "other"]


@dataclass(frozen=True, slots=True)
class Symbol:
    """A named address from a symbol table (demangled `name`, original `raw_name`)."""

    name: str
    raw_name: str
    address: int
    size: int
    kind: SymbolKind
    binding: str  # "local" | "global" | "weak"
    source: str  # "symtab" | "dynsym" | "export" | "coff" | "macho"


@dataclass(frozen=True, slots=True)
class Import:
    """An imported function or object, with the library it comes from when known."""

    name: str
    raw_name: str
    library: str | None
    slot: int  # address of the pointer the loader fills (GOT slot, IAT entry, lazy pointer)
    stub: int | None = None  # address of the PLT/stub that jumps through the slot, if known
    kind: str = "function"


@dataclass(frozen=True, slots=True)
class Export:
    """An exported name."""

    name: str
    raw_name: str
    address: int
    ordinal: int | None = None


@dataclass(frozen=True, slots=True)
class Relocation:
    """A relocation entry: where, what type, against which symbol."""

    address: int
    type: str
    symbol: str | None
    addend: int = 0


@dataclass(frozen=True, slots=True)
class Region:
    """One VA range backed (partly) by file bytes: [va, va+vsize) <- [offset, offset+fsize)."""

    va: int
    vsize: int
    offset: int
    fsize: int


@dataclass
class Image:
    """The loaded program: identity, bytes, and header facts."""

    identity: Identity
    data: bytes
    segments: list[Segment]
    sections: list[Section]
    symbols: list[Symbol]
    imports: list[Import]
    exports: list[Export]
    relocations: list[Relocation]
    slices: list[str] = field(default_factory=list)
    # Function-start hints read from metadata by the loader, by source name:
    # "eh_frame", "pdata", "function_starts", "init_array", "fini_array", "ctor", "dtor"; and "thumb":
    # ARM32 addresses of Thumb code where the format does not set their bit 0 (Mach-O N_ARM_THUMB_DEF symbols).
    function_hints: dict[str, list[int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # ELF `e_flags` (processor-specific: ARM EABI version, BE8, float ABI, MIPS ISA...); 0 for PE and Mach-O
    machine_flags: int = 0
    # Data inside executable sections, as [va, end) with the kind of evidence (PE: `pe_data.py`):
    # sorted, disjoint; the analysis decodes no code there and the string scanner reads it
    data_ranges: list[tuple[int, int, str]] = field(default_factory=list)
    _regions: list[Region] = field(default_factory=list, repr=False)
    _starts: list[int] = field(default_factory=list, repr=False)
    _sections_by_va: list[Section] = field(default_factory=list, repr=False)
    _section_starts: list[int] = field(default_factory=list, repr=False)

    @property
    def code_endian(self) -> str:
        """Byte order of instructions: the data's, except in ARM BE8 images (`EF_ARM_BE8`), whose
        instructions are stored little-endian while their data stays big-endian."""
        i = self.identity
        if i.arch == "arm" and i.endian == "big" and i.format == "ELF" and self.machine_flags & EF_ARM_BE8:
            return "little"
        return i.endian

    def __post_init__(self) -> None:
        if not self._regions:
            self._regions = build_regions(self.segments, self.sections)
        self._starts = [r.va for r in self._regions]
        self._sections_by_va = sorted((s for s in self.sections if s.size), key=lambda s: (s.va, s.size))
        self._section_starts = [s.va for s in self._sections_by_va]

    # --- address mapping ---------------------------------------------------------------
    def region_at(self, va: int) -> Region | None:
        """The mapped region containing `va`, or None."""
        i = bisect.bisect_right(self._starts, va) - 1
        if i >= 0:
            r = self._regions[i]
            if va < r.va + r.vsize:
                return r
        return None

    def is_mapped(self, va: int) -> bool:
        return self.region_at(va) is not None

    def va_to_offset(self, va: int) -> int | None:
        """File offset of `va`, or None when it is unmapped or not backed by file bytes."""
        r = self.region_at(va)
        if r is None or va - r.va >= r.fsize:
            return None
        return r.offset + (va - r.va)

    def read(self, va: int, size: int) -> bytes | None:
        """Bytes at `va` (zero-filled where a region has no file bytes); None if any byte is unmapped."""
        out = bytearray()
        while size > 0:
            r = self.region_at(va)
            if r is None:
                return None
            rel = va - r.va
            take = min(size, r.vsize - rel)
            if rel < r.fsize:
                n = min(take, r.fsize - rel)
                start = r.offset + rel
                chunk = self.data[start : start + n]
                out += chunk
                out += bytes(take - len(chunk))
            else:
                out += bytes(take)
            va += take
            size -= take
        return bytes(out)

    @property
    def regions(self) -> list[Region]:
        return list(self._regions)

    def section_at(self, va: int) -> Section | None:
        """The smallest section containing `va` (bisect, then a short walk back for overlaps)."""
        i = bisect.bisect_right(self._section_starts, va) - 1
        best = None
        for j in range(i, max(-1, i - 8), -1):
            s = self._sections_by_va[j]
            if s.va <= va < s.end and (best is None or s.size < best.size):
                best = s
        return best

    def segment_at(self, va: int) -> Segment | None:
        for s in self.segments:
            if s.va <= va < s.end:
                return s
        return None


def build_regions(segments: list[Segment], sections: list[Section]) -> list[Region]:
    """Non-overlapping mapped regions, sorted by VA (segments first; sections fill gaps), each
    ending at `ADDRESS_END` at most (a crafted table's region that runs past it is cut there)."""
    cands = [Region(s.va, s.vsize, s.offset, min(s.fsize, s.vsize)) for s in segments if s.vsize > 0]
    if not cands:
        cands = [
            Region(s.va, s.size, s.offset, 0 if s.kind == "bss" else min(s.fsize, s.size))
            for s in sections
            if s.size > 0 and s.va > 0
        ]
    cands = [_within_addresses(r) for r in cands if r.va < ADDRESS_END]
    cands.sort(key=lambda r: (r.va, -r.vsize))
    out: list[Region] = []
    for r in cands:
        if out and r.va < out[-1].va + out[-1].vsize:
            prev = out[-1]
            end = r.va + r.vsize
            if end <= prev.va + prev.vsize:
                continue
            cut = prev.va + prev.vsize - r.va
            r = Region(r.va + cut, r.vsize - cut, r.offset + cut, max(0, r.fsize - cut))
        out.append(r)
    return out


def _within_addresses(r: Region) -> Region:
    """`r` cut at `ADDRESS_END`."""
    if r.va + r.vsize <= ADDRESS_END:
        return r
    vsize = ADDRESS_END - r.va
    return Region(r.va, vsize, r.offset, min(r.fsize, vsize))


# --- bounded names ------------------------------------------------------------------------
# A name (symbol, import, export, section, segment, library, relocation target) is cut to
# NAME_CAP characters plus a marker: every symbol of a file may point at one shared string, so
# without a cap a 1 MB file names 1,500 symbols with 1 MiB each, and every layer that stores or
# returns a name per symbol (database, pages, listings) multiplies it.
NAME_CAP = 4096


def capped_name(name: str) -> str:
    """`name`, or its first NAME_CAP characters and a marker saying how many were cut."""
    if len(name) <= NAME_CAP:
        return name
    return f"{name[:NAME_CAP]}...[{len(name) - NAME_CAP} more characters cut]"


def cap_names(img: Image) -> Image:
    """Cut every name of `img` longer than NAME_CAP (see `capped_name`), with a warning saying so."""
    cut: dict[str, str] = {}  # one capped copy per distinct long name, shared by its users
    count = 0
    for attr in ("segments", "sections", "symbols", "imports", "exports", "relocations"):
        items = getattr(img, attr)
        names = [f.name for f in fields(type(items[0]))] if items else []
        for i, item in enumerate(items):
            long = {n: v for n in names if isinstance(v := getattr(item, n), str) and len(v) > NAME_CAP}
            if not long:
                continue
            count += 1
            for n, v in long.items():
                if v not in cut:
                    cut[v] = capped_name(v)
                long[n] = cut[v]
            items[i] = replace(item, **long)
    if count:
        img.warnings.append(
            f"{count} entries (symbols, imports, exports, sections, relocations) carry names longer than "
            f"{NAME_CAP} characters; they are cut to {NAME_CAP} and marked '...[N more characters cut]'"
        )
    return img


# --- compact transfer ---------------------------------------------------------------------
# The parser child sends an Image as plain tuples: pickling frozen slotted dataclasses costs
# ~10x more (a Python-level __setstate__ per object), ~0.1 s on libc.
_ROW_TYPES = (Segment, Section, Symbol, Import, Export, Relocation)
_ROW: dict[type, operator.attrgetter[Any]] = {
    cls: operator.attrgetter(*(f.name for f in fields(cls))) for cls in (*_ROW_TYPES, Identity)
}
# `encode_image`'s tuple: identity, the six row lists, slices, hints, warnings, machine flags, data ranges.
EncodedImage = tuple[Any, ...]


def encode_image(img: Image) -> EncodedImage:
    """The Image without its bytes, as plain tuples (see `decode_image`)."""
    tables: tuple[list[Any], ...] = (img.segments, img.sections, img.symbols, img.imports, img.exports, img.relocations)
    rows = tuple([_ROW[cls](x) for x in items] for cls, items in zip(_ROW_TYPES, tables, strict=True))
    head = (_ROW[Identity](img.identity), *rows, img.slices, img.function_hints, img.warnings, img.machine_flags)
    return (*head, img.data_ranges)


def decode_image(encoded: EncodedImage, data: bytes) -> Image:
    """Rebuild an Image from `encode_image`'s tuples and the file's bytes."""
    ident, segments, sections, symbols, imports, exports, relocations, slices, hints, warnings, flags, data_ranges = (
        encoded
    )
    return Image(
        Identity(*ident),
        data,
        [Segment(*r) for r in segments],
        [Section(*r) for r in sections],
        [Symbol(*r) for r in symbols],
        [Import(*r) for r in imports],
        [Export(*r) for r in exports],
        [Relocation(*r) for r in relocations],
        slices=slices,
        function_hints=hints,
        warnings=warnings,
        machine_flags=flags,
        data_ranges=[(lo, hi, kind) for lo, hi, kind in data_ranges],
    )
