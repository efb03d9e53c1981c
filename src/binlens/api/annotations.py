"""annotations.export / annotations.import: all of a program's annotations as one JSON document."""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from binlens.api.edits import EditResult, abi_of, check_name, edit, refresh, store, sync_engine_functions
from binlens.api.models import Params, ProgramRef
from binlens.api.registry import DESTRUCTIVE, READ_ONLY, CallContext, method
from binlens.cdecl import DeclarationError, TypeSystem
from binlens.errors import BinlensError
from binlens.store.annotations import Change
from binlens.workspace import Program, Workspace

FORMAT: Final = "binlens.annotations"
VERSION: Final = 1


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)


class DocProgram(_Doc):
    """The program a document was exported from."""

    sha256: str
    file_name: str | None = None
    format: str | None = None
    arch: str | None = None


class DocName(_Doc):
    """A user name."""

    address: str
    name: str


class DocComment(_Doc):
    """A comment."""

    address: str
    kind: Literal["eol", "pre", "plate"]
    text: str


class DocBookmark(_Doc):
    """A bookmark."""

    address: str
    category: str
    note: str


class DocDataType(_Doc):
    """A user type as C."""

    name: str
    kind: Literal["struct", "union", "enum", "typedef", "function"]
    category: str
    declaration: str
    position: int


class DocGlobal(_Doc):
    """A typed global."""

    address: str
    type: str


class DocParameter(_Doc):
    """A prototype parameter."""

    name: str
    type: str


class DocPrototype(_Doc):
    """A function prototype."""

    address: str
    return_type: str
    calling_convention: str
    parameters: list[DocParameter]
    variadic: bool


class DocFunction(_Doc):
    """A user decision to define or undefine a function."""

    address: str
    state: Literal["defined", "undefined"]


_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")


class DocLocalVariable(_Doc):
    """A decompiled function's variable as the user named or typed it, by storage."""

    function: str
    storage: str
    name: str | None = None
    type: str | None = None


class DocPatch(_Doc):
    """Patched bytes at an address."""

    address: str
    bytes: str


class DocFlowOverride(_Doc):
    """An instruction's flow override (flow_override.patch)."""

    address: str
    type: Literal["branch", "call", "call_return", "return"]


class AnnotationDocument(_Doc):
    """Every annotation of one program."""

    format: Literal["binlens.annotations"] = FORMAT
    version: Literal[1] = VERSION
    program: DocProgram
    names: list[DocName] = Field(default_factory=list)
    comments: list[DocComment] = Field(default_factory=list)
    bookmarks: list[DocBookmark] = Field(default_factory=list)
    data_types: list[DocDataType] = Field(default_factory=list)
    global_variables: list[DocGlobal] = Field(default_factory=list)
    function_prototypes: list[DocPrototype] = Field(default_factory=list)
    functions: list[DocFunction] = Field(default_factory=list)
    patches: list[DocPatch] = Field(default_factory=list)
    local_variables: list[DocLocalVariable] = Field(default_factory=list)
    flow_overrides: list[DocFlowOverride] = Field(default_factory=list)


class ExportParams(Params):
    """The program whose annotations to export."""

    program: ProgramRef | None = None


class ImportParams(Params):
    """A document to import and how."""

    program: ProgramRef | None = None
    document: AnnotationDocument
    mode: Literal["merge", "replace"] = Field(
        "merge", description="merge: add and overwrite; replace: also remove what the document lacks."
    )
    allow_other_program: bool = Field(False, description="Import a document made for different bytes.")


class ImportResult(EditResult):
    """What an import changed."""

    changes: int


def export_document(prog: Program) -> AnnotationDocument:
    """The program's annotations as one document (deterministic order)."""
    st = store(prog)
    i = prog.image.identity
    doc = AnnotationDocument(program=DocProgram(sha256=i.sha256, file_name=i.file_name, format=i.format, arch=i.arch))
    doc.names = [DocName(address=hex(k[0]), name=v["name"]) for k, v in st.rows("name")]
    doc.comments = [DocComment(address=hex(k[0]), kind=k[1], text=v["text"]) for k, v in st.rows("comment")]
    doc.bookmarks = [DocBookmark(address=hex(k[0]), category=k[1], note=v["note"]) for k, v in st.rows("bookmark")]
    doc.data_types = [DocDataType(name=k[0], **v) for k, v in st.rows("data_type")]
    doc.global_variables = [DocGlobal(address=hex(k[0]), type=v["type"]) for k, v in st.rows("global")]
    doc.function_prototypes = [
        DocPrototype(address=hex(k[0]), **json.loads(v["prototype"])) for k, v in st.rows("prototype")
    ]
    doc.functions = [DocFunction(address=hex(k[0]), state=v["state"]) for k, v in st.rows("function")]
    doc.patches = [DocPatch(address=hex(k[0]), bytes=v["runs"][0][1]) for k, v in st.rows("patch")]
    doc.local_variables = [
        DocLocalVariable(function=hex(k[0]), storage=k[1], name=v["name"], type=v["type"])
        for k, v in st.rows("local_variable")
    ]
    doc.flow_overrides = [DocFlowOverride(address=hex(k[0]), type=v["type"]) for k, v in st.rows("flow_override")]
    return doc


@method("annotations.export", effect=READ_ONLY)
def annotations_export(ws: Workspace, p: ExportParams) -> AnnotationDocument:
    """Every annotation of a program (names, comments, bookmarks, types, globals, prototypes, patches) as JSON."""
    prog = ws.program(p.program)
    refresh(prog)
    return export_document(prog)


def _addr(text: str, target: str) -> int:
    try:
        value = int(text, 16)
    except ValueError:
        raise BinlensError("invalid_argument", f"{text!r} is not a hex address", target=target) from None
    if not 0 <= value < 1 << 64:
        raise BinlensError("invalid_argument", f"{text} is out of range", target=target)
    return value


def document_rows(
    prog: Program, doc: AnnotationDocument, merge: bool = False
) -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    """The rows a document stands for, by kind and key, after validating them (with the existing types if merging)."""
    base = "/params/document"
    out: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {k: {} for k in ("name", "comment", "bookmark")}
    seen_names: dict[str, int] = {}
    for i, n in enumerate(doc.names):
        va = _addr(n.address, f"{base}/names/{i}/address")
        check_name(n.name, f"{base}/names/{i}/name")
        if seen_names.setdefault(n.name, va) != va:
            raise BinlensError("conflict", f"{n.name!r} names two addresses", target=f"{base}/names/{i}/name")
        out["name"][(va,)] = {"name": n.name}
    for i, c in enumerate(doc.comments):
        out["comment"][(_addr(c.address, f"{base}/comments/{i}/address"), c.kind)] = {"text": c.text}
    for i, b in enumerate(doc.bookmarks):
        out["bookmark"][(_addr(b.address, f"{base}/bookmarks/{i}/address"), b.category)] = {"note": b.note}
    out["data_type"] = {
        (t.name,): {"kind": t.kind, "category": t.category, "declaration": t.declaration, "position": t.position}
        for t in doc.data_types
    }
    merged = dict(store(prog).rows("data_type")) if merge else {}
    merged.update(out["data_type"])
    rows = [(k[0], v["kind"], v["category"], v["declaration"]) for k, v in merged.items()]
    try:
        ts = TypeSystem(abi_of(prog), sorted(rows, key=lambda r: merged[(r[0],)]["position"]))
        for name, *_ in rows:
            ts.resolve(name)
    except (DeclarationError, KeyError) as err:
        raise BinlensError(
            "invalid_argument", f"a data type does not declare: {err}", target=f"{base}/data_types"
        ) from None
    out["global"] = {}
    for i, g in enumerate(doc.global_variables):
        try:
            ts.parse_type_name(g.type)
        except DeclarationError as err:
            raise BinlensError("invalid_argument", err.message, target=f"{base}/global_variables/{i}/type") from None
        out["global"][(_addr(g.address, f"{base}/global_variables/{i}/address"),)] = {"type": g.type}
    out["prototype"] = {}
    for i, fp in enumerate(doc.function_prototypes):
        va = _addr(fp.address, f"{base}/function_prototypes/{i}/address")
        proto = fp.model_dump(exclude={"address"})
        out["prototype"][(va,)] = {"prototype": json.dumps(proto, sort_keys=True, separators=(",", ":"))}
    out["function"] = {
        (_addr(f.address, f"{base}/functions/{i}/address"),): {"state": f.state} for i, f in enumerate(doc.functions)
    }
    out["patch"] = {}
    for i, pt in enumerate(doc.patches):
        va = _addr(pt.address, f"{base}/patches/{i}/address")
        try:
            data = bytes.fromhex(pt.bytes)
        except ValueError:
            raise BinlensError("invalid_argument", "bytes must be hex", target=f"{base}/patches/{i}/bytes") from None
        if not data or prog.image.va_to_offset(va) is None or prog.image.va_to_offset(va + len(data) - 1) is None:
            raise BinlensError("invalid_argument", "patch is not file-backed", target=f"{base}/patches/{i}/address")
        out["patch"][(va, len(data))] = {"runs": [[va, data.hex()]]}
    out["local_variable"] = {}
    for i, lv in enumerate(doc.local_variables):
        where = f"{base}/local_variables/{i}"
        if lv.name is None and lv.type is None:
            raise BinlensError("invalid_argument", "give a name or a type", target=where)
        if lv.name is not None and not _C_IDENTIFIER.match(lv.name):
            raise BinlensError("invalid_argument", f"{lv.name!r} is not a C identifier", target=f"{where}/name")
        if lv.type is not None:
            if lv.storage.startswith("arg:"):
                raise BinlensError(
                    "invalid_argument", "a parameter's type is the function's prototype", target=f"{where}/type"
                )
            try:
                ts.parse_type_name(lv.type)
            except DeclarationError as err:
                raise BinlensError("invalid_argument", err.message, target=f"{where}/type") from None
        key = (_addr(lv.function, f"{where}/function"), lv.storage)
        out["local_variable"][key] = {"name": lv.name, "type": lv.type}
    out["flow_override"] = {
        (_addr(f.address, f"{base}/flow_overrides/{i}/address"),): {"type": f.type}
        for i, f in enumerate(doc.flow_overrides)
    }
    return out


@method("annotations.import", effect=DESTRUCTIVE)
def annotations_import(ws: Workspace, p: ImportParams, ctx: CallContext) -> ImportResult:
    """Apply an exported document as one journaled edit (merge, or replace everything); a round trip changes nothing."""
    prog = ws.program(p.program)
    refresh(prog)
    if p.document.program.sha256 != prog.image.identity.sha256 and not p.allow_other_program:
        raise BinlensError(
            "conflict",
            "the document was made for other bytes (set allow_other_program to import anyway)",
            target="/params/document/program/sha256",
        )
    wanted = document_rows(prog, p.document, merge=p.mode == "merge")
    count = 0

    def plan(conn: sqlite3.Connection) -> list[Change]:
        nonlocal count
        st = store(prog)
        changes: list[Change] = []
        for kind, rows in wanted.items():
            if p.mode == "replace":
                current = dict(st.rows(kind, conn))
                if kind == "patch":
                    # a patch key is its range: drop patched runs the document does not have
                    keep = {k for k in rows}
                    changes += [(kind, k, None) for k in current if k not in keep]
                else:
                    changes += [(kind, k, None) for k in current if k not in rows]
            changes += [(kind, k, v) for k, v in rows.items()]
        count = sum(1 for kind, key, after in changes if st.get(conn, kind, key) != after)
        return changes

    entry = edit(prog, ctx, "annotations.import", f"import annotations ({p.mode})", plan)
    if entry is not None:  # the functions holding an instruction whose flow override changed are re-analysed
        changed = store(prog).last_edit()[1]
        sync_engine_functions(prog, [c for c in changed if c["kind"] == "flow_override"], "after")
    return ImportResult(journal_id=entry, changes=count if entry is not None else 0)
