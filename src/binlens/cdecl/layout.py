"""Struct and union layout per ABI (System V and MSVC bit-field rules), and scalar specifiers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pycparser import c_ast

from binlens.cdecl.ctype import CType, Field, round_up
from binlens.cdecl.parse import DeclarationError, coord

if TYPE_CHECKING:
    from binlens.cdecl.system import TypeSystem


def lay_out(ts: TypeSystem, t: CType, decls: list[c_ast.Decl]) -> None:
    """Fill in a struct/union's members, size and alignment per the ABI."""
    fields: list[Field] = []
    bits = 0  # struct: next free bit
    align = 1
    msvc = ts.abi.bitfields == "msvc"
    unit: tuple[int, int] | None = None  # msvc: (unit start bit, unit size in bits) of the open bit-field run
    for i, d in enumerate(decls):
        ft = ts.convert(d.type)
        name = d.name
        where = coord(d)
        last = i == len(decls) - 1
        if ft.size is None:
            if ft.kind == "array" and ft.count is None and last and t.kind == "struct":
                ft_size = 0  # flexible array member
            else:
                raise DeclarationError(f"member {name!r} has incomplete type {ft.spelling}", *where, fld=name)
        else:
            ft_size = ft.size
        if d.bitsize is not None:
            width = ts.constant(d.bitsize)
            base = ft.strip()
            if base.kind not in ("scalar", "enum") or base.floating:
                raise DeclarationError(f"bit-field {name!r} needs an integer type", *where, fld=name)
            if width < 0 or width > ft_size * 8:
                raise DeclarationError(f"bit-field {name!r} is wider than its type", *where, fld=name)
            unit_bits = ft_size * 8
            if t.kind == "union":
                pos = 0
            elif msvc:
                if unit is None or unit[1] != unit_bits or bits + width > unit[0] + unit[1] or width == 0:
                    if unit is not None:
                        bits = unit[0] + unit[1]  # MSVC: a bit-field run owns its whole storage unit
                    bits = round_up(bits, ft.align * 8)
                    unit = (bits, unit_bits) if width else None
                pos = bits
            else:
                if width == 0 or (bits % (ft.align * 8)) + width > unit_bits:
                    bits = round_up(bits, ft.align * 8)
                pos = bits
            if width == 0:
                continue
            if name is not None or msvc:
                align = max(align, ft.align)
            byte = pos // (ft.align * 8) * ft.align
            fields.append(Field(name, ft, byte, pos - byte * 8, width))
            bits = pos + width if t.kind == "struct" else max(bits, width)
            continue
        if unit is not None:
            bits = unit[0] + unit[1]
            unit = None
        align = max(align, ft.align)
        if t.kind == "union":
            fields.append(Field(name, ft, 0))
            bits = max(bits, ft_size * 8)
            continue
        offset = round_up((bits + 7) // 8, ft.align)
        fields.append(Field(name, ft, offset))
        bits = (offset + ft_size) * 8
    if unit is not None and t.kind == "struct":
        bits = unit[0] + unit[1]
    names = [f.name for f in fields if f.name]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise DeclarationError(f"duplicate member {dup!r}", fld=dup)
    t.fields = fields
    t.align = align
    t.size = round_up((bits + 7) // 8, align)


def canonical_scalar(names: list[str]) -> str | None:
    """The canonical scalar for a specifier list ('unsigned long int' -> 'unsigned long'), or None."""
    words = [n for n in names if n not in ("signed", "unsigned", "int", "short", "long")]
    unsigned = "unsigned" in names
    longs = names.count("long")
    if words and len(words) == 1 and words[0] in ("void", "_Bool", "float", "double", "char", "__int128"):
        w = words[0]
        if w == "char":
            return "unsigned char" if unsigned else "signed char" if "signed" in names else "char"
        if w == "__int128":
            return "unsigned __int128" if unsigned else "__int128"
        if w == "double" and longs:
            return "long double"
        return w
    if words:
        return None
    if "short" in names:
        base = "short"
    elif longs >= 2:
        base = "long long"
    elif longs == 1:
        base = "long"
    else:
        base = "int"
    return f"unsigned {base}" if unsigned else base
