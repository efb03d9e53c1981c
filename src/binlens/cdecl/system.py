"""A program's C type system: built-in, libc and Win32 types plus the user's declarations.

Declarations are parsed with pycparser. Type names are `struct tag`, `union tag`, `enum tag`, a
typedef name, or a function prototype's name. Layout follows the program's ABI.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pycparser import c_ast, c_generator, c_parser

from binlens.cdecl.abi import SCALARS, Abi
from binlens.cdecl.builtins import WIN32_DECLARATIONS, libc_declarations, win32_pointer_sized
from binlens.cdecl.ctype import CType, Field, round_up

_FILE = "<declaration>"


class DeclarationError(Exception):
    """A declaration that does not parse or does not make sense, with where and why."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, fld: str | None = None):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.field = fld

    def details(self) -> dict[str, Any]:
        """Position and member name, for the error's details."""
        out: dict[str, Any] = {}
        if self.line is not None:
            out["line"] = self.line
        if self.column is not None:
            out["column"] = self.column
        if self.field is not None:
            out["field"] = self.field
        return out


@dataclass
class Definition:
    """One named type a declaration defines."""

    name: str
    kind: str  # struct, union, enum, typedef, function
    node: c_ast.Node
    declaration: str  # canonical C text of this definition alone
    category: str = "/user"
    source: str = "user"


def type_key(node: c_ast.Node) -> str | None:
    """The type name a struct/union/enum node refers to ('struct foo'), or None if anonymous."""
    kind = {c_ast.Struct: "struct", c_ast.Union: "union", c_ast.Enum: "enum"}.get(type(node))
    if kind and node.name:
        return f"{kind} {node.name}"
    return None


def _coord(node: c_ast.Node) -> tuple[int | None, int | None]:
    c = getattr(node, "coord", None)
    return (c.line, c.column) if c is not None and c.file == _FILE else (None, None)


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
                for d in _definitions(_parse(text, cached)):
                    d.category, d.source = category, "builtin"
                    cached[d.name] = d
            cls._builtin_cache[key] = cached
        return cached

    def typedef_names(self) -> list[str]:
        """Every typedef name known (pycparser needs them to parse)."""
        return [n for n, d in self.defs.items() if d.kind == "typedef"]

    def parse(self, text: str) -> list[Definition]:
        """The types `text` defines, in order; DeclarationError when it is not valid C."""
        return _definitions(_parse(text, self.defs))

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
            ast = _parse(f"void __binlens_type({text});", self.defs)
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
                raise DeclarationError("an array cannot have a negative size", *_coord(node))
            if elem.size is None:
                raise DeclarationError(f"array of incomplete type {elem.spelling}", *_coord(node))
            size = None if count is None else elem.size * count
            if size is not None and size >= 1 << 62:
                raise DeclarationError("the array is too large", *_coord(node))
            return CType(kind="array", size=size, align=elem.align, count=count, _target=elem)
        if isinstance(node, c_ast.FuncDecl):
            return self._function(node)
        if isinstance(node, (c_ast.Struct, c_ast.Union, c_ast.Enum)):
            return self.convert_tagged(node)
        raise DeclarationError(f"unsupported type construct {type(node).__name__}", *_coord(node))

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
                raise DeclarationError(f"unknown type name {names[0]!r}", *_coord(node)) from None
        raise DeclarationError(f"invalid type specifiers {' '.join(names)!r}", *_coord(node))

    def _function(self, node: c_ast.FuncDecl) -> CType:
        ret = self.convert(node.type)
        params: list[tuple[str | None, CType]] = []
        variadic = False
        for p in node.args.params if node.args is not None else []:
            if isinstance(p, c_ast.EllipsisParam):
                variadic = True
                continue
            if isinstance(p, c_ast.ID):
                raise DeclarationError("K&R parameter lists are not supported: give each parameter a type", *_coord(p))
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
                raise DeclarationError("an anonymous type needs a body", *_coord(node))
            if isinstance(node, c_ast.Enum) and key not in self.defs:
                raise DeclarationError(f"unknown {key}", *_coord(node))
            return self.resolve(key)
        known = self.defs.get(key) if key is not None else None
        if known is not None and known.node is node:
            return self.resolve(key)  # type: ignore[arg-type]
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
            raise DeclarationError(f"enumerator {bad} does not fit in 64 bits", *_coord(node))
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
            return _literal(node)
        if isinstance(node, c_ast.ID):
            if node.name in local:
                return local[node.name]
            hit = self.enumerator(node.name)
            if hit is None:
                raise DeclarationError(f"{node.name!r} is not a known constant", *_coord(node))
            return hit
        if isinstance(node, c_ast.UnaryOp):
            if node.op == "sizeof":
                t = self.convert(node.expr) if isinstance(node.expr, c_ast.Typename) else None
                if t is None or t.size is None:
                    raise DeclarationError("sizeof needs a complete type name", *_coord(node))
                return t.size
            v = self.constant(node.expr, local)
            ops = {"-": -v, "+": v, "~": ~v, "!": int(not v)}
            if node.op in ops:
                return ops[node.op]
        if isinstance(node, c_ast.BinaryOp):
            a, b = self.constant(node.left, local), self.constant(node.right, local)
            try:
                return _binary(node.op, a, b)
            except ZeroDivisionError:
                raise DeclarationError("division by zero in a constant", *_coord(node)) from None
        if isinstance(node, c_ast.Cast):
            return self.constant(node.expr, local)
        if isinstance(node, c_ast.TernaryOp):
            return self.constant(node.iftrue if self.constant(node.cond, local) else node.iffalse, local)
        raise DeclarationError("not an integer constant expression", *_coord(node))

    def enumerator(self, name: str) -> int | None:
        """The value of an enumerator of any known enum."""
        for key, d in self.defs.items():
            if d.kind != "enum":
                continue
            values = d.node.type.values if isinstance(d.node, c_ast.Decl) else d.node.values
            if values is not None and any(e.name == name for e in values.enumerators):
                return dict(self.resolve(key).enumerators)[name]
        return None


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
        where = _coord(d)
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


def _literal(node: c_ast.Constant) -> int:
    text = node.value
    if node.type == "char":
        body = text[1:-1]
        esc = {"\\n": 10, "\\t": 9, "\\0": 0, "\\r": 13, "\\\\": 92, "\\'": 39}
        return esc.get(body, ord(body[-1]) if body else 0)
    if "int" not in node.type:
        raise DeclarationError(f"{text} is not an integer", *_coord(node))
    t = text.rstrip("uUlL")
    if t.lower().startswith("0x"):
        return int(t, 16)
    if t.lower().startswith("0b"):
        return int(t, 2)
    if len(t) > 1 and t.startswith("0"):
        return int(t, 8)
    return int(t)


def _binary(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return int(a / b)
    if op == "%":
        return a - int(a / b) * b
    if op == "<<":
        return a << b
    if op == ">>":
        return a >> b
    if op == "&":
        return a & b
    if op == "|":
        return a | b
    if op == "^":
        return a ^ b
    cmp = {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b, "==": a == b, "!=": a != b, "&&": a and b}
    if op in cmp:
        return int(bool(cmp[op]))
    if op == "||":
        return int(bool(a or b))
    raise DeclarationError(f"operator {op} is not allowed in a constant")


_PARSER_LOCAL = __import__("threading").local()


def _parser() -> c_parser.CParser:
    p = getattr(_PARSER_LOCAL, "parser", None)
    if p is None:
        p = c_parser.CParser()
        _PARSER_LOCAL.parser = p
    return p


def _parse(text: str, known: dict[str, Definition]) -> c_ast.FileAST:
    """Parse `text` with stand-in typedefs for every known typedef name; keep only text's nodes."""
    if "#" in text:
        raise DeclarationError("preprocessor directives are not supported (write plain declarations)")
    # stand-ins only for the typedef names the text mentions: parsing ~100 of them costs ~20 ms
    words = set(re.findall(r"[A-Za-z_]\w*", text))
    stubs = sorted(n for n in words if (d := known.get(n)) is not None and d.kind == "typedef")
    preamble = "".join(f"typedef int {n};" for n in stubs)
    src = f'{preamble}\n# 1 "{_FILE}"\n{text}\n'
    try:
        ast = _parser().parse(src, filename="<known-types>")
    except c_parser.ParseError as err:
        msg = str(err)
        unknown = _unknown_type_name(text, known)
        if unknown is not None:
            line = text.count("\n", 0, unknown[1]) + 1
            col = unknown[1] - (text.rfind("\n", 0, unknown[1]) + 1) + 1
            parser_msg = re.sub(r"^[^:]*:(\d+:\d+:)?\s*", "", msg)
            raise DeclarationError(
                f"line {line}, column {col}: unknown type name {unknown[0]!r} (parser: {parser_msg})", line, col
            ) from None
        m = re.match(r"^(?:<declaration>)?:?(\d+):(\d+):\s*(.*)$", msg, re.S)
        if m:
            line, col, rest = int(m.group(1)), int(m.group(2)), m.group(3)
            raise DeclarationError(f"line {line}, column {col}: {rest}", line, col) from None
        raise DeclarationError(msg.removeprefix(f"{_FILE}: ").removeprefix(f"{_FILE}:")) from None
    except Exception as err:  # noqa: BLE001 - the lexer raises plain errors on odd bytes
        raise DeclarationError(f"cannot parse: {err}") from None
    ast.ext = [n for n in ast.ext if getattr(n, "coord", None) is not None and n.coord.file == _FILE]
    if _depth(ast) > MAX_DEPTH:
        raise DeclarationError(f"the declaration nests more than {MAX_DEPTH} levels deep")
    return ast


MAX_DEPTH = 200


def _depth(root: c_ast.Node) -> int:
    """How deep the AST goes (iteratively: the later recursive walks then stay bounded)."""
    deepest = 0
    stack = [(root, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            return d
        stack.extend((child, d + 1) for _name, child in node.children())
    return deepest


_KEYWORDS = frozenset(
    [
        "auto",
        "break",
        "case",
        "char",
        "const",
        "continue",
        "default",
        "do",
        "double",
        "else",
        "enum",
        "extern",
        "float",
        "for",
        "goto",
        "if",
        "inline",
        "int",
        "long",
        "register",
        "restrict",
        "return",
        "short",
        "signed",
        "sizeof",
        "static",
        "struct",
        "switch",
        "typedef",
        "union",
        "unsigned",
        "void",
        "volatile",
        "while",
        "_Bool",
        "_Complex",
        "_Atomic",
        "_Alignas",
        "_Noreturn",
        "__int128",
    ]
)


def _unknown_type_name(text: str, known: dict[str, Definition]) -> tuple[str, int] | None:
    """The first identifier used as a type name that no declaration defines (a likely parse error cause)."""
    for m in re.finditer(r"(?<![\w.>])([A-Za-z_]\w*)(?=\s*\*|\s+[A-Za-z_(])", text):
        word = m.group(1)
        before = text[: m.start()].rstrip()
        if word in _KEYWORDS or word in known or re.search(r"\b(struct|union|enum)$", before):
            continue
        if before and before[-1] not in "{;(," and not re.search(r"\b(const|volatile|typedef|extern|static)$", before):
            continue
        return word, m.start()
    return None


def _definitions(ast: c_ast.FileAST) -> list[Definition]:
    gen = c_generator.CGenerator()
    out: list[Definition] = []
    for node in ast.ext:
        line, col = _coord(node)
        if isinstance(node, c_ast.FuncDef):
            raise DeclarationError("a function body is not a declaration: give just the prototype", line, col)
        if isinstance(node, c_ast.Typedef):
            tagged = _inline_tagged(node.type)
            if tagged is not None and type_key(tagged) is not None:
                out.append(_tagged_definition(tagged, gen))
                split = copy.deepcopy(node)
                inner = _inline_tagged(split.type)
                if isinstance(inner, c_ast.Enum):
                    inner.values = None
                else:
                    inner.decls = None
                out.append(Definition(node.name, "typedef", split, gen.visit(split) + ";"))
            else:
                out.append(Definition(node.name, "typedef", node, gen.visit(node) + ";"))
            continue
        if not isinstance(node, c_ast.Decl):
            raise DeclarationError(f"unexpected {type(node).__name__}", line, col)
        if node.name is None:
            if isinstance(node.type, (c_ast.Struct, c_ast.Union, c_ast.Enum)):
                if type_key(node.type) is None:
                    raise DeclarationError("an anonymous struct, union or enum declares nothing: name it", line, col)
                body = node.type.values if isinstance(node.type, c_ast.Enum) else node.type.decls
                if body is None:
                    out.append(_tagged_definition(node.type, gen))  # forward declaration
                    continue
                out.append(_tagged_definition(node.type, gen))
                continue
            raise DeclarationError("this declaration declares nothing", line, col)
        if isinstance(node.type, c_ast.FuncDecl):
            if node.storage and any(s != "extern" for s in node.storage):
                raise DeclarationError(f"storage class {node.storage[0]!r} is not part of a prototype", line, col)
            out.append(Definition(node.name, "function", node, gen.visit(node) + ";"))
            continue
        raise DeclarationError(
            f"{node.name!r} declares a variable, not a type (type data at an address with global_variable.create)",
            line,
            col,
        )
    if not out:
        raise DeclarationError("the declaration is empty")
    # a forward declaration followed by the definition in the same text: keep the definition
    defined = {d.name for d in out if not _is_forward(d)}
    return [d for d in out if not (_is_forward(d) and d.name in defined)]


def _is_forward(d: Definition) -> bool:
    node = d.node.type if isinstance(d.node, c_ast.Decl) else d.node
    if d.kind in ("struct", "union"):
        return getattr(node, "decls", None) is None
    if d.kind == "enum":
        return getattr(node, "values", None) is None
    return False


def _inline_tagged(node: c_ast.Node) -> c_ast.Node | None:
    while isinstance(node, c_ast.TypeDecl):
        node = node.type
    if isinstance(node, (c_ast.Struct, c_ast.Union)) and node.decls is not None:
        return node
    if isinstance(node, c_ast.Enum) and node.values is not None:
        return node
    return None


def _tagged_definition(node: c_ast.Node, gen: c_generator.CGenerator) -> Definition:
    key = type_key(node)
    assert key is not None
    return Definition(key, key.split(" ")[0], node, gen.visit(node) + ";")


def dataclasses_replace(t: CType, **kw: Any) -> CType:
    """A copy of `t` with some fields changed."""
    import dataclasses

    return dataclasses.replace(t, **kw)
