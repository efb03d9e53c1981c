"""A pure-Python reader for plain ELF executables and shared objects.

Importing LIEF costs ~0.6 s, more than the whole analysis of a small program. Most inputs are
ordinary ELF files of the machines in `elf_machines.MACHINES` (x86, x86-64, AArch64, ARM, MIPS32,
PowerPC, PPC64 ELFv2, RISC-V; little- or big-endian), whose headers this module reads with
`struct` into the very Image LIEF's path builds (`parse_lief._parse_elf`; the tests and
`bench/elf_readers.py` compare the two field by field). Anything it does not fully understand -
another machine, MIPS64, PPC64 ELFv1, a relocatable object, a header or table out of the file's
bounds, an unknown relocation type - raises `NeedsLief`, and the worker hands the file to LIEF
instead. Every loop is bounded by the file's size, so a hostile file cannot hang it; it still runs
in the worker's forked child.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from binlens.loader.demangle import demangle
from binlens.loader.digest import sha256_hex
from binlens.loader.elf_machines import Machine, fast_machine
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
from binlens.loader.mips_got import global_got_imports


class NeedsLief(Exception):
    """The file is outside this reader's plain subset; parse it with LIEF."""


# Dynamic tags.
DT_NEEDED, DT_PLTRELSZ, DT_STRTAB, DT_SYMTAB, DT_RELA, DT_RELASZ = 1, 2, 5, 6, 7, 8
DT_STRSZ, DT_INIT, DT_FINI, DT_REL, DT_RELSZ, DT_PLTREL, DT_JMPREL = 10, 12, 13, 17, 18, 20, 23
DT_INIT_ARRAY, DT_FINI_ARRAY, DT_INIT_ARRAYSZ, DT_FINI_ARRAYSZ = 25, 26, 27, 28
DT_PREINIT_ARRAY, DT_PREINIT_ARRAYSZ, DT_RELRSZ, DT_RELR = 32, 33, 35, 36
DT_VERSYM, DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFF0, 0x6FFFFFFE, 0x6FFFFFFF
_UNSUPPORTED_TAGS = {0x6000000F, 0x60000010, 0x60000011, 0x60000012}  # Android's packed relocations

SHT_SYMTAB, SHT_NOBITS, SHT_DYNSYM = 2, 8, 11
SYM_KIND: dict[int, SymbolKind] = {2: "function", 10: "function", 1: "object", 6: "object"}
SYM_BINDING = {0: "local", 2: "weak"}


class _Reader:
    """Bounds-checked access to the file (in its byte order) and its mapped addresses."""

    def __init__(self, data: bytes, is64: bool, big: bool) -> None:
        self.data = data
        self.is64 = is64
        self.ptr = 8 if is64 else 4
        self.order = ">" if big else "<"
        self.loads: list[tuple[int, int, int]] = []  # (vaddr, filesz, offset)
        self._structs: dict[str, struct.Struct] = {}

    def st(self, fmt: str) -> struct.Struct:
        """The struct for `fmt` in the file's byte order."""
        found = self._structs.get(fmt)
        if found is None:
            found = self._structs[fmt] = struct.Struct(self.order + fmt)
        return found

    def need(self, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > len(self.data):
            raise NeedsLief("a table lies outside the file")

    def unpack(self, fmt: struct.Struct, offset: int) -> tuple[Any, ...]:
        self.need(offset, fmt.size)
        return fmt.unpack_from(self.data, offset)

    def table(self, fmt: struct.Struct, offset: int, count: int) -> list[tuple[Any, ...]]:
        self.need(offset, fmt.size * count)
        return list(fmt.iter_unpack(self.data[offset : offset + fmt.size * count]))

    def cstr(self, offset: int, limit: int | None = None) -> str:
        if not 0 <= offset < len(self.data):
            raise NeedsLief("a name lies outside the file")
        end = self.data.find(b"\0", offset, limit)
        if end < 0:
            raise NeedsLief("an unterminated name")
        return self.data[offset:end].decode("utf-8", "backslashreplace")

    def va_offset(self, va: int, size: int = 1) -> int:
        for vaddr, filesz, off in self.loads:
            if vaddr <= va and va + size <= vaddr + filesz:
                return off + (va - vaddr)
        raise NeedsLief("a dynamic table is not backed by file bytes")


def _header(data: bytes) -> tuple[_Reader, Machine, tuple[int, ...]]:
    """The reader, the machine and the header fields after e_ident, for a file the fast reader takes."""
    if len(data) < 52 or data[:4] != b"\x7fELF" or data[5] not in (1, 2) or data[4] not in (1, 2):
        raise NeedsLief("not an ELF file of a known class and byte order")
    is64 = data[4] == 2
    rd = _Reader(data, is64, big=data[5] == 2)
    hdr = rd.unpack(rd.st("HHIQQQIHHHHHH" if is64 else "HHIIIIIHHHHHH"), 16)
    e_type, machine_id, _ver, _entry, _phoff, _shoff, flags, _eh, phentsize, phnum, shentsize, shnum, shstrndx = hdr
    machine = fast_machine(machine_id, 64 if is64 else 32)
    if machine is None or e_type not in (2, 3):
        raise NeedsLief("not an executable or shared object of a machine the fast reader knows")
    if machine_id == 21 and flags & 3 != 2:
        raise NeedsLief("a PowerPC64 ELFv1 file (function descriptors)")
    if phentsize != (56 if is64 else 32) or shentsize != (64 if is64 else 40):
        raise NeedsLief("unusual header sizes")
    if not 0 < shnum < 0xFF00 or not 0 < shstrndx < shnum or phnum >= 0xFFFF:
        raise NeedsLief("no ordinary section table")
    return rd, machine, hdr


def parse_elf(data: bytes, file_name: str, sha256: str | None = None) -> Image:
    """Parse a plain ELF executable or shared object of a machine in `elf_machines.MACHINES`
    (either class, either byte order); raise NeedsLief for anything LIEF must read instead."""
    rd, machine, hdr = _header(data)
    _t, _m, _v, entry, phoff, shoff, flags, _eh, _phs, phnum, _shs, shnum, shstrndx = hdr
    is64 = rd.is64
    phdrs = _program_headers(rd, phoff, phnum)
    segments = _segments(phdrs)
    shdrs = rd.table(rd.st("IIQQQQIIQQ" if is64 else "IIIIIIIIII"), shoff, shnum)
    sections = _sections(rd, shdrs, shstrndx)
    dyn = _dynamic(rd, phdrs)
    if any(sh[1] in (4, 9) and (not dyn or not sh[2] & 0x2) for sh in shdrs):
        raise NeedsLief("relocation sections outside the dynamic table")
    _check_section_mapping(rd, shdrs)
    if sum(sh[1] == SHT_SYMTAB for sh in shdrs) > 1 or sum(sh[1] == SHT_DYNSYM for sh in shdrs) > 1:
        raise NeedsLief("more than one symbol table of a kind")  # also bounds the work on crafted files
    symtab = _raw_symbols(rd, shdrs, SHT_SYMTAB)
    dynsyms = _dynsyms(rd, shdrs, dyn)
    symbols = _symbols(symtab, dynsyms)
    relocs = _relocations(rd, dyn, dynsyms, machine)
    imports = _imports(rd, dyn, dynsyms, relocs)
    if machine.arch == "mips":
        imports += _mips_got_imports(rd, dyn, dynsyms, imports)
    exports = [Export(demangle(s[0]), s[0], s[4]) for s in (*dynsyms, *symtab) if s[4] and _is_exported(s)]
    hints = {
        "init_array": _array_functions(
            rd, dyn, (DT_INIT_ARRAY, DT_INIT_ARRAYSZ), (DT_PREINIT_ARRAY, DT_PREINIT_ARRAYSZ), DT_INIT
        ),
        "fini_array": _array_functions(rd, dyn, (DT_FINI_ARRAY, DT_FINI_ARRAYSZ), None, DT_FINI),
    }
    loads = [p for p in phdrs if p[0] == 1]
    image_base = min(((p[2] - p[1]) & 0xFFFFFFFFFFFFFFFF for p in loads), default=None)  # as LIEF: in uint64
    ident = Identity(
        sha256=sha256 or sha256_hex(data),
        size=len(data),
        format="ELF",
        arch=machine.arch,
        bits=machine.bits or (64 if is64 else 32),
        endian="big" if rd.order == ">" else "little",
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
        [Import(*i) for i in imports],
        exports,
        [Relocation(a, t, s, n) for a, t, s, n, _i, _p in relocs],
        function_hints=hints,
        machine_flags=flags,
    )


def _program_headers(rd: _Reader, phoff: int, phnum: int) -> list[tuple[int, int, int, int, int, int]]:
    """(type, offset, vaddr, filesz, memsz, flags) of every program header."""
    if rd.is64:
        raw = rd.table(rd.st("IIQQQQQQ"), phoff, phnum)
        out = [(t, off, va, fsz, msz, fl) for t, fl, off, va, _pa, fsz, msz, _al in raw]
    else:
        raw = rd.table(rd.st("IIIIIIII"), phoff, phnum)
        out = [(t, off, va, fsz, msz, fl) for t, off, va, _pa, fsz, msz, fl, _al in raw]
    for t, off, va, fsz, _msz, _fl in out:
        if t == 1:
            rd.need(off, fsz)
            rd.loads.append((va, fsz, off))
    return out


def _segments(phdrs: list[tuple[int, int, int, int, int, int]]) -> list[Segment]:
    return [
        Segment(f"LOAD{i}", va, msz, off, fsz, perms_text(bool(fl & 4), bool(fl & 2), bool(fl & 1)))
        for i, (t, off, va, fsz, msz, fl) in enumerate(phdrs)
        if t == 1
    ]


def _sections(rd: _Reader, shdrs: list[tuple[Any, ...]], shstrndx: int) -> list[Section]:
    strtab = shdrs[shstrndx]
    rd.need(strtab[4], strtab[5])
    str_end = strtab[4] + strtab[5]
    out = []
    for name_off, stype, flags, addr, offset, size, *_rest in shdrs:
        if name_off >= strtab[5]:
            raise NeedsLief("a section name lies outside the string table")
        name = rd.cstr(strtab[4] + name_off, str_end)
        nobits = stype == SHT_NOBITS
        if not nobits:
            rd.need(offset, size)
        if not name and size == 0:
            continue
        alloc = bool(flags & 0x2)
        perms = perms_text(alloc, bool(flags & 0x1), bool(flags & 0x4))
        kind = section_kind(perms, nobits) if alloc else "other"
        out.append(
            Section(name, addr if alloc else 0, size if alloc else 0, offset, 0 if nobits else size, perms, kind)
        )
    return out


def _check_section_mapping(rd: _Reader, shdrs: list[tuple[Any, ...]]) -> None:
    """Sections and segments must agree on where allocated bytes live (crafted files make them differ)."""
    for _n, stype, flags, addr, offset, size, *_rest in shdrs:
        if not flags & 0x2 or stype == SHT_NOBITS or not size:
            continue
        for vaddr, filesz, off in rd.loads:
            if vaddr <= addr < vaddr + filesz and off + (addr - vaddr) != offset:
                raise NeedsLief("a section's address and file offset disagree with the segments")


def _raw_symbols(rd: _Reader, shdrs: list[tuple[Any, ...]], stype: int) -> list[tuple[str, int, int, int, int, int]]:
    """(name, type, binding, shndx, value, size) of the symbols of the table section of type `stype`."""
    out: list[tuple[str, int, int, int, int, int]] = []
    for sh in shdrs:
        if sh[1] != stype:
            continue
        if sh[6] >= len(shdrs):
            raise NeedsLief("a symbol table links to no string table")
        strtab = shdrs[sh[6]]
        rd.need(strtab[4], strtab[5])
        base, end = strtab[4], strtab[4] + strtab[5]
        size = 24 if rd.is64 else 16
        if sh[9] not in (0, size) or sh[5] % size:
            raise NeedsLief("unusual symbol entry size")
        if rd.is64:
            rows = ((n, i, sx, v, sz) for n, i, _o, sx, v, sz in rd.table(rd.st("IBBHQQ"), sh[4], sh[5] // size))
        else:
            rows = ((n, i, sx, v, sz) for n, v, sz, i, _o, sx in rd.table(rd.st("IIIBBH"), sh[4], sh[5] // size))
        names: dict[int, str] = {}
        for n, info, shndx, value, sz in rows:
            name = names.get(n)
            if name is None:
                if n >= strtab[5]:
                    raise NeedsLief("a symbol name lies outside the string table")
                name = names[n] = rd.cstr(base + n, end)
            out.append((name, info & 0xF, info >> 4, shndx, value, sz))
    return out


RawSymbol = tuple[str, int, int, int, int, int]  # name, type, binding, shndx, value, size


def _symbols(symtab: list[RawSymbol], dynsym: list[RawSymbol]) -> list[Symbol]:
    out: dict[tuple[str, int], Symbol] = {}
    for source, table in (("symtab", symtab), ("dynsym", dynsym)):
        for name, typ, bind, shndx, value, size in table:
            if not name or value == 0 or typ in (3, 4) or shndx == 0:
                continue
            key = (name, value)
            if key not in out:
                kind = SYM_KIND.get(typ, "other")
                out[key] = Symbol(demangle(name), name, value, size, kind, SYM_BINDING.get(bind, "global"), source)
    return sorted(out.values(), key=lambda s: (s.address, s.name))


def _is_exported(s: tuple[str, int, int, int, int, int]) -> bool:
    _name, typ, bind, shndx, value, size = s
    return shndx != 0 and (value != 0 or size > 0) and bind in (1, 2) and typ in (1, 2, 10)


def _dynamic(rd: _Reader, phdrs: list[tuple[int, int, int, int, int, int]]) -> dict[int, list[int]]:
    """The dynamic table: tag -> values (in order), up to DT_NULL."""
    dyn: dict[int, list[int]] = {}
    for t, off, _va, fsz, _msz, _fl in phdrs:
        if t != 2:
            continue
        fmt = rd.st("qQ" if rd.is64 else "iI")
        for tag, val in rd.table(fmt, off, fsz // fmt.size):
            if tag == 0:
                break
            if tag in _UNSUPPORTED_TAGS:
                raise NeedsLief("packed relocations")
            dyn.setdefault(tag, []).append(val)
        break
    return dyn


def _dynsyms(
    rd: _Reader, shdrs: list[tuple[Any, ...]], dyn: dict[int, list[int]]
) -> list[tuple[str, int, int, int, int, int]]:
    syms = _raw_symbols(rd, shdrs, SHT_DYNSYM)
    dynsym = [sh for sh in shdrs if sh[1] == SHT_DYNSYM]
    if DT_SYMTAB in dyn and (len(dynsym) != 1 or dynsym[0][3] != dyn[DT_SYMTAB][0]):
        raise NeedsLief("DT_SYMTAB and the .dynsym section disagree")
    if DT_SYMTAB not in dyn and dynsym:
        raise NeedsLief("a .dynsym section without a dynamic table")
    if dynsym:  # the loader reads names through DT_SYMTAB and DT_STRTAB: the sections must be the same bytes
        strtab = shdrs[dynsym[0][6]]
        if (
            dyn.get(DT_STRTAB, [None])[0] != strtab[3]
            or rd.va_offset(dynsym[0][3], dynsym[0][5]) != dynsym[0][4]
            or rd.va_offset(strtab[3], strtab[5]) != strtab[4]
        ):
            raise NeedsLief("the dynamic tables and the sections disagree")
    return syms


def _rel_table(
    rd: _Reader, dyn: dict[int, list[int]], addr_tag: int, size_tag: int, rela: bool
) -> list[tuple[int, int, int]]:
    """(offset, info, addend) of one relocation table named by dynamic tags."""
    if addr_tag not in dyn:
        return []
    size = dyn.get(size_tag, [0])[0]
    fmt = rd.st(("QQq" if rela else "QQ") if rd.is64 else ("IIi" if rela else "II"))
    if size % fmt.size:
        raise NeedsLief("a relocation table of an odd size")
    if size == 0:
        return []
    rows = rd.table(fmt, rd.va_offset(dyn[addr_tag][0], size), size // fmt.size)
    return [(r[0], r[1], r[2] if rela else 0) for r in rows]


def _relocations(
    rd: _Reader, dyn: dict[int, list[int]], dynsyms: list[tuple[Any, ...]], machine: Machine
) -> list[tuple[int, str, str | None, int, int, bool]]:
    """(address, type, symbol name, addend, symbol index, is_plt) for the dynamic, then the PLT relocations."""
    shift, mask = (32, 0xFFFFFFFF) if rd.is64 else (8, 0xFF)
    plt_rela = dyn.get(DT_PLTREL, [DT_RELA])[0] == DT_RELA
    relr = _relr(rd, dyn)
    relative = next((n for n, name in machine.relocs.items() if name.endswith("_RELATIVE")), None)
    if relr and relative is None:
        raise NeedsLief("a DT_RELR table on a machine without a RELATIVE type")
    tables = [
        (_rel_table(rd, dyn, DT_RELA, DT_RELASZ, True), False),
        (_rel_table(rd, dyn, DT_REL, DT_RELSZ, False), False),
        ([(va, relative, 0) for va in relr] if relative is not None else [], False),
        (_rel_table(rd, dyn, DT_JMPREL, DT_PLTRELSZ, plt_rela), True),
    ]
    out = []
    for rows, is_plt in tables:
        for offset, info, addend in rows:
            kind = machine.reloc_name(info & mask)
            if kind is None:
                raise NeedsLief("an unknown relocation type")
            index = info >> shift
            if index >= len(dynsyms):
                raise NeedsLief("a relocation names a symbol past the table")
            name = dynsyms[index][0] if index else ""
            out.append((offset, kind, name or None, addend, index, is_plt))
    return out


def _relr(rd: _Reader, dyn: dict[int, list[int]]) -> list[int]:
    """The addresses a DT_RELR table relocates (an address, then bitmaps of the words after it)."""
    if DT_RELR not in dyn:
        return []
    size = dyn.get(DT_RELRSZ, [0])[0]
    n = size // rd.ptr
    if not n:
        return []
    fmt = rd.st(f"{n}{'Q' if rd.is64 else 'I'}")
    out: list[int] = []
    where = 0
    for entry in rd.unpack(fmt, rd.va_offset(dyn[DT_RELR][0], fmt.size)):
        if not entry & 1:
            out.append(entry)
            where = entry + rd.ptr
            continue
        bitmap, i = entry >> 1, 0
        while bitmap:
            if bitmap & 1:
                out.append(where + i * rd.ptr)
            bitmap >>= 1
            i += 1
        where += (8 * rd.ptr - 1) * rd.ptr
    return out


def _libraries(rd: _Reader, dyn: dict[int, list[int]], nsyms: int) -> Callable[[int], str | None]:
    """Symbol index -> library file, from the version needs (vna_other), else the only DT_NEEDED."""
    if DT_STRTAB not in dyn:
        return lambda _index: None
    strtab = rd.va_offset(dyn[DT_STRTAB][0], dyn.get(DT_STRSZ, [1])[0])
    str_end = strtab + dyn.get(DT_STRSZ, [1])[0]
    needed = [rd.cstr(strtab + v, str_end) for v in dyn.get(DT_NEEDED, [])]
    single = needed[0] if len(needed) == 1 else None
    by_index: dict[int, str] = {}
    if DT_VERNEED in dyn:
        off = rd.va_offset(dyn[DT_VERNEED][0], 16)
        vn = rd.st("HHIII")
        vna = rd.st("IHHII")
        for _ in range(min(dyn.get(DT_VERNEEDNUM, [0])[0], len(rd.data) // 16)):
            _v, cnt, file_off, aux, nxt = rd.unpack(vn, off)
            lib = rd.cstr(strtab + file_off, str_end)
            a = off + aux
            for _ in range(min(cnt, len(rd.data) // 16)):
                _h, _f, other, _n, anext = rd.unpack(vna, a)
                by_index[other] = lib
                if not anext:
                    break
                a += anext
            if not nxt:
                break
            off += nxt
    versym: tuple[int, ...] = ()
    if DT_VERSYM in dyn and nsyms:
        vs = rd.st(f"{nsyms}H")
        versym = rd.unpack(vs, rd.va_offset(dyn[DT_VERSYM][0], vs.size))

    def library(index: int) -> str | None:
        if versym:
            hit = by_index.get(versym[index])
            if hit is not None:
                return hit
        return single

    return library


RawImport = tuple[str, str, str | None, int, int | None, str]  # the fields of an Import


def _imports(
    rd: _Reader, dyn: dict[int, list[int]], dynsyms: list[tuple[Any, ...]], relocs: list[tuple[Any, ...]]
) -> list[RawImport]:
    library = _libraries(rd, dyn, len(dynsyms))
    out: list[RawImport] = []
    seen = set()
    for address, _t, name, _a, index, is_plt in relocs:
        if is_plt and name:
            out.append((demangle(name), name, library(index), address, None, "function"))
            seen.add(name)
    for address, _t, name, _a, index, is_plt in relocs:
        if is_plt or not name or name in seen or dynsyms[index][3] != 0:
            continue
        kind = "function" if dynsyms[index][1] == 2 else "object"
        out.append((demangle(name), name, library(index), address, None, kind))
        seen.add(name)
    return out


def _mips_got_imports(
    rd: _Reader, dyn: dict[int, list[int]], dynsyms: list[RawSymbol], known: list[RawImport]
) -> list[RawImport]:
    """The imports bound through MIPS's global GOT entries (`mips_got`), beside those of relocations."""
    library = _libraries(rd, dyn, len(dynsyms))
    first = {tag: values[0] for tag, values in dyn.items()}
    rows = ((name, typ, shndx, value) for name, typ, _b, shndx, value, _s in dynsyms)
    return [
        (demangle(name), name, library(index), slot, stub, kind)
        for index, name, slot, stub, kind in global_got_imports(first, rows, rd.ptr, {k[1] for k in known})
    ]


def _array_functions(
    rd: _Reader, dyn: dict[int, list[int]], array: tuple[int, int], pre: tuple[int, int] | None, single: int
) -> list[int]:
    """Sorted distinct non-zero addresses in DT_*_ARRAY (and DT_PREINIT_ARRAY) plus DT_INIT/DT_FINI."""
    found: set[int] = set()
    for tags in (array, pre):
        if tags is None or tags[0] not in dyn:
            continue
        size = dyn.get(tags[1], [0])[0]
        n = size // rd.ptr
        if n:
            fmt = rd.st(f"{n}{'Q' if rd.is64 else 'I'}")
            found.update(rd.unpack(fmt, rd.va_offset(dyn[tags[0]][0], fmt.size)))
    found.update(dyn.get(single, []))
    found.discard(0)
    found.discard((1 << (8 * rd.ptr)) - 1)  # the -1 sentinel of old .ctors lists, as LIEF skips it
    return sorted(found)
