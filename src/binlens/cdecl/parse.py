"""Parsing C declarations with pycparser: stand-in typedefs, error positions, one Definition per type."""

from __future__ import annotations

import copy
import re
import threading
from dataclasses import dataclass
from typing import Any, Literal

from pycparser import c_ast, c_generator, c_parser

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


DefinitionKind = Literal["struct", "union", "enum", "typedef", "function"]
_TAG_KINDS: dict[str, DefinitionKind] = {"struct": "struct", "union": "union", "enum": "enum"}


@dataclass
class Definition:
    """One named type a declaration defines."""

    name: str
    kind: DefinitionKind
    node: c_ast.Node
    declaration: str  # canonical C text of this definition alone
    category: str = "/user"
    source: Literal["builtin", "user"] = "user"


def type_key(node: c_ast.Node) -> str | None:
    """The type name a struct/union/enum node refers to ('struct foo'), or None if anonymous."""
    kind = {c_ast.Struct: "struct", c_ast.Union: "union", c_ast.Enum: "enum"}.get(type(node))
    if kind and node.name:
        return f"{kind} {node.name}"
    return None


def coord(node: c_ast.Node) -> tuple[int | None, int | None]:
    c = getattr(node, "coord", None)
    return (c.line, c.column) if c is not None and c.file == _FILE else (None, None)


def literal(node: c_ast.Constant) -> int:
    text = node.value
    if node.type == "char":
        body = text[1:-1]
        esc = {"\\n": 10, "\\t": 9, "\\0": 0, "\\r": 13, "\\\\": 92, "\\'": 39}
        return esc.get(body, ord(body[-1]) if body else 0)
    if "int" not in node.type:
        raise DeclarationError(f"{text} is not an integer", *coord(node))
    t = text.rstrip("uUlL")
    if t.lower().startswith("0x"):
        return int(t, 16)
    if t.lower().startswith("0b"):
        return int(t, 2)
    if len(t) > 1 and t.startswith("0"):
        return int(t, 8)
    return int(t)


def binary_op(op: str, a: int, b: int) -> int:
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


_PARSER_LOCAL = threading.local()


def _parser() -> c_parser.CParser:
    p = getattr(_PARSER_LOCAL, "parser", None)
    if p is None:
        p = c_parser.CParser()
        _PARSER_LOCAL.parser = p
    return p


def parse_text(text: str, known: dict[str, Definition]) -> c_ast.FileAST:
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


def definitions(ast: c_ast.FileAST) -> list[Definition]:
    gen = c_generator.CGenerator()
    out: list[Definition] = []
    for node in ast.ext:
        line, col = coord(node)
        if isinstance(node, c_ast.FuncDef):
            raise DeclarationError("a function body is not a declaration: give just the prototype", line, col)
        if isinstance(node, c_ast.Typedef):
            tagged = _inline_tagged(node.type)
            if tagged is not None and type_key(tagged) is not None:
                out.append(_tagged_definition(tagged, gen))
                split = copy.deepcopy(node)
                inner = _inline_tagged(split.type)
                assert inner is not None  # a copy of `tagged`'s typedef
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
    return Definition(key, _TAG_KINDS[key.split(" ")[0]], node, gen.visit(node) + ";")
