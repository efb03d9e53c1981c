"""MIPS imports: the global part of the GOT, which no relocation describes.

A MIPS ELF file binds its external functions through the GOT without JUMP_SLOT relocations (the
psABI's "global offset table" scheme): `DT_MIPS_LOCAL_GOTNO` local entries come first at
`DT_PLTGOT`, then one entry per dynamic symbol from index `DT_MIPS_GOTSYM` on, in symbol-table
order. PIC code calls an import through its entry (`lw $t9, %call16(exit)($gp); jalr $t9`). An
undefined function symbol with a value other than zero is its lazy-binding stub in
`.MIPS.stubs` (or its PLT entry in a non-PIC executable): the entry's first content, and the
address non-PIC code calls. Both the fast reader and the LIEF reader take the imports from here.
"""

from __future__ import annotations

from collections.abc import Iterable

DT_PLTGOT = 3
DT_MIPS_LOCAL_GOTNO = 0x7000000A
DT_MIPS_GOTSYM = 0x70000013
STT_FUNC = 2


def global_got_imports(
    dyn: dict[int, int], dynsyms: Iterable[tuple[str, int, int, int]], ptr_size: int, known: set[str]
) -> list[tuple[int, str, int, int | None, str]]:
    """(symbol index, raw name, GOT slot, stub address or None, kind) of the undefined dynamic symbols that have a
    global GOT entry, but for those in `known` (imported through a relocation already).

    `dyn` maps the dynamic tags to their (first) values; `dynsyms` gives (name, type, shndx, value)
    of the dynamic symbols in table order."""
    got = dyn.get(DT_PLTGOT)
    local = dyn.get(DT_MIPS_LOCAL_GOTNO)
    first = dyn.get(DT_MIPS_GOTSYM)
    if not got or local is None or first is None:
        return []
    mask = (1 << (8 * ptr_size)) - 1
    out = []
    for index, (name, stype, shndx, value) in enumerate(dynsyms):
        if index < first or shndx != 0 or not name or name in known:
            continue
        slot = (got + (local + index - first) * ptr_size) & mask
        out.append((index, name, slot, value or None, "function" if stype == STT_FUNC else "object"))
    return out
