"""Mach-O symbol stubs and the import slot each one jumps through, from the indirect symbol table.

A stub section (`S_SYMBOL_STUBS`: `__stubs`, `__auth_stubs`, `__symbol_stub1`,
`__picsymbolstub4`, ...) holds one stub of `reserved2` bytes per entry, and a pointer section
(`S_LAZY_SYMBOL_POINTERS`, `S_NON_LAZY_SYMBOL_POINTERS`, ...) one pointer per entry; entry `k`
of either names the symbol at `reserved1 + k` of the indirect symbol table. A stub goes through
its symbol's lazy pointer where there is one (x86 and older arm64 stubs), else its non-lazy
pointer (arm64e `__auth_stubs` through `__auth_got`). The table names the stub whatever
instructions it holds (x86 `jmp [slot]`, arm64 `ldr x16, literal`, arm64e `braa`, ARM
`ldr pc, ...`).
"""

from __future__ import annotations

from dataclasses import dataclass

S_NON_LAZY_SYMBOL_POINTERS = 0x6
S_LAZY_SYMBOL_POINTERS = 0x7
S_SYMBOL_STUBS = 0x8
S_LAZY_DYLIB_SYMBOL_POINTERS = 0x10
_LAZY = (S_LAZY_SYMBOL_POINTERS, S_LAZY_DYLIB_SYMBOL_POINTERS)
_POINTERS = (S_NON_LAZY_SYMBOL_POINTERS, *_LAZY)


@dataclass(frozen=True, slots=True)
class IndirectSection:
    """What a section says about the indirect symbol table: its type (the low byte of its flags),
    first index (`reserved1`), stub size (`reserved2`), address and size."""

    type: int
    first: int
    stub_size: int
    va: int
    size: int


def stubs_by_slot(sections: list[IndirectSection], names: list[str], pointer_size: int) -> dict[int, int]:
    """Import slot -> the address of the stub that jumps through it. `names` is the indirect
    symbol table as symbol names ("" for a local or absolute entry)."""
    stub_of: dict[str, int] = {}
    lazy: dict[str, int] = {}
    eager: dict[str, int] = {}
    for s in sections:
        if s.type == S_SYMBOL_STUBS and s.stub_size:
            for k, name in _entries(s, s.stub_size, names):
                stub_of.setdefault(name, s.va + k * s.stub_size)
        elif s.type in _POINTERS:
            slots = lazy if s.type in _LAZY else eager
            for k, name in _entries(s, pointer_size, names):
                slots.setdefault(name, s.va + k * pointer_size)
    out: dict[int, int] = {}
    for name, stub in stub_of.items():
        slot = lazy.get(name, eager.get(name))
        if slot is not None:
            out[slot] = stub
    return out


def _entries(s: IndirectSection, size: int, names: list[str]) -> list[tuple[int, str]]:
    """(entry index, symbol name) of a section's entries that name a symbol."""
    count = min(s.size // size, max(0, len(names) - s.first))
    return [(k, names[s.first + k]) for k in range(count) if names[s.first + k]]
