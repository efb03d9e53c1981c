"""data_type.* and data_type_category.*: C types declared by the user, plus built-in, libc and Win32 types."""

from __future__ import annotations

import fnmatch
import re
import sqlite3
from typing import Annotated, Literal

from pydantic import Field

from binlens.api.edits import EditResult, abi_of, edit, refresh, store, types
from binlens.api.models import Listing, Page, Params, ProgramRef, Result
from binlens.api.pages import page_by_offset
from binlens.api.registry import DESTRUCTIVE, MUTATION, READ_ONLY, CallContext, method
from binlens.cdecl import CType, DeclarationError, Definition, TypeSystem
from binlens.cdecl.abi import SCALARS
from binlens.errors import BinlensError
from binlens.store.annotations import Change, last_data_type_position
from binlens.workspace import Program, Workspace

TypeName = Annotated[str, Field(min_length=1, max_length=256, description="'struct foo', 'foo_t', 'int', ...")]
Declaration = Annotated[
    str,
    Field(
        min_length=1,
        max_length=65536,
        description="C declarations: struct, union, enum, typedef or function prototypes, e.g. "
        "'struct point { int x; int y; };'",
    ),
]
CategoryPath = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^/[^\x00-\x1f]*$")]
TypeKind = Literal["scalar", "struct", "union", "enum", "typedef", "function"]


class TypeMember(Result):
    """A struct/union member with its byte offset (and bit position for bit-fields)."""

    name: str | None
    type: str
    offset: int
    size: int | None
    bit_offset: int | None = None
    bit_size: int | None = None


class Enumerator(Result):
    """One enum constant."""

    name: str
    value: int


class TypeParameter(Result):
    """One parameter of a function type."""

    name: str | None
    type: str


class DataTypeItem(Result):
    """A C type laid out for the program's ABI."""

    name: str
    kind: TypeKind
    category: str
    source: Literal["builtin", "user"]
    size: int | None = Field(description="Bytes; null for incomplete types and functions.")
    alignment: int
    declaration: str
    fields: list[TypeMember] | None = None
    enumerators: list[Enumerator] | None = None
    target: str | None = Field(None, description="The type a typedef names.")
    return_type: str | None = None
    parameters: list[TypeParameter] | None = None
    variadic: bool | None = None


class DataTypeEdited(EditResult):
    """The types a declaration defined or replaced."""

    items: list[DataTypeItem]


class DataTypeGetParams(Params):
    """One type by name."""

    program: ProgramRef | None = None
    name: TypeName


class DataTypeListParams(Params):
    """Filters and paging of data_type.list."""

    program: ProgramRef | None = None
    category: CategoryPath | None = Field(None, description="Only this category and its subcategories.")
    kind: TypeKind | None = None
    source: Literal["builtin", "user"] | None = None
    name: str | None = Field(None, max_length=256, description="Glob on the type name.")
    page: Page = Page()


class DataTypeWriteParams(Params):
    """C declarations to add or replace, and their category."""

    program: ProgramRef | None = None
    declaration: Declaration
    category: CategoryPath = "/user"


class DataTypePatchParams(Params):
    """A user type to redefine or move."""

    program: ProgramRef | None = None
    name: TypeName
    declaration: Declaration | None = Field(None, description="The new definition (it must define `name`).")
    category: CategoryPath | None = None


class DataTypeDeleteParams(Params):
    """A user type to delete."""

    program: ProgramRef | None = None
    name: TypeName


class CategoryItem(Result):
    """A type category and how many types it holds."""

    path: str
    types: int


class CategoryListParams(Params):
    """The program whose type categories to list."""

    program: ProgramRef | None = None


def describe(ts: TypeSystem, name: str) -> DataTypeItem:
    """A type's record: layout, members, enumerators or signature."""
    t = ts.resolve(name)
    d = ts.defs.get(name)
    item = DataTypeItem(
        name=name,
        kind="scalar" if d is None else d.kind,
        category="/builtin" if d is None else d.category,
        source="builtin" if d is None else d.source,
        size=t.size,
        alignment=t.align,
        declaration=name if d is None else d.declaration,
    )
    if t.kind in ("struct", "union") and t.fields is not None:
        item.fields = [
            TypeMember(
                name=f.name,
                type=f.type.spelling,
                offset=f.offset,
                size=f.type.size,
                bit_offset=f.bit_offset,
                bit_size=f.bit_size,
            )
            for f in t.fields
        ]
    if t.kind == "enum":
        item.enumerators = [Enumerator(name=n, value=v) for n, v in t.enumerators]
    if t.kind == "typedef" and t.target is not None:
        item.target = t.target.spelling
    if t.kind == "function":
        item.return_type = t.target.spelling if t.target is not None else "void"
        item.parameters = [TypeParameter(name=n, type=pt.spelling) for n, pt in t.params]
        item.variadic = t.variadic
    return item


def _bad_declaration(err: DeclarationError, target: str = "/params/declaration") -> BinlensError:
    return BinlensError("invalid_argument", f"bad C declaration: {err.message}", target=target, details=err.details())


def _system_from(prog: Program, conn: sqlite3.Connection) -> TypeSystem:
    rows = sorted(store(prog).rows("data_type", conn), key=lambda kv: kv[1]["position"])
    return TypeSystem(abi_of(prog), [(k[0], v["kind"], v["category"], v["declaration"]) for k, v in rows])


def _check_all(ts: TypeSystem, new: list[Definition]) -> None:
    """Lay out the new types (errors point into the declaration), then every user type they may break."""
    for d in new:
        try:
            _layout(ts, d.name)
        except DeclarationError as err:
            raise _bad_declaration(err) from None
    mentions = re.compile("|".join(r"(?<!\w)" + r"\s+".join(map(re.escape, d.name.split())) + r"(?!\w)" for d in new))
    for name, d in ts.defs.items():
        if d.source != "user" or any(n.name == name for n in new) or not mentions.search(d.declaration):
            continue  # only types that mention a changed one can break
        try:
            _layout(ts, name)
        except (DeclarationError, KeyError) as err:
            raise BinlensError(
                "conflict",
                f"this change would break {name}: {err}",
                target="/params/declaration",
                details={"type": name},
            ) from None


def _layout(ts: TypeSystem, name: str) -> CType:
    t = ts.resolve(name)
    # walk members so errors in nested types surface now, not when a global is read
    stack = [t]
    seen: set[int] = set()
    while stack:
        cur = stack.pop().strip()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        if cur.fields:
            stack += [f.type for f in cur.fields]
        if cur.kind == "array" and cur.target is not None:
            stack.append(cur.target)
    return t


def _write_types(
    prog: Program,
    ctx: CallContext,
    method_name: str,
    text: str,
    category: str | None,
    mode: str,
    name: str | None = None,
) -> DataTypeEdited:
    """Create (mode 'create'), replace (mode 'patch', of `name`) or upsert the types `text` declares."""
    defined: list[str] = []

    def plan(conn: sqlite3.Connection) -> list[Change]:
        ts = _system_from(prog, conn)
        try:
            new = ts.parse(text)
        except DeclarationError as err:
            raise _bad_declaration(err) from None
        names = [d.name for d in new]
        if len(set(names)) != len(names):
            raise BinlensError("invalid_argument", "the declaration defines a type twice", target="/params/declaration")
        if mode == "patch" and name not in names:
            raise BinlensError(
                "invalid_argument", f"the declaration does not define {name!r}", target="/params/declaration"
            )
        changes: list[Change] = []
        pos = last_data_type_position(conn)
        for d in new:
            have = ts.defs.get(d.name)
            if d.name in SCALARS or (have is not None and have.source == "builtin"):
                raise BinlensError(
                    "conflict", f"{d.name} is a built-in type; choose another name", target="/params/declaration"
                )
            current = store(prog).get(conn, "data_type", (d.name,))
            if mode == "create" and current is not None:
                raise BinlensError(
                    "conflict", f"type {d.name} already exists (patch or upsert it)", target="/params/declaration"
                )
            if current is not None:
                pos_d = current["position"]  # a redefinition keeps its place in the list
            else:
                pos += 1
                pos_d = pos
            cat = category or (current["category"] if current else "/user")
            d.category = cat
            changes.append(
                (
                    "data_type",
                    (d.name,),
                    {"kind": d.kind, "category": cat, "declaration": d.declaration, "position": pos_d},
                )
            )
        ts.add(new)
        _check_all(ts, new)
        defined.extend(names)
        return changes

    entry = edit(prog, ctx, method_name, f"{mode} type(s) from a declaration", plan)
    ts = types(prog)
    return DataTypeEdited(journal_id=entry, items=[describe(ts, n) for n in defined])


@method("data_type.get", effect=READ_ONLY)
def data_type_get(ws: Workspace, p: DataTypeGetParams) -> DataTypeItem:
    """One type by name ('struct foo', 'foo_t', 'int'): size, alignment, members with offsets."""
    prog = ws.program(p.program)
    refresh(prog)
    ts = types(prog)
    name = " ".join(p.name.split())
    if name not in SCALARS and name not in ts.defs:
        raise BinlensError("not_found", f"no type named {p.name!r}", target="/params/name")
    try:
        return describe(ts, name)
    except KeyError:
        raise BinlensError("not_found", f"no type named {p.name!r}", target="/params/name") from None
    except DeclarationError as err:
        raise BinlensError(
            "invalid_argument", f"type {p.name} cannot be laid out: {err.message}", target="/params/name"
        ) from None


def all_type_names(ts: TypeSystem) -> list[str]:
    """Scalars first, then declared types by category and name."""
    named = sorted(ts.defs, key=lambda n: (ts.defs[n].category, n))
    return [n for n in SCALARS] + [n for n in named if ts.defs[n].node is not None and ts.defs[n].declaration]


@method("data_type.list", effect=READ_ONLY)
def data_type_list(ws: Workspace, p: DataTypeListParams) -> Listing[DataTypeItem]:
    """List types (C scalars, libc and Win32 types, the user's) by category, kind, source and name glob."""
    prog = ws.program(p.program)
    refresh(prog)
    ts = types(prog)
    names = []
    for n in all_type_names(ts):
        d = ts.defs.get(n)
        cat, kind, src = ("/builtin", "scalar", "builtin") if d is None else (d.category, d.kind, d.source)
        if p.category and not (cat == p.category or cat.startswith(p.category.rstrip("/") + "/")):
            continue
        if (p.kind and kind != p.kind) or (p.source and src != p.source):
            continue
        if p.name and not fnmatch.fnmatchcase(n, p.name):
            continue
        names.append(n)
    page, cursor = page_by_offset(prog, p, names, p.page)
    items = []
    for n in page:
        try:
            items.append(describe(ts, n))
        except (DeclarationError, KeyError):
            continue
    return Listing[DataTypeItem](items=items, next_cursor=cursor)


@method("data_type.create", effect=MUTATION)
def data_type_create(ws: Workspace, p: DataTypeWriteParams, ctx: CallContext) -> DataTypeEdited:
    """Declare new types in C; `conflict` if a name exists, `invalid_argument` with the parser's message if bad."""
    return _write_types(ws.program(p.program), ctx, "data_type.create", p.declaration, p.category, "create")


@method("data_type.upsert", effect=MUTATION)
def data_type_upsert(ws: Workspace, p: DataTypeWriteParams, ctx: CallContext) -> DataTypeEdited:
    """Declare types in C, replacing any user types of the same names."""
    return _write_types(ws.program(p.program), ctx, "data_type.upsert", p.declaration, p.category, "upsert")


@method("data_type.patch", effect=MUTATION)
def data_type_patch(ws: Workspace, p: DataTypePatchParams, ctx: CallContext) -> DataTypeEdited:
    """Redefine a user type (its declaration must define the same name) or move it to another category."""
    prog = ws.program(p.program)
    refresh(prog)
    name = " ".join(p.name.split())
    current = store(prog).get(prog.db.connect(), "data_type", (name,))
    if current is None:
        ts = types(prog)
        if name in SCALARS or name in ts.defs:
            raise BinlensError("conflict", f"{name} is a built-in type and cannot be changed", target="/params/name")
        raise BinlensError("not_found", f"no user type named {p.name!r}", target="/params/name")
    if p.declaration is None and p.category is None:
        raise BinlensError("invalid_argument", "give a new declaration or category", target="/params")
    text = p.declaration if p.declaration is not None else current["declaration"]
    return _write_types(prog, ctx, "data_type.patch", text, p.category, "patch", name)


@method("data_type.delete", effect=DESTRUCTIVE)
def data_type_delete(ws: Workspace, p: DataTypeDeleteParams, ctx: CallContext) -> EditResult:
    """Delete a user type; `conflict` if other types, globals or prototypes still use it."""
    prog = ws.program(p.program)
    name = " ".join(p.name.split())

    def plan(conn: sqlite3.Connection) -> list[Change]:
        if store(prog).get(conn, "data_type", (name,)) is None:
            raise BinlensError("not_found", f"no user type named {p.name!r}", target="/params/name")
        pattern = re.compile(r"(?<![\w])" + r"\s+".join(map(re.escape, name.split())) + r"(?![\w])")
        st = store(prog)
        users = [k[0] for k, v in st.rows("data_type", conn) if k[0] != name and pattern.search(v["declaration"])]
        users += [f"global at {hex(k[0])}" for k, v in st.rows("global", conn) if pattern.search(v["type"])]
        users += [f"prototype at {hex(k[0])}" for k, v in st.rows("prototype", conn) if pattern.search(v["prototype"])]
        if users:
            raise BinlensError(
                "conflict",
                f"{name} is still used by {', '.join(users[:5])}",
                target="/params/name",
                details={"used_by": users},
            )
        return [("data_type", (name,), None)]

    return EditResult(journal_id=edit(prog, ctx, "data_type.delete", f"delete type {name}", plan))


@method("data_type_category.list", effect=READ_ONLY)
def data_type_category_list(ws: Workspace, p: CategoryListParams) -> Listing[CategoryItem]:
    """List type categories ('/builtin', '/libc', '/win32', the user's) with their type counts."""
    prog = ws.program(p.program)
    refresh(prog)
    ts = types(prog)
    counts: dict[str, int] = {"/builtin": len(SCALARS)}
    for n in all_type_names(ts):
        d = ts.defs.get(n)
        if d is not None:
            counts[d.category] = counts.get(d.category, 0) + 1
    return Listing[CategoryItem](items=[CategoryItem(path=c, types=n) for c, n in sorted(counts.items())])
