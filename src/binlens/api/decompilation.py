"""decompilation.* and function_local_variable.*: a function as C-like code from a decompiler provider.

binlens's analysis names the function's blocks, callees and annotations; the provider (angr)
decompiles from those, in its own process. A result is cached in the program database under a
digest of everything the provider was given (`store/decompilation.py`), so an edit to a name,
prototype or local variable the function depends on makes the next call decompile again, and
nothing else does. Comments are laid over the code at their lines on every call, so they never
cost a decompilation.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, cast

from pydantic import Field

from binlens.api.analysis import select_function
from binlens.api.disassembly import ProviderBinding
from binlens.api.edits import EditResult, comments_in, parse_type, put_row, refresh, store
from binlens.api.function_edit import load_prototype, render_prototype
from binlens.api.models import HexAddress, Listing, Params, ProgramRef, Result, Selector
from binlens.api.registry import MUTATION, READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of, name_for_address
from binlens.providers import registry as providers
from binlens.providers.base import DecompilerSession
from binlens.store import decompilation as cache
from binlens.store.analysis import AnalysisView, FunctionRow
from binlens.store.annotations import local_variable_rows
from binlens.workspace import Program, Workspace

MAX_PAGE = 1 << 20
DATA_REFS = ("read", "write", "offset", "pointer", "string")
MAX_CALLEES = 16  # callees whose code goes to the provider with the function
MAX_CALLEE_BYTES = 64 * 1024
# Part of every request, so of the cache key: bump it when what the provider does with a request
# changes (a stored result of the older code is then decompiled again).
REQUEST_FORMAT = 5
_STORAGE = r"^[\x21-\x7e]{1,64}$"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")

ProviderChoice = Field(
    "auto",
    min_length=1,
    max_length=64,
    pattern=r"^[a-z][a-z0-9_-]*$",
    description="'auto' (the first available decompiler in provider.list order) or a provider id.",
)


class DecompilationGetParams(Params):
    """Which function to decompile, with which provider, and which page of its text."""

    program: ProgramRef | None = None
    selector: Selector = Field(description="The function (its entry, an address inside it, or its name).")
    provider: str = ProviderChoice
    timeout_ms: int = Field(30000, ge=100, le=600000, description="How long the analysis and the provider may take.")
    offset: int = Field(0, ge=0, description="Byte offset (UTF-8) of the code page to return.")
    max_bytes: int = Field(65536, ge=1024, le=MAX_PAGE, description="At most this many bytes of code per page.")


class CodeLine(Result):
    """One line of the code and the instructions it came from."""

    line: int = Field(description="1-based line number in the whole code.")
    addresses: list[HexAddress]


class LocalVariable(Result):
    """A parameter or local variable of the decompiled function."""

    name: str
    type: str | None = None
    storage: str = Field(description="Where it lives, as the provider names it ('arg:0', 'rcx', '[bp-0x18]'): its key.")


class DecompilationResult(Result):
    """A function as C-like code. Approximate: it is never the program's source."""

    function: HexAddress
    name: str
    provider: ProviderBinding
    code: str = Field(description="This page of the code (the whole code when it fits one page).")
    offset: int = Field(description="Byte offset of this page in the code.")
    next_offset: int | None = Field(description="Offset of the next page; null on the last one.")
    fragment: bool = Field(description="True when this page is not the whole code.")
    lines: list[CodeLine] = Field(description="Lines of this page that came from instructions.")
    variables: list[LocalVariable]
    warnings: list[str]
    cached: bool = Field(description="Served from the program database without running the provider.")


def _request(prog: Program, view: AnalysisView, f: FunctionRow) -> dict[str, Any]:
    """What the provider is given for `f`: its regions, names of it and its callees, prototypes and
    the user's local variables. Its digest is the cache key's input part."""
    regions = _regions(view, f)
    callees = sorted({callee for _site, callee in view.callees(f.address)} - {f.address})
    related = [f.address, *callees]
    names: dict[str, str] = {}
    prototypes: dict[str, str] = {}
    for va in related:
        name = name_for_address(prog, va)
        if name:
            names[hex(va)] = name
        proto = render_prototype(prog, va, load_prototype(prog, va))
        if proto is not None:
            prototypes[hex(va)] = proto.declaration
    return {
        "format": REQUEST_FORMAT,
        "address": f.address,
        "regions": regions,
        "callees": _callee_regions(view, callees),
        "names": names,
        "prototypes": prototypes,
        "globals": _global_names(prog, view, f),
        "variables": local_variable_rows(prog.db.connect(), f.address),
    }


def _regions(view: AnalysisView, f: FunctionRow) -> list[list[int]]:
    """The function's blocks merged into [start, end) regions."""
    blocks = sorted((s, e) for s, e, _n, _t in view.blocks(f.address))
    regions: list[list[int]] = []
    for s, e in blocks or [(f.address, f.address + max(f.size, 1))]:
        if regions and s <= regions[-1][1]:
            regions[-1][1] = max(regions[-1][1], e)
        else:
            regions.append([s, e])
    return regions


def _callee_regions(view: AnalysisView, callees: list[int]) -> list[list[Any]]:
    """[[address, regions], ...] of the callees binlens analysed (not imports), at most
    MAX_CALLEES and MAX_CALLEE_BYTES of them: angr infers their parameters from their code, so a
    call shows its arguments."""
    out: list[list[Any]] = []
    budget = MAX_CALLEE_BYTES
    for va in callees:
        row = view.by_address.get(va)
        if row is None or row.size > budget:
            continue
        budget -= row.size
        out.append([va, _regions(view, row)])
        if len(out) == MAX_CALLEES:
            break
    return out


def _global_names(prog: Program, view: AnalysisView, f: FunctionRow) -> dict[str, dict[str, str | None]]:
    """The user's names and types of the data the function refers to ({hex address: {name, type}})."""
    out: dict[str, dict[str, str | None]] = {}
    conn = prog.db.connect()
    for _src, dst, _kind, _fn in view.xrefs_from_function(f.address, DATA_REFS):
        row = store(prog).get(conn, "global", (dst,))
        name = prog.user_names.get(dst)
        if name or row:
            out[hex(dst)] = {"name": name, "type": row["type"] if row else None}
    return out


def _digest(request: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _clean(answer: dict[str, Any]) -> dict[str, Any]:
    """The provider's answer with its types checked (it comes from a process that read a hostile file)."""
    lines = []
    for row in answer.get("lines") or []:
        if isinstance(row, list) and len(row) == 2 and isinstance(row[0], int) and isinstance(row[1], list):
            lines.append([row[0], [a for a in row[1] if isinstance(a, int) and a >= 0]])
    variables = []
    for v in answer.get("variables") or []:
        if isinstance(v, dict) and isinstance(v.get("name"), str) and isinstance(v.get("storage"), str):
            ty = v.get("type")
            variables.append({"name": v["name"], "type": ty if isinstance(ty, str) else None, "storage": v["storage"]})
    return {
        "code": str(answer.get("code") or ""),
        "lines": lines,
        "variables": variables,
        "warnings": [str(w)[:500] for w in answer.get("warnings") or []][:50],
    }


def decompile(
    prog: Program, f: FunctionRow, view: AnalysisView, provider_choice: str, timeout_s: float, ctx: CallContext | None
) -> tuple[dict[str, Any], ProviderBinding, bool]:
    """The decompiled function from the cache or the provider: (result, provider, cached)."""
    provider, availability = providers.choose(provider_choice, "decompiler")
    binding = ProviderBinding(id=provider.id, version=availability.version)
    refresh(prog)
    request = _request(prog, view, f)
    inputs = _digest(request)
    version = availability.version or ""
    hit = cache.cached(prog.db, f.address, provider.id, version, inputs)
    if hit is not None:
        return hit, binding, True
    session = cast(DecompilerSession, providers.session(prog, provider))
    stored: list[dict[str, Any]] = []
    made: list[dict[str, Any]] = []

    def reuse() -> dict[str, Any] | None:
        # a call for the same function and inputs that ran while this one waited stored its result
        hit = cache.cached(prog.db, f.address, provider.id, version, inputs)
        if hit is not None:
            stored.append(hit)
        return hit

    def keep(answer: dict[str, Any]) -> None:
        made.append(_clean(answer))
        cache.store(prog.db, f.address, provider.id, version, inputs, made[0])

    session.decompile(request, timeout=timeout_s, ctx=ctx, reuse=reuse, keep=keep)
    if stored:
        return stored[0], binding, True
    return made[0], binding, False


def _with_comments(code: str, lines: list[list[Any]], notes: dict[int, dict[str, str]]) -> tuple[str, list[list[Any]]]:
    """The code with the user's comments at the first line of their address: `eol` at the line's
    end, `pre` and `plate` as comment lines above it (in the line's indentation)."""
    if not notes:
        return code, lines
    text = code.split("\n")
    first: dict[int, int] = {}
    for line, addrs in lines:
        for a in addrs:
            if a in notes and (a not in first or line < first[a]):
                first[a] = line
    above: dict[int, list[str]] = {}
    for a, line in sorted(first.items()):
        kinds = notes[a]
        if not 1 <= line <= len(text):
            continue
        indent = text[line - 1][: len(text[line - 1]) - len(text[line - 1].lstrip())]
        for kind in ("plate", "pre"):
            if kind in kinds:
                above.setdefault(line, []).extend(f"{indent}// {t}" for t in kinds[kind].splitlines())
        if "eol" in kinds:
            text[line - 1] += "  // " + " ".join(kinds["eol"].splitlines())
    out: list[str] = []
    moved: dict[int, int] = {}
    for i, row in enumerate(text, start=1):
        out.extend(above.get(i, ()))
        moved[i] = len(out) + 1
        out.append(row)
    return "\n".join(out), [[moved.get(line, line), addrs] for line, addrs in lines]


def _page(code: str, offset: int, max_bytes: int) -> tuple[str, int, int | None]:
    """The page of `code` at byte `offset` (cut on UTF-8 boundaries): (text, offset, next offset)."""
    data = code.encode()
    if offset > len(data):
        raise BinlensError(
            "invalid_argument", f"offset {offset} is past the code's {len(data)} bytes", target="/params/offset"
        )
    while 0 < offset < len(data) and data[offset] & 0xC0 == 0x80:
        offset -= 1
    end = min(len(data), offset + max_bytes)
    while offset < end < len(data) and data[end] & 0xC0 == 0x80:
        end -= 1
    return data[offset:end].decode(), offset, (end if end < len(data) else None)


def _function(
    ws: Workspace, program: ProgramRef | None, sel: Selector, timeout_ms: int, ctx: CallContext
) -> tuple[Program, AnalysisView, FunctionRow]:
    prog = ws.program(program)
    view = analysis_of(prog).require(ctx, wait=True, timeout_s=timeout_ms / 1000)
    return prog, view, select_function(prog, view, sel)


@method("decompilation.get", effect=READ_ONLY, long_running=True, requires=("provider-kind:decompiler",))
def decompilation_get(ws: Workspace, p: DecompilationGetParams, ctx: CallContext) -> DecompilationResult:
    """A function decompiled to C-like code (approximate), with each line's instruction addresses.

    The provider decompiles from binlens's own blocks of the function, with the user's names,
    prototypes and local variables; comments show at their lines. The result is cached in the
    program database until an annotation it depends on changes (`cached` says which). Long code
    pages by byte `offset` (`next_offset`). The provider runs in its own process: a crash, a hang
    past `timeout_ms` or a memory blow-up is this call's error, and the next call starts it again.
    """
    prog, view, f = _function(ws, p.program, p.selector, p.timeout_ms, ctx)
    result, binding, was_cached = decompile(prog, f, view, p.provider, p.timeout_ms / 1000, ctx)
    end = max((e for s, e, _n, _t in view.blocks(f.address)), default=f.address + f.size)
    code, lines = _with_comments(
        result["code"], result["lines"], comments_in(prog, f.address, max(end, f.address + f.size))
    )
    text, offset, next_offset = _page(code, p.offset, p.max_bytes)
    first_line = code.encode()[:offset].count(b"\n") + 1
    last_line = first_line + text.count("\n")
    ctx.charge(2 * len(text))
    return DecompilationResult(
        function=hex(f.address),
        name=name_for_address(prog, f.address) or hex(f.address),
        provider=binding,
        code=text,
        offset=offset,
        next_offset=next_offset,
        fragment=offset > 0 or next_offset is not None,
        lines=[
            CodeLine(line=line, addresses=[hex(a) for a in addrs])
            for line, addrs in lines
            if first_line <= line <= last_line
        ],
        variables=[LocalVariable(**v) for v in result["variables"]],
        warnings=result["warnings"],
        cached=was_cached,
    )


# --- local variables ------------------------------------------------------------------------------
class LocalVariableListParams(Params):
    """The function whose variables to list (decompiling it when no cached result is current)."""

    program: ProgramRef | None = None
    selector: Selector
    provider: str = ProviderChoice
    timeout_ms: int = Field(30000, ge=100, le=600000)


class LocalVariableItem(LocalVariable):
    """A variable with whether the user renamed or retyped it."""

    edited: bool = Field(description="The user renamed or retyped it (function_local_variable.patch).")


@method("function_local_variable.list", effect=READ_ONLY, long_running=True, requires=("provider-kind:decompiler",))
def function_local_variable_list(
    ws: Workspace, p: LocalVariableListParams, ctx: CallContext
) -> Listing[LocalVariableItem]:
    """The parameters and local variables of a function as the decompiler sees them, keyed by storage."""
    prog, view, f = _function(ws, p.program, p.selector, p.timeout_ms, ctx)
    result, _binding, _cached = decompile(prog, f, view, p.provider, p.timeout_ms / 1000, ctx)
    edits = local_variable_rows(prog.db.connect(), f.address)
    return Listing[LocalVariableItem](
        items=[LocalVariableItem(**v, edited=v["storage"] in edits) for v in result["variables"]], next_cursor=None
    )


class LocalVariablePatchParams(Params):
    """Rename and/or retype one variable of a function, by its storage."""

    program: ProgramRef | None = None
    selector: Selector = Field(description="The function.")
    storage: str = Field(
        pattern=_STORAGE, description="The variable's storage, as function_local_variable.list gives it."
    )
    name: str | None = Field(None, description="A C identifier; null drops the user's name.")
    type: str | None = Field(None, description="A C type ('unsigned int', 'struct foo *'); null drops the user's type.")


@method("function_local_variable.patch", effect=MUTATION)
def function_local_variable_patch(ws: Workspace, p: LocalVariablePatchParams, ctx: CallContext) -> EditResult:
    """Rename or retype a local variable or parameter (journaled, undoable); the next decompilation shows it.

    The edit is keyed by the function and the variable's storage, so it holds across
    re-decompilation; only the fields given change (null clears one).
    """
    prog = ws.program(p.program)
    view = analysis_of(prog).require(ctx, wait=True, timeout_s=120)
    f = select_function(prog, view, p.selector)
    given = p.model_fields_set
    if not given & {"name", "type"}:
        raise BinlensError("invalid_argument", "give 'name' or 'type' (or both)", target="/params")
    if p.name is not None and not _IDENT.match(p.name):
        raise BinlensError("invalid_argument", f"{p.name!r} is not a C identifier", target="/params/name")
    if p.type is not None:
        if p.storage.startswith("arg:"):
            raise BinlensError(
                "invalid_argument",
                "a parameter's type is the function's prototype: set it with function.patch {prototype} "
                "or function_parameter.patch",
                target="/params/type",
            )
        parse_type(prog, p.type, "/params/type")
    current = store(prog).get(prog.db.connect(), "local_variable", (f.address, p.storage)) or {}
    value = {"name": current.get("name"), "type": current.get("type")}
    if "name" in given:
        value["name"] = p.name
    if "type" in given:
        value["type"] = p.type
    entry = put_row(
        prog,
        ctx,
        "function_local_variable.patch",
        "local_variable",
        (f.address, p.storage),
        value if value["name"] is not None or value["type"] is not None else None,
        must_exist=None,
        what=f"local variable {p.storage} of {hex(f.address)}",
        target="/params/storage",
    )
    return EditResult(journal_id=entry)
