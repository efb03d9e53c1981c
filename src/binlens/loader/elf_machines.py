"""The ELF machines the fast reader (`parse_elf`) takes, and their relocation type names as LIEF spells them.

Each machine maps to its architecture name and bit width as `parse_lief` reports them, the ELF
class it must have, the prefix of LIEF's relocation names and a table psABI number -> name. The
tables list the types a linked executable or shared object carries (dynamic relocations); any
other number makes the reader decline the file, so LIEF names it. LIEF 1.0 has no name for a few
PowerPC types (R_PPC_COPY, R_PPC_GLOB_DAT): it reports its internal enum value as a decimal
string, which the table reproduces. `tests/test_loader_fast_cross.py` checks every entry against
LIEF's enum.
"""

from __future__ import annotations

from dataclasses import dataclass


def _table(spec: str) -> dict[int, str]:
    """`"0:NONE 2:ABS32 ..."` -> {0: "NONE", 2: "ABS32", ...}."""
    return {int(num): name for num, name in (item.split(":") for item in spec.split())}


_X86_64 = _table(
    " ".join(
        f"{n}:{name}"
        for n, name in enumerate(
            (  # noqa: SIM905 - a table in psABI order
                "NONE 64 PC32 GOT32 PLT32 COPY GLOB_DAT JUMP_SLOT RELATIVE GOTPCREL 32 32S 16 PC16 8 PC8 DTPMOD64 "
                "DTPOFF64 TPOFF64 TLSGD TLSLD DTPOFF32 GOTTPOFF TPOFF32 PC64 GOTOFF64 GOTPC32 GOT64 GOTPCREL64 "
                "GOTPC64 GOTPLT64 PLTOFF64 SIZE32 SIZE64 GOTPC32_TLSDESC TLSDESC_CALL TLSDESC IRELATIVE RELATIVE64 "
                "PC32_BND PLT32_BND GOTPCRELX REX_GOTPCRELX"
            ).split()
        )
    )
)
_I386 = _table(
    " ".join(
        f"{n}:{name}"
        for n, name in enumerate(
            (  # noqa: SIM905
                "NONE 32 PC32 GOT32 PLT32 COPY GLOB_DAT JUMP_SLOT RELATIVE GOTOFF GOTPC 32PLT - - TLS_TPOFF TLS_IE "
                "TLS_GOTIE TLS_LE TLS_GD TLS_LDM 16 PC16 8 PC8 TLS_GD_32 TLS_GD_PUSH TLS_GD_CALL TLS_GD_POP "
                "TLS_LDM_32 TLS_LDM_PUSH TLS_LDM_CALL TLS_LDM_POP TLS_LDO_32 TLS_IE_32 TLS_LE_32 TLS_DTPMOD32 "
                "TLS_DTPOFF32 TLS_TPOFF32 - TLS_GOTDESC TLS_DESC_CALL TLS_DESC IRELATIVE"
            ).split()
        )
        if name != "-"
    )
)
_AARCH64 = _table(
    "0:NONE 257:ABS64 258:ABS32 259:ABS16 260:PREL64 261:PREL32 262:PREL16 1024:COPY 1025:GLOB_DAT "
    "1026:JUMP_SLOT 1027:RELATIVE 1028:TLS_DTPREL64 1029:TLS_DTPMOD64 1030:TLS_TPREL64 1031:TLSDESC 1032:IRELATIVE"
)
_ARM = _table(
    "0:NONE 2:ABS32 3:REL32 13:TLS_DESC 17:TLS_DTPMOD32 18:TLS_DTPOFF32 19:TLS_TPOFF32 20:COPY 21:GLOB_DAT "
    "22:JUMP_SLOT 23:RELATIVE 160:IRELATIVE"
)
_MIPS = _table(
    "0:NONE 2:32 3:REL32 18:64 38:TLS_DTPMOD32 39:TLS_DTPREL32 40:TLS_DTPMOD64 41:TLS_DTPREL64 47:TLS_TPREL32 "
    "48:TLS_TPREL64 51:GLOB_DAT 126:COPY 127:JUMP_SLOT"
)
_PPC = _table(
    "0:NONE 1:ADDR32 2:ADDR24 3:ADDR16 4:ADDR16_LO 5:ADDR16_HI 6:ADDR16_HA 10:REL24 21:JMP_SLOT 22:RELATIVE "
    "26:REL32 68:DTPMOD32 73:TPREL32 78:DTPREL32"
)
_PPC64 = _table("0:NONE 1:ADDR32 21:JMP_SLOT 22:RELATIVE 38:ADDR64 44:REL64 68:DTPMOD64 73:TPREL64 78:DTPREL64")
_RISCV = _table(
    "0:NONE 1:32 2:64 3:RELATIVE 4:COPY 5:JUMP_SLOT 6:TLS_DTPMOD32 7:TLS_DTPMOD64 8:TLS_DTPREL32 9:TLS_DTPREL64 "
    "10:TLS_TPREL32 11:TLS_TPREL64 12:TLSDESC 58:IRELATIVE"
)
# Types LIEF 1.0 has no name for: it reports (its architecture code << 24 | type) in decimal.
_LIEF_UNNAMED = {20: (0x40, (19, 20))}  # PowerPC: R_PPC_COPY, R_PPC_GLOB_DAT


@dataclass(frozen=True)
class Machine:
    """How one ELF machine reads: LIEF's architecture name and bits, and its relocation type names."""

    arch: str
    bits: int  # as parse_lief reports them (0: the file's class)
    classes: tuple[int, ...]  # ELF classes (32, 64) the fast reader takes for it
    relocs: dict[int, str]  # psABI number -> LIEF's full name ("AARCH64_RELATIVE")
    # The name of every type, for a machine LIEF has no relocation table for (it reports UNKNOWN, 2**32 - 1)
    any_reloc: str | None = None

    def reloc_name(self, number: int) -> str | None:
        """LIEF's name of relocation type `number`, or None when the fast reader does not know it."""
        return self.any_reloc or self.relocs.get(number)


def _names(machine: int, prefix: str, table: dict[int, str]) -> dict[int, str]:
    code, unnamed = _LIEF_UNNAMED.get(machine, (0, ()))
    return {**{n: prefix + name for n, name in table.items()}, **{n: str(code << 24 | n) for n in unnamed}}


MACHINES: dict[int, Machine] = {
    62: Machine("x86-64", 64, (64,), _names(62, "X86_64_", _X86_64)),
    3: Machine("x86", 32, (32,), _names(3, "X86_", _I386)),
    183: Machine("aarch64", 64, (64,), _names(183, "AARCH64_", _AARCH64)),
    40: Machine("arm", 32, (32,), _names(40, "ARM_", _ARM)),
    # MIPS64 packs up to three types into r_info (little-endian files even swap its halves): LIEF decides.
    8: Machine("mips", 32, (32,), _names(8, "MIPS_", _MIPS)),
    10: Machine("mips", 32, (32,), {}, any_reloc=str(2**32 - 1)),  # EM_MIPS_RS3_LE
    20: Machine("ppc", 32, (32,), _names(20, "PPC_", _PPC)),
    21: Machine("ppc", 64, (64,), _names(21, "PPC64_", _PPC64)),
    243: Machine("riscv", 0, (32, 64), _names(243, "RISCV_", _RISCV)),
}


def fast_machine(machine: int, elf_class: int) -> Machine | None:
    """The Machine for `e_machine` in a file of class `elf_class` (32/64), or None when LIEF must read it."""
    found = MACHINES.get(machine)
    if found is None or elf_class not in found.classes:
        return None
    return found
