"""Format-aware mutations of executables for the mutation fuzzer (`fuzz.py`).

`mutate(data, seed, index)` corrupts one source file the way a hostile or broken toolchain would:
header fields (ELF file/program/section headers; PE DOS, COFF and optional headers, data
directories and the section table; Mach-O headers, load commands with their segment and section
fields; the fat arch table of a universal file and the Mach-O header of one of its slices),
truncations, and byte flips inside the header region. The magic number is never touched, so a
mutant is still recognised as its source's format and reaches the format's own parser.

Everything is drawn from `random.Random(f"{seed}:{index}")`: mutant `index` of `seed` is always
the same bytes for the same source. Each mutation is described in words (`Mutant.ops`), so a
failing mutant can be read without a hex editor.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

FORMATS = ("elf", "pe", "macho", "fat")

_ELF_MAGIC = b"\x7fELF"
_MACHO_MAGICS = {
    b"\xfe\xed\xfa\xce": (">", 32),
    b"\xce\xfa\xed\xfe": ("<", 32),
    b"\xfe\xed\xfa\xcf": (">", 64),
    b"\xcf\xfa\xed\xfe": ("<", 64),
}
_FAT_MAGICS = {b"\xca\xfe\xba\xbe": 32, b"\xca\xfe\xba\xbf": 64}
_MAX_FAT_ARCHS = 30  # above this `cafebabe` is a Java class file (its version sits where nfat_arch is)


def detect_format(data: bytes) -> str | None:
    """'elf', 'pe', 'macho', 'fat', or None: what `data`'s magic says it is."""
    if data[:4] == _ELF_MAGIC and len(data) >= 20:
        return "elf"
    if data[:2] == b"MZ" and len(data) >= 0x40:
        (lfanew,) = struct.unpack_from("<I", data, 0x3C)
        if lfanew + 4 <= len(data) and data[lfanew : lfanew + 4] == b"PE\0\0":
            return "pe"
        return None
    if data[:4] in _MACHO_MAGICS and len(data) >= 28:
        return "macho"
    if data[:4] in _FAT_MAGICS and len(data) >= 8:
        (n,) = struct.unpack_from(">I", data, 4)
        return "fat" if 0 < n <= _MAX_FAT_ARCHS else None
    return None


@dataclass
class Field:
    """One integer field of a header: where it is, how wide, in which byte order, and its name."""

    offset: int
    size: int  # 1, 2, 4 or 8 bytes
    order: str  # '<' or '>'
    name: str


@dataclass
class Layout:
    """What a mutator may touch in one file: its header fields and where its headers end."""

    fields: list[Field] = field(default_factory=list)
    header_end: int = 0  # byte flips stay below this (and above the magic)
    magic_len: int = 4
    tables: list[int] = field(default_factory=list)  # ends of header tables: cutting just there is telling


@dataclass
class Mutant:
    """A mutated file and the mutations that made it, in words."""

    data: bytes
    ops: list[str]


_FMT = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _u(data: bytes, off: int, size: int, order: str) -> int | None:
    if off < 0 or off + size > len(data):
        return None
    return int(struct.unpack_from(order + _FMT[size], data, off)[0])


def _add(out: Layout, data: bytes, off: int, size: int, order: str, name: str) -> None:
    if off >= 0 and off + size <= len(data):
        out.fields.append(Field(off, size, order, name))


# ---------------------------------------------------------------------------------------- ELF
_ELF_EHDR = {  # name: (offset 32, size 32, offset 64, size 64)
    "e_type": (16, 2, 16, 2),
    "e_machine": (18, 2, 18, 2),
    "e_version": (20, 4, 20, 4),
    "e_entry": (24, 4, 24, 8),
    "e_phoff": (28, 4, 32, 8),
    "e_shoff": (32, 4, 40, 8),
    "e_flags": (36, 4, 48, 4),
    "e_ehsize": (40, 2, 52, 2),
    "e_phentsize": (42, 2, 54, 2),
    "e_phnum": (44, 2, 56, 2),
    "e_shentsize": (46, 2, 58, 2),
    "e_shnum": (48, 2, 60, 2),
    "e_shstrndx": (50, 2, 62, 2),
}
_ELF_PHDR32 = (("p_type", 0, 4), ("p_offset", 4, 4), ("p_vaddr", 8, 4), ("p_paddr", 12, 4),
               ("p_filesz", 16, 4), ("p_memsz", 20, 4), ("p_flags", 24, 4), ("p_align", 28, 4))  # fmt: skip
_ELF_PHDR64 = (("p_type", 0, 4), ("p_flags", 4, 4), ("p_offset", 8, 8), ("p_vaddr", 16, 8),
               ("p_paddr", 24, 8), ("p_filesz", 32, 8), ("p_memsz", 40, 8), ("p_align", 48, 8))  # fmt: skip
_ELF_SHDR32 = (("sh_name", 0, 4), ("sh_type", 4, 4), ("sh_flags", 8, 4), ("sh_addr", 12, 4),
               ("sh_offset", 16, 4), ("sh_size", 20, 4), ("sh_link", 24, 4), ("sh_info", 28, 4),
               ("sh_addralign", 32, 4), ("sh_entsize", 36, 4))  # fmt: skip
_ELF_SHDR64 = (("sh_name", 0, 4), ("sh_type", 4, 4), ("sh_flags", 8, 8), ("sh_addr", 16, 8),
               ("sh_offset", 24, 8), ("sh_size", 32, 8), ("sh_link", 40, 4), ("sh_info", 44, 4),
               ("sh_addralign", 48, 8), ("sh_entsize", 56, 8))  # fmt: skip
_MAX_ENTRIES = 512  # table entries offered to the mutator (the rest of a huge table adds nothing)


def elf_layout(data: bytes) -> Layout:
    """The ELF header, program header table and section header table fields of `data`."""
    is64 = data[4] == 2
    order = ">" if data[5] == 2 else "<"
    out = Layout(magic_len=4)
    for name, (o32, s32, o64, s64) in _ELF_EHDR.items():
        _add(out, data, o64 if is64 else o32, s64 if is64 else s32, order, name)
    out.fields.append(Field(4, 1, order, "e_ident[EI_CLASS]"))
    out.fields.append(Field(5, 1, order, "e_ident[EI_DATA]"))
    out.fields.append(Field(7, 1, order, "e_ident[EI_OSABI]"))
    ehsize = 64 if is64 else 52
    out.header_end = min(len(data), ehsize)
    get = {name: _u(data, o64 if is64 else o32, s64 if is64 else s32, order) for name, (o32, s32, o64, s64) in
           _ELF_EHDR.items()}  # fmt: skip
    for table, entsize_default, layout, prefix in (
        ("ph", 56 if is64 else 32, _ELF_PHDR64 if is64 else _ELF_PHDR32, "phdr"),
        ("sh", 64 if is64 else 40, _ELF_SHDR64 if is64 else _ELF_SHDR32, "shdr"),
    ):
        off, num, ent = get[f"e_{table}off"], get[f"e_{table}num"], get[f"e_{table}entsize"]
        if not off or not num or off >= len(data):
            continue
        ent = ent if ent and ent >= entsize_default else entsize_default
        for i in range(min(num, _MAX_ENTRIES)):
            base = off + i * ent
            if base + entsize_default > len(data):
                break
            for name, rel, size in layout:
                _add(out, data, base + rel, size, order, f"{prefix}[{i}].{name}")
        end = min(len(data), off + num * ent)
        out.tables.append(end)
        out.header_end = max(out.header_end, end)
    return out


# ----------------------------------------------------------------------------------------- PE
_COFF = (("Machine", 0, 2), ("NumberOfSections", 2, 2), ("TimeDateStamp", 4, 4),
         ("PointerToSymbolTable", 8, 4), ("NumberOfSymbols", 12, 4), ("SizeOfOptionalHeader", 16, 2),
         ("Characteristics", 18, 2))  # fmt: skip
_OPT_COMMON = (("Magic", 0, 2), ("SizeOfCode", 4, 4), ("SizeOfInitializedData", 8, 4),
               ("AddressOfEntryPoint", 16, 4), ("BaseOfCode", 20, 4), ("SectionAlignment", 32, 4),
               ("FileAlignment", 36, 4), ("SizeOfImage", 56, 4), ("SizeOfHeaders", 60, 4),
               ("Subsystem", 68, 2), ("DllCharacteristics", 70, 2))  # fmt: skip
_OPT32 = (("BaseOfData", 24, 4), ("ImageBase", 28, 4), ("NumberOfRvaAndSizes", 92, 4))
_OPT64 = (("ImageBase", 24, 8), ("NumberOfRvaAndSizes", 108, 4))
_DATA_DIRS = ("EXPORT", "IMPORT", "RESOURCE", "EXCEPTION", "SECURITY", "BASERELOC", "DEBUG", "ARCHITECTURE",
              "GLOBALPTR", "TLS", "LOAD_CONFIG", "BOUND_IMPORT", "IAT", "DELAY_IMPORT", "CLR", "RESERVED")  # fmt: skip
_SECTION = (("VirtualSize", 8, 4), ("VirtualAddress", 12, 4), ("SizeOfRawData", 16, 4),
            ("PointerToRawData", 20, 4), ("PointerToRelocations", 24, 4), ("PointerToLinenumbers", 28, 4),
            ("NumberOfRelocations", 32, 2), ("NumberOfLinenumbers", 34, 2), ("Characteristics", 36, 4))  # fmt: skip


def pe_layout(data: bytes) -> Layout:
    """The DOS, COFF and optional header fields, data directories and section table of `data`."""
    out = Layout(magic_len=2)
    (lfanew,) = struct.unpack_from("<I", data, 0x3C)
    for name, off, size in (("e_cblp", 2, 2), ("e_cp", 4, 2), ("e_lfarlc", 0x18, 2), ("e_lfanew", 0x3C, 4)):
        _add(out, data, off, size, "<", f"dos.{name}")
    coff = lfanew + 4
    for name, off, size in _COFF:
        _add(out, data, coff + off, size, "<", f"coff.{name}")
    opt = coff + 20
    magic = _u(data, opt, 2, "<")
    opt_size = _u(data, coff + 16, 2, "<") or 0
    nsect = _u(data, coff + 2, 2, "<") or 0
    for name, off, size in _OPT_COMMON + (_OPT64 if magic == 0x20B else _OPT32):
        if off + size <= opt_size:
            _add(out, data, opt + off, size, "<", f"opt.{name}")
    dirs = opt + (112 if magic == 0x20B else 96)
    for i, name in enumerate(_DATA_DIRS):
        if dirs + 8 * i + 8 <= opt + opt_size:
            _add(out, data, dirs + 8 * i, 4, "<", f"dir.{name}.VirtualAddress")
            _add(out, data, dirs + 8 * i + 4, 4, "<", f"dir.{name}.Size")
    table = opt + opt_size
    for i in range(min(nsect, _MAX_ENTRIES)):
        base = table + 40 * i
        if base + 40 > len(data):
            break
        for name, off, size in _SECTION:
            _add(out, data, base + off, size, "<", f"section[{i}].{name}")
    end = min(len(data), table + 40 * nsect)
    out.tables += [min(len(data), coff + 20), min(len(data), table), end]
    out.header_end = max(0x40, end)
    return out


# ------------------------------------------------------------------------------------- Mach-O
LC_SEGMENT, LC_SEGMENT_64 = 0x1, 0x19
_MACHO_HDR = (("cputype", 4), ("cpusubtype", 8), ("filetype", 12), ("ncmds", 16), ("sizeofcmds", 20), ("flags", 24))
_SEG32 = (("vmaddr", 24, 4), ("vmsize", 28, 4), ("fileoff", 32, 4), ("filesize", 36, 4), ("maxprot", 40, 4),
          ("initprot", 44, 4), ("nsects", 48, 4), ("flags", 52, 4))  # fmt: skip
_SEG64 = (("vmaddr", 24, 8), ("vmsize", 32, 8), ("fileoff", 40, 8), ("filesize", 48, 8), ("maxprot", 56, 4),
          ("initprot", 60, 4), ("nsects", 64, 4), ("flags", 68, 4))  # fmt: skip
_SECT32 = (("addr", 32, 4), ("size", 36, 4), ("offset", 40, 4), ("align", 44, 4), ("reloff", 48, 4),
           ("nreloc", 52, 4), ("flags", 56, 4), ("reserved1", 60, 4), ("reserved2", 64, 4))  # fmt: skip
_SECT64 = (("addr", 32, 8), ("size", 40, 8), ("offset", 48, 4), ("align", 52, 4), ("reloff", 56, 4),
           ("nreloc", 60, 4), ("flags", 64, 4), ("reserved1", 68, 4), ("reserved2", 72, 4))  # fmt: skip
_MAX_COMMANDS = 256


def macho_layout(data: bytes, base: int = 0, prefix: str = "") -> Layout:
    """The Mach-O header and load-command fields of the image at `base` in `data` (segment and
    section fields named; any other command's body as 32-bit words)."""
    order, bits = _MACHO_MAGICS[data[base : base + 4]]
    out = Layout(magic_len=4)
    for name, off in _MACHO_HDR:
        _add(out, data, base + off, 4, order, f"{prefix}header.{name}")
    ncmds = _u(data, base + 16, 4, order) or 0
    pos = base + (32 if bits == 64 else 28)
    out.tables.append(min(len(data), pos))
    for i in range(min(ncmds, _MAX_COMMANDS)):
        cmd, size = _u(data, pos, 4, order), _u(data, pos + 4, 4, order)
        if cmd is None or size is None:
            break
        name = f"{prefix}lc[{i}]"
        _add(out, data, pos, 4, order, f"{name}.cmd")
        _add(out, data, pos + 4, 4, order, f"{name}.cmdsize")
        if cmd in (LC_SEGMENT, LC_SEGMENT_64):
            is64 = cmd == LC_SEGMENT_64
            for fname, off, fsize in _SEG64 if is64 else _SEG32:
                _add(out, data, pos + off, fsize, order, f"{name}.segment.{fname}")
            nsects = _u(data, pos + (64 if is64 else 48), 4, order) or 0
            first, step = pos + (72 if is64 else 56), 80 if is64 else 68
            for j in range(min(nsects, _MAX_ENTRIES)):
                s = first + j * step
                if s + step > min(len(data), pos + size):
                    break
                for fname, off, fsize in _SECT64 if is64 else _SECT32:
                    _add(out, data, s + off, fsize, order, f"{name}.section[{j}].{fname}")
        else:  # LC_SYMTAB, LC_DYLD_INFO, LC_LOAD_DYLIB, ...: offsets, sizes and counts are 32-bit words
            for off in range(8, min(size, 64), 4):
                _add(out, data, pos + off, 4, order, f"{name}(0x{cmd:x}).word{off // 4}")
        if size < 8:
            break
        pos += size
        out.tables.append(min(len(data), pos))
    out.header_end = min(len(data), max(pos, base + 32))
    return out


def fat_layout(data: bytes) -> tuple[Layout, list[int]]:
    """The fat header and arch table of `data`, and the offsets of its slices that are Mach-O images."""
    bits = _FAT_MAGICS[data[:4]]
    out = Layout(magic_len=4)
    _add(out, data, 4, 4, ">", "fat.nfat_arch")
    (n,) = struct.unpack_from(">I", data, 4)
    step = 32 if bits == 64 else 20
    wide = 8 if bits == 64 else 4
    names = (("cputype", 0, 4), ("cpusubtype", 4, 4), ("offset", 8, wide), ("size", 8 + wide, wide),
             ("align", 8 + 2 * wide, 4))  # fmt: skip
    slices = []
    for i in range(min(n, _MAX_FAT_ARCHS)):
        base = 8 + i * step
        if base + step > len(data):
            break
        for name, off, size in names:
            _add(out, data, base + off, size, ">", f"fat.arch[{i}].{name}")
        off = _u(data, base + 8, 8 if bits == 64 else 4, ">") or 0
        if data[off : off + 4] in _MACHO_MAGICS:
            slices.append(off)
    out.header_end = min(len(data), 8 + n * step)
    out.tables.append(out.header_end)
    return out, slices


# ---------------------------------------------------------------------------------- mutations
def _interesting(rng: random.Random, old: int, size: int, file_size: int) -> tuple[int, str]:
    """A new value for a field of `size` bytes that held `old`: the values parsers trip on."""
    bits = 8 * size
    top = (1 << bits) - 1
    choice = rng.randrange(12)
    if choice == 0:
        return 0, "0"
    if choice == 1:
        return top, "all ones"
    if choice == 2:
        return 1 << (bits - 1), "sign bit"
    if choice == 3:
        return (1 << (bits - 1)) - 1, "max signed"
    if choice == 4:
        return file_size & top, "file size"
    if choice == 5:
        delta = rng.choice((1, 2, 4, 8, 16, 0x1000))
        return (old + rng.choice((-delta, delta))) & top, "off by a little"
    if choice == 6:
        return (old * rng.choice((2, 16, 256, 0x10000))) & top, "scaled up"
    if choice == 7:
        return old >> rng.choice((1, 4, 8)), "scaled down"
    if choice == 8:
        bit = rng.randrange(bits)
        return old ^ (1 << bit), f"bit {bit} flipped"
    if choice == 9:
        return rng.choice((0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000)) & top, "boundary"
    if choice == 10:
        return (file_size + rng.randrange(1, 0x10000)) & top, "past the end"
    return rng.getrandbits(bits), "random"


def _set_field(rng: random.Random, buf: bytearray, f: Field, data_len: int) -> str:
    fmt = f.order + _FMT[f.size]
    (old,) = struct.unpack_from(fmt, buf, f.offset)
    new, how = _interesting(rng, old, f.size, data_len)
    if new == old:
        new, how = new ^ 1, how + ", low bit flipped"
    struct.pack_into(fmt, buf, f.offset, new)
    return f"{f.name} {old:#x} -> {new:#x} ({how})"


def _flip_bytes(rng: random.Random, buf: bytearray, lo: int, hi: int) -> str:
    n = rng.choice((1, 1, 2, 4, 8))
    where = []
    for _ in range(n):
        at = rng.randrange(lo, hi)
        buf[at] ^= rng.randrange(1, 256)
        where.append(f"{at:#x}")
    return f"bytes flipped at {', '.join(where)}"


def _truncate(rng: random.Random, buf: bytearray, layout: Layout) -> str:
    floor = max(layout.magic_len + 1, 8)
    cuts = [t for t in layout.tables if floor <= t < len(buf)]
    kind = rng.randrange(4)
    if kind == 0 and cuts:
        at = rng.choice(cuts) - rng.choice((0, 1, 4))
        how = "at the end of a header table"
    elif kind == 1 and layout.header_end > floor:
        at = rng.randrange(floor, max(floor + 1, min(len(buf), layout.header_end)))
        how = "inside the headers"
    elif kind == 2:
        at = len(buf) - rng.randrange(1, max(2, min(len(buf) - floor, 4096)))
        how = "near the end"
    else:
        at = rng.randrange(floor, len(buf))
        how = "anywhere"
    at = max(floor, min(at, len(buf) - 1))
    old = len(buf)
    del buf[at:]
    return f"truncated {old:#x} -> {at:#x} bytes ({how})"


def _layout(data: bytes, fmt: str, rng: random.Random) -> tuple[Layout, str]:
    """The layout to mutate: for a fat file, its arch table or (half the time) one slice's headers."""
    if fmt == "elf":
        return elf_layout(data), ""
    if fmt == "pe":
        return pe_layout(data), ""
    if fmt == "macho":
        return macho_layout(data), ""
    fat, slices = fat_layout(data)
    if slices and rng.random() < 0.5:
        base = rng.choice(slices)
        inner = macho_layout(data, base, prefix=f"slice@{base:#x}.")
        inner.magic_len = 4
        return inner, f"slice@{base:#x}"
    return fat, ""


def mutate(data: bytes, seed: int, index: int) -> Mutant:
    """Mutant `index` of `seed` made from `data` (an ELF, PE, Mach-O or fat Mach-O file): 1-4
    mutations (header fields, a truncation, byte flips in the headers); never its magic."""
    fmt = detect_format(data)
    if fmt is None:
        raise ValueError("not an ELF, PE, Mach-O or fat Mach-O file")
    rng = random.Random(f"{seed}:{index}")
    buf = bytearray(data)
    ops: list[str] = []
    count = rng.choice((1, 1, 1, 2, 2, 3, 4))
    for step in range(count):
        layout, where = _layout(bytes(buf), fmt, rng)
        kinds: list[tuple[int, Callable[[], str]]] = []
        if layout.fields:
            kinds.append((6, lambda layout=layout: _set_field(rng, buf, rng.choice(layout.fields), len(data))))
        lo = layout.magic_len if not where else int(where.split("@")[1], 16) + 4
        hi = min(len(buf), max(layout.header_end, lo + 1))
        if hi > lo:
            kinds.append((2, lambda lo=lo, hi=hi: _flip_bytes(rng, buf, lo, hi)))
        if step == count - 1 and len(buf) > 16:  # a cut last, so later edits do not fall past it
            kinds.append((2, lambda layout=layout: _truncate(rng, buf, layout)))
        total = sum(w for w, _ in kinds)
        pick = rng.randrange(total)
        for weight, op in kinds:
            if pick < weight:
                ops.append(op())
                break
            pick -= weight
    if bytes(buf) == data:  # (a field set to the value it held after an earlier op undid it)
        buf[len(buf) - 1] ^= 0xFF
        ops.append(f"last byte flipped at {len(buf) - 1:#x}")
    return Mutant(bytes(buf), ops)
