"""function.patch/create/delete and function_parameter.*: names, prototypes and user-defined functions.

Prototypes are kept by address in the annotation store, so they work before (and without) the
analysis engine. When the engine is attached (`prog.extensions["analysis"]`) its
`function_at(va)` decides what a function is, and `define_function(va)` /
`undefine_function(va)` carry out function.create / function.delete; without it a function is
an address with a function symbol, an export, the entry point, or a user definition.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Annotated, Any

from pydantic import Field

from binlens.api.edits import EditResult, abi_of, edit, engine, name_change, refresh, settle_analysis, store, types
from binlens.api.models import HexAddress, Params, ProgramRef, Result, Selector
from binlens.api.registry import DESTRUCTIVE, MUTATION, READ_ONLY, CallContext, method
from binlens.api.symbol_edit import selected_address
from binlens.cdecl import DeclarationError
from binlens.errors import BinlensError
from binlens.store.annotations import Change
from binlens.workspace import Program, Workspace

TypeText = Annotated[str, Field(min_length=1, max_length=1024, description="A C type name, e.g. 'const char *'.")]
ParamName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
DEFAULT_RETURN = "int"


class Parameter(Result):
    """One named, typed parameter."""

    ordinal: int
    name: str
    type: str


class Prototype(Result):
    """A function's prototype."""

    return_type: str
    calling_convention: str
    parameters: list[Parameter]
    variadic: bool
    declaration: str = Field(description="The prototype as C.")


class FunctionEdited(EditResult):
    """A function's name and prototype after an edit."""

    address: HexAddress
    name: str | None
    prototype: Prototype | None


class FunctionPatchParams(Params):
    """A new name and/or prototype for a function."""

    program: ProgramRef | None = None
    selector: Selector
    name: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(None, description="New name.")
    prototype: Annotated[str, Field(min_length=1, max_length=8192)] | None = Field(
        None, description="A C prototype, e.g. 'int add(int a, int b)'; its name also renames the function."
    )
    return_type: TypeText | None = None
    calling_convention: Annotated[str, Field(min_length=1, max_length=32)] | None = None


class FunctionCreateParams(Params):
    """Where to define a function, and its name."""

    program: ProgramRef | None = None
    selector: Selector
    name: Annotated[str, Field(min_length=1, max_length=1024)] | None = None


class FunctionRef(Params):
    """The function a selector names."""

    program: ProgramRef | None = None
    selector: Selector


class ParameterCreateParams(Params):
    """A parameter to add to a function's prototype."""

    program: ProgramRef | None = None
    function: Selector
    name: ParamName
    type: TypeText
    ordinal: int | None = Field(None, ge=0, le=255, description="Insert at this position (default: append).")


class ParameterPatchParams(Params):
    """A parameter to rename or retype."""

    program: ProgramRef | None = None
    function: Selector
    ordinal: int = Field(ge=0, le=255)
    name: ParamName | None = None
    type: TypeText | None = None


class ParameterDeleteParams(Params):
    """A parameter to remove."""

    program: ProgramRef | None = None
    function: Selector
    ordinal: int = Field(ge=0, le=255)


def is_function(prog: Program, va: int, conn: sqlite3.Connection | None = None) -> bool:
    """Whether `va` starts a function (engine, user definition, symbol, export or entry point)."""
    state = store(prog).get(conn or prog.db.connect(), "function", (va,))
    if state is not None:
        return state["state"] == "defined"
    analysis = engine(prog)
    if analysis is not None:
        return analysis.function_at(va) is not None
    img = prog.image
    if va == img.identity.entry:
        return True
    if any(s.address == va and s.kind == "function" for s in img.symbols):
        return True
    if any(s.address == va and s.kind == "object" for s in img.symbols):
        return False
    sec = img.section_at(va)
    return sec is not None and sec.kind == "code" and any(e.address == va for e in img.exports)


def function_address(prog: Program, selector: Selector, base: str = "/params/selector") -> int:
    """The function a selector names, or `not_found`."""
    va = selected_address(prog, selector) if base == "/params/selector" else _sel(prog, selector, base)
    if not is_function(prog, va):
        raise BinlensError("not_found", f"no function at {hex(va)}", target=base)
    return va


def _sel(prog: Program, selector: Selector, base: str) -> int:
    if selector.name is not None:
        return prog.resolve(selector.name, f"{base}/name")
    return prog.resolve(selector.address or "", f"{base}/address")


def load_prototype(prog: Program, va: int, conn: sqlite3.Connection | None = None) -> dict[str, Any] | None:
    """The stored prototype of the function at `va` (return_type, calling_convention, parameters, variadic)."""
    row = store(prog).get(conn or prog.db.connect(), "prototype", (va,))
    return json.loads(row["prototype"]) if row else None


def _proto_value(proto: dict[str, Any]) -> dict[str, Any]:
    return {"prototype": json.dumps(proto, sort_keys=True, separators=(",", ":"))}


def render_prototype(prog: Program, va: int, proto: dict[str, Any] | None) -> Prototype | None:
    """The wire form of a stored prototype, with its C spelling."""
    if proto is None:
        return None
    params = [Parameter(ordinal=i, name=q["name"], type=q["type"]) for i, q in enumerate(proto["parameters"])]
    args = [
        f"{q['type']} {q['name']}" if not q["type"].endswith("*") else f"{q['type']}{q['name']}"
        for q in proto["parameters"]
    ]
    if proto["variadic"]:
        args.append("...")
    cc = "" if proto["calling_convention"] == "default" else f"__{proto['calling_convention']} "
    name = prog.name_at(va) or f"FUN_{va:x}"
    text = f"{proto['return_type']} {cc}{name}({', '.join(args) if args else 'void'})"
    return Prototype(
        return_type=proto["return_type"],
        calling_convention=proto["calling_convention"],
        parameters=params,
        variadic=proto["variadic"],
        declaration=text,
    )


def _type(prog: Program, text: str, target: str, *, allow_void: bool = False) -> str:
    try:
        t = types(prog).parse_type_name(text)
    except DeclarationError as err:
        raise BinlensError(
            "invalid_argument", f"bad C type {text!r}: {err.message}", target=target, details=err.details()
        ) from None
    if t.kind == "function":
        raise BinlensError(
            "invalid_argument", "a function type here must be a pointer: write 'int (*)(int)'", target=target
        )
    if t.size is None and not (allow_void and t.strip().kind == "scalar" and t.strip().name == "void"):
        raise BinlensError("invalid_argument", f"{t.spelling} is incomplete here", target=target)
    return t.spelling


def _convention(prog: Program, cc: str, target: str) -> str:
    allowed = abi_of(prog).conventions
    if cc not in allowed:
        raise BinlensError(
            "invalid_argument", f"calling convention {cc!r} is not one of {', '.join(allowed)}", target=target
        )
    return cc


def _from_c(prog: Program, text: str) -> tuple[str | None, dict[str, Any]]:
    """(name, prototype) from a C prototype."""
    src = text.strip().rstrip(";") + ";"
    try:
        defs = types(prog).parse(src)
    except DeclarationError as err:
        raise BinlensError(
            "invalid_argument", f"bad C prototype: {err.message}", target="/params/prototype", details=err.details()
        ) from None
    if len(defs) != 1 or defs[0].kind != "function":
        raise BinlensError("invalid_argument", "give exactly one function prototype", target="/params/prototype")
    try:
        ft = types(prog).convert(defs[0].node.type)
    except DeclarationError as err:
        raise BinlensError(
            "invalid_argument", f"bad C prototype: {err.message}", target="/params/prototype", details=err.details()
        ) from None
    params = []
    for i, (pname, pt) in enumerate(ft.params):
        if pt.size is None:
            raise BinlensError(
                "invalid_argument", f"parameter {i} has incomplete type {pt.spelling}", target="/params/prototype"
            )
        params.append({"name": pname or f"param_{i + 1}", "type": pt.spelling})
    ret = ft.target.spelling if ft.target is not None else "void"
    names = [q["name"] for q in params]
    if len(set(names)) != len(names):
        raise BinlensError("conflict", "two parameters share a name", target="/params/prototype")
    return defs[0].name, {
        "return_type": ret,
        "calling_convention": "default",
        "parameters": params,
        "variadic": ft.variadic,
    }


def _edited(prog: Program, va: int, entry: int | None) -> FunctionEdited:
    return FunctionEdited(
        journal_id=entry,
        address=hex(va),
        name=prog.name_at(va),
        prototype=render_prototype(prog, va, load_prototype(prog, va)),
    )


@method("function.patch", effect=MUTATION)
def function_patch(ws: Workspace, p: FunctionPatchParams, ctx: CallContext) -> FunctionEdited:
    """Rename a function and/or set its prototype (C text, return type, calling convention); clashes are `conflict`."""
    prog = ws.program(p.program)
    refresh(prog)
    va = function_address(prog, p.selector)
    new_name = p.name
    proto = None
    if p.prototype is not None:
        declared, proto = _from_c(prog, p.prototype)
        if new_name is None and declared != (prog.name_at(va) or ""):
            new_name = declared
    ret = _type(prog, p.return_type, "/params/return_type", allow_void=True) if p.return_type else None
    cc = _convention(prog, p.calling_convention, "/params/calling_convention") if p.calling_convention else None
    if new_name is None and proto is None and ret is None and cc is None:
        raise BinlensError(
            "invalid_argument", "give a name, prototype, return_type or calling_convention", target="/params"
        )

    def plan(conn: sqlite3.Connection) -> list[Change]:
        changes: list[Change] = []
        if new_name is not None:
            changes.append(name_change(prog, conn, va, new_name, "/params/name" if p.name else "/params/prototype"))
        current = load_prototype(prog, va, conn) or _default()
        updated = dict(proto) if proto is not None else dict(current)
        if proto is not None and cc is None:
            updated["calling_convention"] = current["calling_convention"]
        if ret is not None:
            updated["return_type"] = ret
        if cc is not None:
            updated["calling_convention"] = cc
        if proto is not None or ret is not None or cc is not None:
            changes.append(("prototype", (va,), _proto_value(updated)))
        return changes

    entry = edit(prog, ctx, "function.patch", f"patch function at {hex(va)}", plan)
    return _edited(prog, va, entry)


def _default() -> dict[str, Any]:
    return {"return_type": DEFAULT_RETURN, "calling_convention": "default", "parameters": [], "variadic": False}


class FunctionPrototypeParams(Params):
    """The function whose prototype to read."""

    program: ProgramRef | None = None
    selector: Selector


@method("function_prototype.get", effect=READ_ONLY)
def function_prototype_get(ws: Workspace, p: FunctionPrototypeParams) -> FunctionEdited:
    """A function's name and the prototype the user gave it (null if none yet)."""
    prog = ws.program(p.program)
    refresh(prog)
    va = function_address(prog, p.selector)
    return _edited(prog, va, None)


def _param_edit(ws: Workspace, p: Any, ctx: CallContext, method_name: str, change: Any) -> FunctionEdited:
    prog = ws.program(p.program)
    refresh(prog)
    va = function_address(prog, p.function, "/params/function")

    def plan(conn: sqlite3.Connection) -> list[Change]:
        proto = load_prototype(prog, va, conn) or _default()
        proto = {**proto, "parameters": [dict(q) for q in proto["parameters"]]}
        change(proto["parameters"])
        names = [q["name"] for q in proto["parameters"]]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise BinlensError("conflict", f"the function already has a parameter named {dup!r}", target="/params/name")
        return [("prototype", (va,), _proto_value(proto))]

    entry = edit(prog, ctx, method_name, f"{method_name.split('.')[1]} parameter of {hex(va)}", plan)
    return _edited(prog, va, entry)


@method("function_parameter.create", effect=MUTATION)
def function_parameter_create(ws: Workspace, p: ParameterCreateParams, ctx: CallContext) -> FunctionEdited:
    """Add a named, typed parameter to a function's prototype (appended, or inserted at `ordinal`)."""
    prog = ws.program(p.program)
    spelling = _type(prog, p.type, "/params/type")

    def change(params: list[dict[str, Any]]) -> None:
        at = len(params) if p.ordinal is None else p.ordinal
        if at > len(params):
            raise BinlensError(
                "invalid_argument", f"ordinal {at} is past the {len(params)} parameters", target="/params/ordinal"
            )
        params.insert(at, {"name": p.name, "type": spelling})

    return _param_edit(ws, p, ctx, "function_parameter.create", change)


@method("function_parameter.patch", effect=MUTATION)
def function_parameter_patch(ws: Workspace, p: ParameterPatchParams, ctx: CallContext) -> FunctionEdited:
    """Rename and/or retype one parameter; `not_found` if the ordinal does not exist."""
    prog = ws.program(p.program)
    if p.name is None and p.type is None:
        raise BinlensError("invalid_argument", "give a new name or type", target="/params")
    spelling = _type(prog, p.type, "/params/type") if p.type is not None else None

    def change(params: list[dict[str, Any]]) -> None:
        if p.ordinal >= len(params):
            raise BinlensError("not_found", f"no parameter {p.ordinal}", target="/params/ordinal")
        if p.name is not None:
            params[p.ordinal]["name"] = p.name
        if spelling is not None:
            params[p.ordinal]["type"] = spelling

    return _param_edit(ws, p, ctx, "function_parameter.patch", change)


@method("function_parameter.delete", effect=DESTRUCTIVE)
def function_parameter_delete(ws: Workspace, p: ParameterDeleteParams, ctx: CallContext) -> FunctionEdited:
    """Remove one parameter from a function's prototype; `not_found` if the ordinal does not exist."""

    def change(params: list[dict[str, Any]]) -> None:
        if p.ordinal >= len(params):
            raise BinlensError("not_found", f"no parameter {p.ordinal}", target="/params/ordinal")
        del params[p.ordinal]

    return _param_edit(ws, p, ctx, "function_parameter.delete", change)


@method("function.create", effect=MUTATION)
def function_create(ws: Workspace, p: FunctionCreateParams, ctx: CallContext) -> FunctionEdited:
    """Define a function at an address (the engine re-runs local analysis); `conflict` if one is there."""
    prog = ws.program(p.program)
    refresh(prog)
    analysis = _need_engine(prog)
    settle_analysis(prog, ctx)
    va = selected_address(prog, p.selector)
    if not prog.image.is_mapped(va):
        raise BinlensError("invalid_argument", f"{hex(va)} is not mapped", target="/params/selector")

    def plan(conn: sqlite3.Connection) -> list[Change]:
        if is_function(prog, va, conn):
            raise BinlensError("conflict", f"a function already starts at {hex(va)}", target="/params/selector")
        changes: list[Change] = [("function", (va,), {"state": "defined"})]
        if p.name is not None:
            changes.append(name_change(prog, conn, va, p.name, "/params/name"))
        return changes

    entry = edit(prog, ctx, "function.create", f"define a function at {hex(va)}", plan)
    analysis.define_function(va)
    return _edited(prog, va, entry)


@method("function.delete", effect=DESTRUCTIVE)
def function_delete(ws: Workspace, p: FunctionRef, ctx: CallContext) -> FunctionEdited:
    """Undefine the function at an address (the engine re-runs local analysis); `not_found` if none."""
    prog = ws.program(p.program)
    refresh(prog)
    analysis = _need_engine(prog)
    settle_analysis(prog, ctx)
    va = function_address(prog, p.selector)
    entry = edit(
        prog,
        ctx,
        "function.delete",
        f"undefine the function at {hex(va)}",
        lambda conn: [("function", (va,), {"state": "undefined"})],
    )
    analysis.undefine_function(va)
    return _edited(prog, va, entry)


def _need_engine(prog: Program) -> Any:
    analysis = engine(prog)
    if analysis is None:
        raise BinlensError(
            "unavailable", "defining and undefining functions needs the analysis engine, which is not attached"
        )
    return analysis
