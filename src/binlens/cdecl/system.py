"""A program's C type system: built-in, libc and Win32 types plus the user's declarations.

Declarations are parsed with pycparser. Type names are `struct tag`, `union tag`, `enum tag`, a
typedef name, or a function prototype's name. Layout follows the program's ABI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from pycparser import c_ast

from binlens.cdecl.abi import SCALARS, Abi
from binlens.cdecl.builtins import WIN32_DECLARATIONS, libc_declarations, win32_pointer_sized
from binlens.cdecl.ctype import CType
from binlens.cdecl.layout import canonical_scalar, lay_out
from binlens.cdecl.parse import (
    DeclarationError,
    Definition,
    binary_op,
    coord,
    definitions,
    literal,
    parse_text,
    type_key,
)

_STORED: dict[tuple[str, tuple[str, ...]], list[Definition]] = {}


class TypeSystem:
    """Named C types for one ABI; resolution and layout are computed on demand and cached."""

    _builtin_cache: dict[str, dict[str, Definition]] = {}

    def __init__(self, abi: Abi, user: Iterable[tuple[str, str, str, str]] = ()) -> None:
        """`user` holds (name, kind, category, declaration) rows from the database."""
        self.abi = abi
        self.defs: dict[str, Definition] = dict(self._builtins(abi))
        self._cache: dict[str, CType] = {}
        self._busy: set[str] = set()
        self._names: dict[str, CType] = {}
        rows = list(user)
        for name, kind, _category, _text in rows:  # every typedef name is known before any text is parsed
            if kind == "typedef":
                self.defs[name] = Definition(name, "typedef", c_ast.Typedef(name, [], [], None), "")
        for name, _kind, category, text in rows:
            for d in self._parse_stored(text):
                if d.name == name:
                    d.category = category
                    self.defs[name] = d

    def add(self, definitions: Iterable[Definition]) -> None:
        """Add or replace definitions (the cache is dropped: layouts may depend on them)."""
        for d in definitions:
            self.defs[d.name] = d
        self._cache.clear()
        self._names.clear()

    def remove(self, name: str) -> None:
        """Forget a definition (the cache is dropped)."""
        self.defs.pop(name, None)
        self._cache.clear()
        self._names.clear()

    # --- parsing ---------------------------------------------------------------------------
    @classmethod
    def _builtins(cls, abi: Abi) -> dict[str, Definition]:
        key = f"{abi.name}/{abi.pointer}/{abi.wchar}/{abi.sizes['long double']}"
        cached = cls._builtin_cache.get(key)
        if cached is None:
            cached = {}
            for category, text in (
                ("/libc", libc_declarations(abi)),
                ("/win32", WIN32_DECLARATIONS + win32_pointer_sized(abi)),
            ):
                for d in definitions(parse_text(text, cached)):
                    d.category, d.source = category, "builtin"
                    cached[d.name] = d
            cls._builtin_cache[key] = cached
        return cached

    def parse(self, text: str) -> list[Definition]:
        """The types `text` defines, in order; DeclarationError when it is not valid C."""
        return definitions(parse_text(text, self.defs))

    def _parse_stored(self, text: str) -> list[Definition]:
        # stored declarations are canonical and re-parse the same way: parse each once per process
        key = (text, tuple(sorted(n for n, d in self.defs.items() if d.kind == "typedef" and n in text)))
        hit = _STORED.get(key)
        if hit is None:
            hit = self.parse(text)
            if len(_STORED) > 20000:
                _STORED.clear()
            _STORED[key] = hit
        return [dataclasses.replace(d) for d in hit]

    def parse_type_name(self, text: str) -> CType:
        """A type written as a C type name: 'int', 'const char *', 'struct foo [4]', 'int (*)(int)'."""
        hit = self._names.get(text)
        if hit is None:
            hit = self._parse_type_name(text)
            if len(self._names) < 4096:
                self._names[text] = hit
        return hit

    def _parse_type_name(self, text: str) -> CType:
        if ";" in text or "{" in text:
            raise DeclarationError("a type name has no ';' or '{' (declare new types with data_type.create)")
        try:
            ast = parse_text(f"void __binlens_type({text});", self.defs)
        except DeclarationError as err:
            if err.column is not None:
                err.column -= len("void __binlens_type(")
                err.message = f"column {err.column}: " + err.message.split(": ", 1)[-1]
                err.args = (err.message,)
            raise
        func = ast.ext[-1].type
        if not isinstance(func, c_ast.FuncDecl) or func.args is None or len(func.args.params) != 1:
            raise DeclarationError(f"{text!r} is not one C type name")
        param = func.args.params[0]
        if isinstance(param, c_ast.EllipsisParam):
            raise DeclarationError(f"{text!r} is not a type")
        if getattr(param, "name", None):
            raise DeclarationError(f"a type name has no declarator name ({param.name!r}): write just the type")
        return self.convert(param.type)

    # --- resolution ------------------------------------------------------------------------
    def resolve(self, name: str) -> CType:
        """The named type, laid out; KeyError when unknown."""
        hit = self._cache.get(name)
        if hit is not None:
            return hit
        if name in SCALARS:
            return self._scalar(name)
        d = self.defs.get(name)
        if d is None:
            tag = name.split(" ", 1)
            if len(tag) == 2 and tag[0] in ("struct", "union"):
                return CType(kind=tag[0], name=tag[1], size=None, align=1)  # declared, never defined
            raise KeyError(name)
        if name in self._busy:
            raise DeclarationError(f"{name} contains itself (use a pointer)")
        self._busy.add(name)
        try:
            t = self._define(d)
        finally:
            self._busy.discard(name)
        self._cache[name] = t
        return t

    def _define(self, d: Definition) -> CType:
        node = d.node
        if d.kind == "typedef":
            inner = self.convert(node.type)
            return CType(kind="typedef", name=d.name, size=inner.size, align=inner.align, _target=inner)
        if d.kind == "function":
            t = self.convert(node.type)
            return dataclasses_replace(t, name=d.name)
        tagged = node.type if isinstance(node, c_ast.Decl) else node
        body = tagged.values if isinstance(tagged, c_ast.Enum) else tagged.decls
        if body is None:  # a forward declaration: the type stays incomplete until defined
            return CType(kind=d.kind, name=tagged.name, size=None, align=1)
        return self._enum(tagged) if isinstance(tagged, c_ast.Enum) else self._record(tagged)

    def _scalar(self, name: str) -> CType:
        size, align = self.abi.scalar(name)
        if name == "void":
            return CType(kind="scalar", name="void", size=None, align=1)
        return CType(
            kind="scalar",
            name=name,
            size=size,
            align=align,
            signed=not name.startswith("unsigned") and name not in ("_Bool", "char") or name == "char",
            floating=name in ("float", "double", "long double"),
        )

    def convert(self, node: c_ast.Node) -> CType:
        """A pycparser type node as a laid-out CType."""
        if isinstance(node, c_ast.TypeDecl):
            return self.convert(node.type).with_quals(node.quals or [])
        if isinstance(node, c_ast.Typename):
            return self.convert(node.type).with_quals(node.quals or [])
        if isinstance(node, c_ast.IdentifierType):
            return self._identifier(node)
        if isinstance(node, c_ast.PtrDecl):
            inner = node.type
            size = self.abi.pointer
            target = self._lazy(inner)
            return CType(kind="pointer", size=size, align=size, quals=tuple(node.quals or []), _target=target)
        if isinstance(node, c_ast.ArrayDecl):
            elem = self.convert(node.type)
            count = None if node.dim is None else self.constant(node.dim)
            if count is not None and count < 0:
                raise DeclarationError("an array cannot have a negative size", *coord(node))
            if elem.size is None:
                raise DeclarationError(f"array of incomplete type {elem.spelling}", *coord(node))
            total = None if count is None else elem.size * count
            if total is not None and total >= 1 << 62:
                raise DeclarationError("the array is too large", *coord(node))
            return CType(kind="array", size=total, align=elem.align, count=count, _target=elem)
        if isinstance(node, c_ast.FuncDecl):
            return self._function(node)
        if isinstance(node, (c_ast.Struct, c_ast.Union, c_ast.Enum)):
            return self.convert_tagged(node)
        raise DeclarationError(f"unsupported type construct {type(node).__name__}", *coord(node))

    def _lazy(self, node: c_ast.Node) -> Callable[[], CType] | CType:
        # A pointer's target may be the struct being laid out (a linked list): resolve it later.
        base = node
        while isinstance(base, c_ast.TypeDecl):
            base = base.type
        if isinstance(base, (c_ast.Struct, c_ast.Union)) and base.decls is None:
            return lambda: self.convert(node)
        return self.convert(node)

    def _identifier(self, node: c_ast.IdentifierType) -> CType:
        names = list(node.names)
        canonical = canonical_scalar(names)
        if canonical is not None:
            return self._scalar(canonical)
        if len(names) == 1:
            try:
                return self.resolve(names[0])
            except KeyError:
                raise DeclarationError(f"unknown type name {names[0]!r}", *coord(node)) from None
        raise DeclarationError(f"invalid type specifiers {' '.join(names)!r}", *coord(node))

    def _function(self, node: c_ast.FuncDecl) -> CType:
        ret = self.convert(node.type)
        params: list[tuple[str | None, CType]] = []
        variadic = False
        for p in node.args.params if node.args is not None else []:
            if isinstance(p, c_ast.EllipsisParam):
                variadic = True
                continue
            if isinstance(p, c_ast.ID):
                raise DeclarationError("K&R parameter lists are not supported: give each parameter a type", *coord(p))
            t = self.convert(p.type)
            if t.kind == "scalar" and t.name == "void" and not p.name and len(node.args.params) == 1:
                continue
            params.append((p.name, t))
        return CType(kind="function", size=None, align=1, params=params, variadic=variadic, _target=ret)

    def convert_tagged(self, node: c_ast.Node) -> CType:
        """A struct/union/enum node: its definition when it has a body, else the named type."""
        key = type_key(node)
        body = node.values if isinstance(node, c_ast.Enum) else node.decls
        if body is None:
            if key is None:
                raise DeclarationError("an anonymous type needs a body", *coord(node))
            if isinstance(node, c_ast.Enum) and key not in self.defs:
                raise DeclarationError(f"unknown {key}", *coord(node))
            return self.resolve(key)
        known = self.defs.get(key) if key is not None else None
        if key is not None and known is not None and known.node is node:
            return self.resolve(key)
        if isinstance(node, c_ast.Enum):
            return self._enum(node)
        return self._record(node)

    def _enum(self, node: c_ast.Enum) -> CType:
        values: list[tuple[str, int]] = []
        nxt = 0
        local: dict[str, int] = {}
        for e in node.values.enumerators:
            value = self.constant(e.value, local) if e.value is not None else nxt
            values.append((e.name, value))
            local[e.name] = value
            nxt = value + 1
        size = 4
        if values and (max(v for _, v in values) > 0xFFFFFFFF or min(v for _, v in values) < -(1 << 31)):
            size = 8
        bad = next((n for n, v in values if not -(1 << 63) <= v < 1 << 64), None)
        if bad is not None:
            raise DeclarationError(f"enumerator {bad} does not fit in 64 bits", *coord(node))
        return CType(kind="enum", name=node.name or "", size=size, align=size, signed=True, enumerators=values)

    def _record(self, node: c_ast.Struct | c_ast.Union) -> CType:
        kind = "union" if isinstance(node, c_ast.Union) else "struct"
        t = CType(kind=kind, name=node.name or "")
        if node.name:
            self._cache[f"{kind} {node.name}"] = t  # visible to pointers inside while laying out
        try:
            lay_out(self, t, node.decls)
        except Exception:
            if node.name:
                self._cache.pop(f"{kind} {node.name}", None)
            raise
        return t

    # --- constants -------------------------------------------------------------------------
    def constant(self, node: c_ast.Node, local: dict[str, int] | None = None) -> int:
        """The value of an integer constant expression (literals, enumerators, sizeof, arithmetic)."""
        local = local or {}
        if isinstance(node, c_ast.Constant):
            return literal(node)
        if isinstance(node, c_ast.ID):
            if node.name in local:
                return local[node.name]
            hit = self.enumerator(node.name)
            if hit is None:
                raise DeclarationError(f"{node.name!r} is not a known constant", *coord(node))
            return hit
        if isinstance(node, c_ast.UnaryOp):
            if node.op == "sizeof":
                t = self.convert(node.expr) if isinstance(node.expr, c_ast.Typename) else None
                if t is None or t.size is None:
                    raise DeclarationError("sizeof needs a complete type name", *coord(node))
                return t.size
            v = self.constant(node.expr, local)
            ops = {"-": -v, "+": v, "~": ~v, "!": int(not v)}
            if node.op in ops:
                return ops[node.op]
        if isinstance(node, c_ast.BinaryOp):
            a, b = self.constant(node.left, local), self.constant(node.right, local)
            try:
                return binary_op(node.op, a, b)
            except ZeroDivisionError:
                raise DeclarationError("division by zero in a constant", *coord(node)) from None
        if isinstance(node, c_ast.Cast):
            return self.constant(node.expr, local)
        if isinstance(node, c_ast.TernaryOp):
            return self.constant(node.iftrue if self.constant(node.cond, local) else node.iffalse, local)
        raise DeclarationError("not an integer constant expression", *coord(node))

    def enumerator(self, name: str) -> int | None:
        """The value of an enumerator of any known enum."""
        for key, d in self.defs.items():
            if d.kind != "enum":
                continue
            values = d.node.type.values if isinstance(d.node, c_ast.Decl) else d.node.values
            if values is not None and any(e.name == name for e in values.enumerators):
                return dict(self.resolve(key).enumerators)[name]
        return None


def dataclasses_replace(t: CType, **kw: Any) -> CType:
    """A copy of `t` with some fields changed."""
    import dataclasses

    return dataclasses.replace(t, **kw)
