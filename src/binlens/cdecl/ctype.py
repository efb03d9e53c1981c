"""Resolved C types with their layout (size, alignment, field offsets) and their C spelling."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Field:
    """A struct/union member: byte offset, and bit position/width for bit-fields."""

    name: str | None
    type: CType
    offset: int
    bit_offset: int | None = None
    bit_size: int | None = None


@dataclass(eq=False)
class CType:
    """One C type, resolved and laid out for an ABI.

    kind: scalar, pointer, array, struct, union, enum, function, typedef. `size` is None for
    incomplete types (a declared but undefined struct, `void`, a function, `int[]`).
    """

    kind: str
    name: str = ""
    size: int | None = None
    align: int = 1
    quals: tuple[str, ...] = ()
    signed: bool = False
    floating: bool = False
    count: int | None = None  # array element count (None: unknown)
    fields: list[Field] | None = None  # struct/union members (None: incomplete)
    enumerators: list[tuple[str, int]] = field(default_factory=list)
    params: list[tuple[str | None, CType]] = field(default_factory=list)
    variadic: bool = False
    _target: CType | Callable[[], CType] | None = None

    @property
    def target(self) -> CType | None:
        """Pointee, element, return type, or the type a typedef names (resolved lazily)."""
        t = self._target
        if callable(t) and not isinstance(t, CType):
            t = t()
            self._target = t
        return t

    def with_quals(self, quals: list[str] | tuple[str, ...]) -> CType:
        """This type with extra qualifiers (const, volatile, restrict)."""
        qs = tuple(q for q in quals if q not in self.quals)
        return dataclasses.replace(self, quals=self.quals + qs) if qs else self

    def strip(self) -> CType:
        """Through typedefs to the underlying type."""
        t = self
        seen = 0
        while t.kind == "typedef" and t.target is not None and seen < 64:
            t = t.target
            seen += 1
        return t

    @property
    def spelling(self) -> str:
        """The C spelling of this type as an abstract declarator, e.g. 'char *' or 'int [16]'."""
        return render(self, "")


def _prefix(t: CType) -> str:
    q = " ".join(t.quals)
    if t.kind == "scalar":
        base = t.name
    elif t.kind in ("struct", "union", "enum"):
        base = f"{t.kind} {t.name}" if t.name else f"{t.kind} {{...}}"
    else:
        base = t.name
    return f"{q} {base}" if q else base


def render(t: CType, decl: str) -> str:
    """Compose the C declarator of `t` around `decl` (a name or an inner declarator)."""
    if t.kind == "pointer":
        q = (" " + " ".join(t.quals) + " ") if t.quals else ""
        inner = f"*{q}{decl}".rstrip() if q else f"*{decl}"
        tgt = t.target
        if tgt is not None and tgt.kind in ("array", "function"):
            inner = f"({inner})"
        return render(tgt, inner) if tgt is not None else f"void {inner}"
    if t.kind == "array":
        n = "" if t.count is None else str(t.count)
        return render(t.target, f"{decl}[{n}]") if t.target is not None else f"? {decl}[{n}]"
    if t.kind == "function":
        ps = [render(pt, pn or "") for pn, pt in t.params]
        if t.variadic:
            ps.append("...")
        args = ", ".join(ps) if ps else "void"
        ret = t.target
        return render(ret, f"{decl}({args})") if ret is not None else f"void {decl}({args})"
    base = _prefix(t)
    if not decl:
        return base
    return f"{base} {decl}" if not decl.startswith("[") else f"{base} {decl}"


def round_up(value: int, align: int) -> int:
    """`value` rounded up to a multiple of `align`."""
    return (value + align - 1) // align * align
