"""A crafted ELF (written byte by byte with struct): many function symbols sharing one huge name.

`shared_name_elf(path, symbols=1500, name_bytes=1 << 20)` writes a valid x86-64 executable of
about 1.1 MB whose every symbol's `st_name` points at the same 1 MiB string of 'A's, so that a
loader storing or returning the name once per symbol multiplies the file ~1,500 times.
"""

from __future__ import annotations

import struct
from pathlib import Path

BASE = 0x400000


def shared_name_elf(path: Path, symbols: int = 1500, name_bytes: int = 1 << 20) -> Path:
    """Write the crafted file at `path` and return it."""
    text = b"\x90\xc3" * symbols  # one 2-byte function per symbol: nop; ret
    strtab = b"\0" + b"A" * name_bytes + b"\0"
    shstrtab = b"\0.text\0.symtab\0.strtab\0.shstrtab\0"
    names = {n: shstrtab.index(n.encode() + b"\0") for n in (".text", ".symtab", ".strtab", ".shstrtab")}
    ehsize, phsize, shsize, symsize = 64, 56, 64, 24
    text_off = ehsize + phsize
    sym_off = text_off + len(text)
    sym_off += -sym_off % 8
    symtab = bytearray(symsize)  # the null symbol
    for i in range(symbols):
        # st_name, st_info (STB_GLOBAL<<4 | STT_FUNC), st_other, st_shndx (.text), st_value, st_size
        symtab += struct.pack("<IBBHQQ", 1, 0x12, 0, 1, BASE + text_off + 2 * i, 2)
    str_off = sym_off + len(symtab)
    shstr_off = str_off + len(strtab)
    sh_off = shstr_off + len(shstrtab)
    sh_off += -sh_off % 8
    sections = [
        struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        # name, type PROGBITS, flags ALLOC|EXEC, addr, offset, size, link, info, align, entsize
        struct.pack("<IIQQQQIIQQ", names[".text"], 1, 6, BASE + text_off, text_off, len(text), 0, 0, 16, 0),
        # SYMTAB: link = .strtab (3), info = first global (1)
        struct.pack("<IIQQQQIIQQ", names[".symtab"], 2, 0, 0, sym_off, len(symtab), 3, 1, 8, symsize),
        struct.pack("<IIQQQQIIQQ", names[".strtab"], 3, 0, 0, str_off, len(strtab), 0, 0, 1, 0),
        struct.pack("<IIQQQQIIQQ", names[".shstrtab"], 3, 0, 0, shstr_off, len(shstrtab), 0, 0, 1, 0),
    ]
    end = sh_off + shsize * len(sections)
    header = struct.pack(
        "<16sHHIQQQIHHHHHH",
        b"\x7fELF\x02\x01\x01" + b"\0" * 9,
        2,  # ET_EXEC
        62,  # EM_X86_64
        1,
        BASE + text_off,  # entry: the first function
        ehsize,  # program headers right after the ELF header
        sh_off,
        0,
        ehsize,
        phsize,
        1,
        shsize,
        len(sections),
        4,  # .shstrtab
    )
    # One PT_LOAD (R+X) mapping the whole file at BASE.
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, BASE, BASE, end, end, 0x1000)
    out = bytearray(header + phdr + text)
    out += b"\0" * (sym_off - len(out)) + symtab + strtab + shstrtab
    out += b"\0" * (sh_off - len(out)) + b"".join(sections)
    assert len(out) == end
    path.write_bytes(bytes(out))
    return path
