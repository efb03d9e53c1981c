"""LIEF-backed parsing into an Image. Runs inside the isolated parser process (see isolate.py)."""

from __future__ import annotations

import hashlib
import os
import struct
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import lief

from binlens.errors import BinlensError
from binlens.loader.demangle import demangle
from binlens.loader.formats import sniff_format
from binlens.loader.image import (
    Export,
    Identity,
    Image,
    Import,
    Relocation,
    Section,
    Segment,
    Symbol,
    SymbolKind,
    perms_text,
    section_kind,
)
from binlens.loader.macho_slices import fat_ranges, pick_slice, slice_names
from binlens.loader.macho_stubs import IndirectSection, stubs_by_slot
from binlens.loader.mips_got import global_got_imports
from binlens.loader.pe_data import pe_data_ranges
from binlens.loader.ppc64_opd import descriptors, is_elfv1

lief.logging.disable()
N_ARM_THUMB_DEF = 0x0008  # Mach-O n_desc: the symbol names Thumb code
warnings.filterwarnings("ignore", category=RuntimeWarning)

ELF_ARCH = {
    "X86_64": ("x86-64", 64),
    "I386": ("x86", 32),
    "AARCH64": ("aarch64", 64),
    "ARM": ("arm", 32),
    "MIPS": ("mips", 0),
    "MIPS_RS3_LE": ("mips", 0),
    "PPC": ("ppc", 32),
    "PPC64": ("ppc", 64),
    "RISCV": ("riscv", 0),
    "SPARC": ("sparc", 32),
    "SPARCV9": ("sparc", 64),
    "SPARC32PLUS": ("sparc", 32),
    "M68K": ("m68k", 32),
    "S390": ("s390", 64),
    "SH": ("sh", 32),
    "LOONGARCH": ("loongarch", 64),
}
PE_ARCH = {
    "AMD64": ("x86-64", 64),
    "I386": ("x86", 32),
    "ARM64": ("aarch64", 64),
    "ARM": ("arm", 32),
    "ARMNT": ("arm", 32),
    "THUMB": ("arm", 32),
    "POWERPC": ("ppc", 32),
    "MIPS16": ("mips", 32),
    "R4000": ("mips", 32),
    "RISCV64": ("riscv", 64),
    "RISCV32": ("riscv", 32),
    "IA64": ("ia64", 64),
}
MACHO_ARCH = {
    "x86_64": ("x86-64", 64),
    "X86_64": ("x86-64", 64),
    "x86": ("x86", 32),
    "X86": ("x86", 32),
    "ARM64": ("aarch64", 64),
    "ARM": ("arm", 32),
    "POWERPC": ("ppc", 32),
    "POWERPC64": ("ppc", 64),
    "ARM64_32": ("aarch64", 32),
}


def _text(value: Any) -> str:
    """A name as text: LIEF hands back bytes for names that are not valid UTF-8."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return value or ""


def _enum_name(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1]


def parse_image(data: bytes, file_name: str, slice_name: str | None = None) -> Image:
    """Parse `data` into an Image; raise BinlensError for bad or unsupported input."""
    fmt = sniff_format(data)
    sha = hashlib.sha256(data).hexdigest()
    with warnings.catch_warnings():
        # LIEF warns on enum values it does not know (vendor segment, relocation and section types):
        # they keep their number as their name, which is all binlens needs
        warnings.simplefilter("ignore", RuntimeWarning)
        if fmt == "ELF":
            return _parse_elf(data, sha, file_name)
        if fmt == "PE":
            return _parse_pe(data, sha, file_name)
        return _parse_macho(data, sha, file_name, slice_name)


# ----------------------------------------------------------------------------------- ELF
def _parse_elf(data: bytes, sha: str, file_name: str) -> Image:
    b = lief.ELF.parse(data)
    if b is None:
        raise BinlensError("invalid_argument", "malformed ELF file: the header could not be parsed")
    hdr = b.header
    arch, bits = ELF_ARCH.get(_enum_name(hdr.machine_type), ("unknown", 0))
    cls_bits = 64 if _enum_name(hdr.identity_class) == "ELF64" else 32
    bits = bits or cls_bits
    if arch == "mips" and cls_bits == 64:
        bits = 64
    if arch == "riscv":
        bits = cls_bits
    endian = "big" if _enum_name(hdr.identity_data) == "MSB" else "little"
    segments = []
    for i, seg in enumerate(b.segments):
        if _enum_name(seg.type) != "LOAD":
            continue
        flags = int(seg.flags)
        segments.append(
            Segment(
                name=f"LOAD{i}",
                va=seg.virtual_address,
                vsize=seg.virtual_size,
                offset=seg.file_offset,
                fsize=seg.physical_size,
                perms=perms_text(bool(flags & 4), bool(flags & 2), bool(flags & 1)),
            )
        )
    sections = []
    for sec in b.sections:
        if not _text(sec.name) and sec.size == 0:
            continue
        flags = int(sec.flags)
        alloc = bool(flags & 0x2)
        nobits = _enum_name(sec.type) == "NOBITS"
        perms = perms_text(alloc, bool(flags & 0x1), bool(flags & 0x4))
        sections.append(
            Section(
                name=_text(sec.name),
                va=sec.virtual_address if alloc else 0,
                size=sec.size if alloc else 0,
                offset=sec.offset,
                fsize=0 if nobits else sec.size,
                perms=perms,
                kind=section_kind(perms, nobits) if alloc else "other",
            )
        )
    symbols = _elf_symbols(b)
    imports = _elf_imports(b, arch)
    exports = [
        Export(name=demangle(_text(s.name)), raw_name=_text(s.name), address=s.value)
        for s in b.exported_symbols
        if s.value
    ]
    relocations = []
    for r in b.relocations:
        symbol = r.symbol if r.has_symbol else None
        sym = (_text(symbol.name) or None) if symbol is not None else None
        relocations.append(Relocation(address=r.address, type=_enum_name(r.type), symbol=sym, addend=r.addend))
    hints: dict[str, list[int]] = {}
    hints["init_array"] = sorted({f.address for f in b.ctor_functions if f.address})
    hints["fini_array"] = sorted({f.address for f in b.dtor_functions if f.address})
    image_base = b.imagebase if segments else None  # (LIEF's is 2**64 - 1 without PT_LOAD)
    entry = hdr.entrypoint
    if is_elfv1(arch, bits, hdr.processor_flag):
        code_of = descriptors(data, sections, endian == "big")
        if code_of:  # function symbols, exports and the entry name descriptors: move them to the code
            symbols = [
                replace(s, address=code_of[s.address]) if s.kind == "function" and s.address in code_of else s
                for s in symbols
            ]
            exports = [replace(e, address=code_of.get(e.address, e.address)) for e in exports]
            entry = code_of.get(entry, entry)
            hints["opd"] = sorted(set(code_of.values()))
    ident = Identity(
        sha256=sha,
        size=len(data),
        format="ELF",
        arch=arch,
        bits=bits,
        endian=endian,
        image_base=image_base,
        entry=entry,
        file_name=file_name,
    )
    return Image(
        ident,
        data,
        segments,
        sections,
        symbols,
        imports,
        exports,
        relocations,
        function_hints=hints,
        machine_flags=hdr.processor_flag,
    )


def _elf_symbols(b: Any) -> list[Symbol]:
    out: dict[tuple[str, int], Symbol] = {}
    for source, table in (("symtab", b.symtab_symbols), ("dynsym", b.dynamic_symbols)):
        for s in table:
            if not _text(s.name) or s.value == 0 or _enum_name(s.type) in ("SECTION", "FILE"):
                continue
            if s.shndx == 0:  # undefined: an import, not a symbol of this image
                continue
            t = _enum_name(s.type)
            kind: SymbolKind = (
                "function" if t in ("FUNC", "GNU_IFUNC") else "object" if t in ("OBJECT", "TLS") else "other"
            )
            binding = {"LOCAL": "local", "WEAK": "weak"}.get(_enum_name(s.binding), "global")
            key = (s.name, s.value)
            if key in out:
                continue
            out[key] = Symbol(demangle(_text(s.name)), _text(s.name), s.value, s.size, kind, binding, source)
    return sorted(out.values(), key=lambda s: (s.address, _text(s.name)))


def _name_text(obj: Any) -> str | None:
    """`obj.name` as text (None when it is not UTF-8: some of LIEF's getters raise then)."""
    try:
        return _text(obj.name)
    except UnicodeDecodeError:
        return None


def _elf_library_of(b: Any) -> Callable[[Any], str | None]:
    """A function symbol -> library file, from the version needs (vna_other index), else the only DT_NEEDED."""
    try:
        libs = [_text(lib) for lib in b.libraries]
    except UnicodeDecodeError:  # (a DT_NEEDED name that is not UTF-8: LIEF's getter raises)
        libs = []
    single = libs[0] if len(libs) == 1 else None
    by_index: dict[int, str] = {}
    for req in b.symbols_version_requirement:
        name = _name_text(req)
        if not name:  # (a file name that is not UTF-8: its symbols' library stays unknown)
            continue
        for aux in req.get_auxiliary_symbols():
            by_index[aux.other] = name

    def library(sym: Any) -> str | None:
        if sym.has_version:
            hit = by_index.get(sym.symbol_version.value)
            if hit is not None:
                return hit
        return single

    return library


def _elf_imports(b: Any, arch: str) -> list[Import]:
    library = _elf_library_of(b)
    out = []
    seen = set()
    for r in b.pltgot_relocations:
        if not r.has_symbol or not _text(r.symbol.name):
            continue
        name = _text(r.symbol.name)
        out.append(Import(demangle(name), name, library(r.symbol), slot=r.address))
        seen.add(name)
    for r in b.dynamic_relocations:
        if not r.has_symbol or not _text(r.symbol.name) or _text(r.symbol.name) in seen:
            continue
        s = r.symbol
        if s.shndx != 0:
            continue
        kind = "function" if _enum_name(s.type) == "FUNC" else "object"
        out.append(Import(demangle(_text(s.name)), _text(s.name), library(s), slot=r.address, kind=kind))
        seen.add(_text(s.name))
    if arch == "mips":
        dyn = {int(e.tag) & 0xFFFFFFFF: e.value for e in reversed(list(b.dynamic_entries))}  # (the first of a tag)
        syms = list(b.dynamic_symbols)
        rows = ((_text(s.name), int(s.type), s.shndx, s.value) for s in syms)
        ptr = 8 if _enum_name(b.header.identity_class) == "ELF64" else 4
        for index, name, slot, stub, kind in global_got_imports(dyn, rows, ptr, seen):
            out.append(Import(demangle(name), name, library(syms[index]), slot=slot, stub=stub, kind=kind))
    return out


# ------------------------------------------------------------------------------------ PE
def _parse_pe(data: bytes, sha: str, file_name: str) -> Image:
    cfg = lief.PE.ParserConfig()
    cfg.parse_exceptions = True
    cfg.parse_signature = False
    cfg.parse_rsrc = False
    b = lief.PE.parse(data, cfg)
    if b is None:
        raise BinlensError("invalid_argument", "malformed PE file: the headers could not be parsed")
    arch, bits = PE_ARCH.get(_enum_name(b.header.machine), ("unknown", 0))
    if not bits:
        bits = 64 if _enum_name(b.optional_header.magic) == "PE32_PLUS" else 32
    base = b.optional_header.imagebase
    # An address is the image base plus an RVA, in the address width of the format (PE32: 32 bits,
    # PE32+: 64): a crafted base near the top makes the sum wrap, as the processor's would.
    top = 1 << (64 if _enum_name(b.optional_header.magic) == "PE32_PLUS" else 32)

    def at(rva: int) -> int:
        return (base + rva) % top

    headers_size = b.optional_header.sizeof_headers
    segments = [Segment("HEADER", base, max(headers_size, 1), 0, min(headers_size, len(data)), "r--")]
    sections = []
    for s in b.sections:
        ch = int(s.characteristics)
        perms = perms_text(bool(ch & 0x40000000), bool(ch & 0x80000000), bool(ch & 0x20000000))
        vsize = s.virtual_size or s.size
        nobits = s.size == 0 or bool(ch & 0x80) and not ch & 0x40
        va = at(s.virtual_address)
        fsize = min(s.size, vsize, len(data) - s.offset) if s.offset < len(data) else 0  # (the file's bytes only)
        name = _text(s.name)
        sections.append(Section(name, va, vsize, s.offset, fsize, perms, section_kind(perms, nobits), name))
        segments.append(Segment(name, va, vsize, s.offset, fsize, perms))
    symbols = []
    for sym in b.symbols:
        name = _text(sym.name)
        if not name or sym.section_idx <= 0 or sym.section_idx > len(sections) or sym.is_file_record:
            continue
        kind: SymbolKind = "function" if sym.is_function else "other"
        binding = "global" if sym.is_external else "local"
        addr = (sections[sym.section_idx - 1].va + sym.value) % top
        symbols.append(Symbol(demangle(name), name, addr, 0, kind, binding, "coff"))
    imports = []
    for lib in b.imports:
        for e in lib.entries:
            name = _text(e.name) if not e.is_ordinal else f"{_text(lib.name)}#{e.ordinal}"
            imports.append(Import(demangle(name), name, _text(lib.name), slot=at(e.iat_address)))
    exports = []
    export = b.get_export() if b.has_exports else None
    if export is not None:
        for entry in export.entries:
            if entry.is_extern:
                continue
            exports.append(Export(demangle(_text(entry.name)), _text(entry.name), at(entry.address), entry.ordinal))
    relocations = []
    for rb in b.relocations:
        for reloc in rb.entries:
            relocations.append(Relocation(at(reloc.address), _enum_name(reloc.type), None))
    hints = {"pdata": sorted({at(f.rva_start) for f in b.exceptions}) if b.has_exceptions else []}
    ident = Identity(
        sha256=sha,
        size=len(data),
        format="PE",
        arch=arch,
        bits=bits,
        endian="little",
        image_base=base,
        entry=at(b.optional_header.addressof_entrypoint),
        file_name=file_name,
    )
    warnings = []
    if any(base + s.virtual_address + max(s.virtual_size, s.size) > top for s in b.sections):
        warnings.append(
            f"the image base {base:#x} puts sections past the end of the {top.bit_length() - 1}-bit address space:"
            " their addresses wrap around to 0"
        )
    img = Image(
        ident, data, segments, sections, symbols, imports, exports, relocations, function_hints=hints, warnings=warnings
    )
    try:
        img.data_ranges = pe_data_ranges(b, base, sections, img.read, bits, arch)
    except (ValueError, TypeError, AttributeError, OverflowError, struct.error) as e:  # a malformed table
        img.warnings.append(f"data in code sections not located: {type(e).__name__}")
    return img


# --------------------------------------------------------------------------------- Mach-O
def _macho_arch(b: Any) -> tuple[str, int]:
    return MACHO_ARCH.get(_enum_name(b.header.cpu_type), ("unknown", 64 if b.header.is_64bit else 32))


def _macho_config() -> Any:
    """LIEF's quick parse plus the bind opcodes of `LC_DYLD_INFO(_ONLY)` (the imports of a file
    without chained fixups) and the export trie (its exports; no measurable cost on the corpus);
    rebase opcodes, which binlens does not read, stay unparsed."""
    cfg = lief.MachO.ParserConfig()
    cfg.parse_dyld_bindings = True
    cfg.parse_dyld_exports = True
    cfg.parse_dyld_rebases = False
    cfg.fix_from_memory = False
    return cfg


def _parse_macho(data: bytes, sha: str, file_name: str, slice_name: str | None) -> Image:
    fat = lief.MachO.parse(data, _macho_config())
    if fat is None or fat.size == 0:
        raise BinlensError("invalid_argument", "malformed Mach-O file: no slice could be parsed")
    binaries = list(fat)
    archs = [_macho_arch(b)[0] for b in binaries]
    slices = slice_names(
        [(a, int(b.header.cpu_type), b.header.cpu_subtype) for a, b in zip(archs, binaries, strict=True)]
    )
    index = pick_slice(slices, archs, slice_name)
    b = binaries[index]
    arch, bits = _macho_arch(b)
    endian = "big" if arch == "ppc" else "little"
    # LIEF's file offsets count from the slice's start; the Image keeps the whole file's bytes
    base = b.fat_offset
    end = base + fat_ranges(data).get(base, len(data) - base) if base else len(data)
    segments, sections = [], []
    for s in b.segments:
        p = int(s.init_protection)
        perms = perms_text(bool(p & 1), bool(p & 2), bool(p & 4))
        if s.virtual_size:
            offset, fsize = _in_slice(base, end, s.file_offset, s.file_size)
            segments.append(Segment(_text(s.name), s.virtual_address, s.virtual_size, offset, fsize, perms))
        for sec in s.sections:
            nobits = _enum_name(sec.type) in ("ZEROFILL", "GB_ZEROFILL", "THREAD_LOCAL_ZEROFILL")
            offset, fsize = _in_slice(base, end, sec.offset, 0 if nobits else sec.size)
            sections.append(
                Section(
                    f"{_text(s.name)},{_text(sec.name)}",
                    sec.virtual_address,
                    sec.size,
                    offset,
                    fsize,
                    perms,
                    section_kind(perms, nobits),
                    _text(s.name),
                )
            )
    function_starts = b.function_starts if b.has_function_starts else None
    fs = function_starts.functions if function_starts is not None else []
    starts = {b.imagebase + f for f in fs}
    symbols = []
    external: list[Export] = []
    thumb: set[int] = set()
    for sym in b.symbols:
        raw = _text(sym.name)
        t = sym.raw_type
        if not raw or sym.value == 0 or t & 0xE0 or (t & 0x0E) != 0x0E:  # stabs; not N_SECT
            continue
        name = raw[1:] if raw.startswith("_") else raw
        binding = "global" if t & 0x01 else "local"
        kind: SymbolKind = "function" if sym.value in starts else "other"
        symbols.append(Symbol(demangle(name), raw, sym.value, 0, kind, binding, "macho"))
        if t & 0x01 and not t & 0x10:  # N_EXT without N_PEXT: what a file without a trie exports
            external.append(Export(demangle(name), raw, sym.value))
        if sym.description & N_ARM_THUMB_DEF and arch == "arm":
            thumb.add(sym.value)
    imports = _macho_imports(b)
    exports = []
    for exp in b.exported_symbols:  # the export trie's (LC_DYLD_INFO or LC_DYLD_EXPORTS_TRIE)
        name = _text(exp.name)[1:] if _text(exp.name).startswith("_") else _text(exp.name)
        exports.append(Export(demangle(name), _text(exp.name), exp.value))
    if not exports and not (b.has_dyld_info or b.has_dyld_exports_trie):
        exports = external  # no export trie (an old or object-like file)
    hints = {"function_starts": sorted(starts)}
    if thumb:
        hints["thumb"] = sorted(thumb)
    entry = b.entrypoint if b.has_entrypoint or b.has_main_command or b.has_thread_command else 0
    ident = Identity(
        sha256=sha,
        size=len(data),
        format="MachO",
        arch=arch,
        bits=bits,
        endian=endian,
        image_base=b.imagebase,
        entry=entry,
        file_name=file_name,
        slice=slices[index] if fat.size > 1 else None,
    )
    return Image(ident, data, segments, sections, symbols, imports, exports, [], slices=slices, function_hints=hints)


def _macho_imports(b: Any) -> list[Import]:
    """One import per bound slot: chained-fixup binds, or the bind, lazy-bind and weak-bind
    opcodes of `LC_DYLD_INFO(_ONLY)`; each with the stub that jumps through its slot."""
    stubs = _macho_stubs(b)
    imports = []
    for bi in b.bindings:
        if not bi.has_symbol:
            continue
        raw = _text(bi.symbol.name)
        name = raw[1:] if raw.startswith("_") else raw
        lib = _library_name(bi.library) if bi.has_library else None
        imports.append(Import(demangle(name), raw, lib, slot=bi.address, stub=stubs.get(bi.address)))
    return imports


def _library_name(lib: Any) -> str:
    """A dylib load command's path; read from the command's bytes when it is not UTF-8 (LIEF
    raises on such a path rather than handing back bytes)."""
    try:
        return _text(lib.name)
    except UnicodeDecodeError:
        raw = bytes(lib.data)[lib.name_offset :]
        return _text(raw.split(b"\0", 1)[0])


def _macho_stubs(b: Any) -> dict[int, int]:
    """Import slot -> its stub, from the indirect symbol table ({} where LIEF read only part of it)."""
    if not b.has_dynamic_symbol_command:
        return {}
    table = b.dynamic_symbol_command
    indirect = list(table.indirect_symbols)
    if not indirect or len(indirect) != table.nb_indirect_symbols:
        return {}
    names = [_text(s.name) for s in indirect]
    sections = [IndirectSection(int(s.type), s.reserved1, s.reserved2, s.virtual_address, s.size) for s in b.sections]
    return stubs_by_slot(sections, names, 8 if b.header.is_64bit else 4)


def _in_slice(base: int, end: int, offset: int, size: int) -> tuple[int, int]:
    """(file offset, bytes in the file) of a range at `offset` in the slice at `base`, cut at the
    slice's end `end` (a thin file is one slice at 0)."""
    start = base + offset
    return start, max(0, min(size, end - start))


def parse_path(path: str, slice_name: str | None = None) -> Image:
    """Read (`input_file.read_input`) and parse a file (used by tests and tools that run in-process)."""
    from binlens.loader.input_file import read_input

    opened = read_input(path)
    return parse_image(opened.data, os.path.basename(path), slice_name)
