"""compare.port_annotations: copy the annotations of one program to the matched functions of another
as one journaled, undoable edit (docs/COMPARE.md, "Porting annotations")."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from binlens.analysis.fingerprint.matching import Match
from binlens.api.compare import matches
from binlens.api.compare_sides import NeedsTwo, ProgramSpec, open_side, side_view
from binlens.api.edits import edit, name_conflict, store
from binlens.api.models import Result
from binlens.api.registry import MUTATION, CallContext, method
from binlens.errors import BinlensError
from binlens.store.analysis import AnalysisView, FunctionRow
from binlens.store.annotations import Change, comment_rows_in, last_data_type_position, local_variable_rows
from binlens.store.database import s64
from binlens.workspace import Program, Workspace

PortKind = Literal["names", "prototypes", "comments", "local_variables", "globals"]
_PORT_CAP = 1000  # entries listed per list (the counts are complete)


class PortParams(NeedsTwo):
    source: ProgramSpec = Field(alias="from", description="The annotated program: a handle or {path}.")
    to: ProgramSpec = Field(description="The program that receives the annotations: a handle or {path}.")
    min_similarity: float = Field(0.6, ge=0.0, le=1.0, description="Only pairs at least this similar.")
    kinds: list[PortKind] = Field(["names", "prototypes", "comments", "local_variables", "globals"], min_length=1)


class PortEntry(Result):
    kind: str = Field(description="name, prototype, comment, local_variable, global or data_type.")
    source: str | None = Field(None, description="Address in `from`.")
    target: str | None = Field(None, description="Address in `to`.")
    value: str | None = Field(None, description="What was copied (a name, a type, a comment's text).")
    reason: str | None = Field(None, description="Why it was skipped.")


class PortResult(Result):
    journal_id: int | None = Field(description="The one journal entry of `to` that undoes it all; null: none copied.")
    matched: int = Field(description="Matched pairs at least `min_similarity` similar.")
    copied: list[PortEntry]
    skipped: list[PortEntry]
    copied_count: int
    skipped_count: int


def _data_refs(view: AnalysisView, fn: int) -> list[int]:
    """The data a function references, distinct, in order of the referencing instructions."""
    refs = view.xrefs_from_function(fn, ("read", "write", "offset", "pointer", "string"))
    return list(dict.fromkeys(d for _s, d, _k, _f in refs))


class _Porter:
    """The changes of one port, planned inside `to`'s edit transaction."""

    def __init__(self, src: Program, sview: AnalysisView, dst: Program, dview: AnalysisView, p: PortParams) -> None:
        self.src, self.sview, self.dst, self.dview, self.p = src, sview, dst, dview, p
        self.copied: list[PortEntry] = []
        self.skipped: list[PortEntry] = []
        self.pairs: list[Match] = []
        self._done_globals: set[tuple[int, int]] = set()

    def skip(self, kind: str, a: int | None, b: int | None, reason: str, value: str | None = None) -> None:
        self.skipped.append(PortEntry(kind=kind, source=_hex(a), target=_hex(b), value=value, reason=reason))

    def copy(self, kind: str, a: int | None, b: int | None, value: str | None) -> None:
        self.copied.append(PortEntry(kind=kind, source=_hex(a), target=_hex(b), value=value))

    def plan(self, conn: Any) -> list[Change]:
        """Every change of the port, reading `to`'s rows through the edit's connection."""
        self.copied, self.skipped, self._done_globals = [], [], set()
        sconn = self.src.db.connect()
        sst, dst_store = store(self.src), store(self.dst)
        changes: list[Change] = []
        named: set[str] = set()
        kinds = set(self.p.kinds)
        need_types = False
        for m in self.pairs:
            lf, rf = self.sview.by_address[m.left], self.dview.by_address[m.right]
            if "names" in kinds:
                changes += self._name(conn, sconn, lf, rf, named)
            if "prototypes" in kinds:
                proto = sst.get(sconn, "prototype", (lf.address,))
                if proto is not None:
                    if dst_store.get(conn, "prototype", (rf.address,)) is not None:
                        self.skip("prototype", lf.address, rf.address, "`to` has a prototype there")
                    else:
                        changes.append(("prototype", (rf.address,), proto))
                        self.copy("prototype", lf.address, rf.address, proto["prototype"])
                        need_types = True
            if "comments" in kinds:
                changes += self._comments(conn, sconn, m, lf, rf)
            if "local_variables" in kinds:
                changes += self._locals(conn, sconn, m, lf, rf)
            if "globals" in kinds:
                got = self._globals(conn, sconn, lf, rf, named)
                need_types = need_types or bool(got)
                changes += got
        if need_types:
            changes += self._types(conn, sconn)
        return changes

    def _name(self, conn: Any, sconn: Any, lf: FunctionRow, rf: FunctionRow, named: set[str]) -> list[Change]:
        name = store(self.src).get(sconn, "name", (lf.address,))
        text = name["name"] if name else (lf.symbol or None)
        if not text or text == f"sub_{lf.address:x}":
            return []
        mine = store(self.dst).get(conn, "name", (rf.address,))
        if mine is not None:
            if mine["name"] != text:
                self.skip("name", lf.address, rf.address, f"the user named it {mine['name']!r}", text)
            return []
        own = rf.symbol or rf.thunk
        if own:
            if own != text:
                self.skip("name", lf.address, rf.address, f"`to` names it {own!r}", text)
            return []
        if text in named:
            self.skip("name", lf.address, rf.address, "another ported function took this name", text)
            return []
        try:
            name_conflict(self.dst, conn, rf.address, text, "/params/to")
        except BinlensError as err:
            self.skip("name", lf.address, rf.address, err.message, text)
            return []
        named.add(text)
        self.copy("name", lf.address, rf.address, text)
        return [("name", (rf.address,), {"name": text})]

    def _comments(self, conn: Any, sconn: Any, m: Match, lf: FunctionRow, rf: FunctionRow) -> list[Change]:
        out: list[Change] = []
        rows = comment_rows_in(sconn, lf.address, lf.address + max(lf.size, 1))
        for va, kind, text in rows:
            if va == lf.address:
                target = rf.address
            elif m.kind == "identical":
                target = rf.address + (va - lf.address)
            else:
                self.skip("comment", va, None, "inside a changed function (only its entry's comments move)", text)
                continue
            if store(self.dst).get(conn, "comment", (target, kind)) is not None:
                self.skip("comment", va, target, f"`to` has a {kind} comment there", text)
                continue
            out.append(("comment", (target, kind), {"text": text}))
            self.copy("comment", va, target, text)
        return out

    def _locals(self, conn: Any, sconn: Any, m: Match, lf: FunctionRow, rf: FunctionRow) -> list[Change]:
        """The user's local variable edits of `from`'s function, keyed by storage, onto its partner:
        all of them when the two are identical (same code, same storage); for a changed pair only
        the storages a decompilation of `to`'s function stored has (else the storage may mean
        another variable there)."""
        edits = local_variable_rows(sconn, lf.address)
        if not edits:
            return []
        known = None if m.kind == "identical" else _decompiled_storages(conn, rf.address)
        out: list[Change] = []
        for storage, value in sorted(edits.items()):
            shown = value.get("name") or value.get("type")
            key = (rf.address, storage)
            if known is not None and storage not in known:
                why = (
                    "the functions differ and no decompilation of `to`'s function is stored"
                    if not known
                    else "the functions differ and `to`'s decompiled function has no such storage"
                )
                self.skip("local_variable", lf.address, rf.address, f"{storage}: {why}", shown)
                continue
            if store(self.dst).get(conn, "local_variable", key) is not None:
                self.skip("local_variable", lf.address, rf.address, f"{storage}: `to` has an edit of it", shown)
                continue
            out.append(("local_variable", key, {"name": value.get("name"), "type": value.get("type")}))
            self.copy("local_variable", lf.address, rf.address, f"{storage}: {shown}")
        return out

    def _globals(self, conn: Any, sconn: Any, lf: FunctionRow, rf: FunctionRow, named: set[str]) -> list[Change]:
        sst, dst_store = store(self.src), store(self.dst)
        lrefs, rrefs = _data_refs(self.sview, lf.address), _data_refs(self.dview, rf.address)
        out: list[Change] = []
        for a, b in zip(lrefs, rrefs, strict=False):
            g = sst.get(sconn, "global", (a,))
            if g is None or (a, b) in self._done_globals:
                continue
            self._done_globals.add((a, b))
            if len(lrefs) != len(rrefs):
                self.skip("global", a, b, "the functions reference different numbers of data items", g["type"])
                continue
            if dst_store.get(conn, "global", (b,)) is not None:
                self.skip("global", a, b, "`to` has a global there", g["type"])
                continue
            out.append(("global", (b,), g))
            self.copy("global", a, b, g["type"])
            name = sst.get(sconn, "name", (a,))
            if name is not None and name["name"] not in named and dst_store.get(conn, "name", (b,)) is None:
                try:
                    name_conflict(self.dst, conn, b, name["name"], "/params/to")
                except BinlensError as err:
                    self.skip("name", a, b, err.message, name["name"])
                    continue
                named.add(name["name"])
                out.append(("name", (b,), name))
                self.copy("name", a, b, name["name"])
        return out

    def _types(self, conn: Any, sconn: Any) -> list[Change]:
        """The user's data types of `from` that `to` lacks (what ported prototypes and globals name)."""
        out: list[Change] = []
        position = last_data_type_position(conn)
        for key, value in store(self.src).rows("data_type", sconn):
            if store(self.dst).get(conn, "data_type", key) is not None:
                continue
            position += 1
            out.append(("data_type", key, {**value, "position": position}))
            self.copy("data_type", None, None, str(key[0]))
        return out


def _decompiled_storages(conn: Any, address: int) -> set[str]:
    """The variable storages the stored decompilations of the function at `address` list (any
    provider or version: the storages follow the code, which a port does not change)."""
    out: set[str] = set()
    for (text,) in conn.execute("SELECT result FROM decompiled WHERE address=?", (s64(address),)):
        try:
            result = json.loads(text)
        except ValueError:
            continue
        for v in result.get("variables", []) if isinstance(result, dict) else []:
            if isinstance(v, dict) and isinstance(v.get("storage"), str):
                out.add(v["storage"])
    return out


def _hex(va: int | None) -> str | None:
    return None if va is None else hex(va)


@method("compare.port_annotations", effect=MUTATION, long_running=True)
def port_annotations(ws: Workspace, p: PortParams, ctx: CallContext) -> PortResult:
    """Copy names, prototypes, comments, local variable names and typed globals to the matched functions of `to`
    as one undoable edit."""
    src = open_side(ws, p.source, "/params/from")
    dst = open_side(ws, p.to, "/params/to")
    if src is dst:
        raise BinlensError("invalid_argument", "`from` and `to` are the same program", target="/params/to")
    sview, dview = side_view(src, p, ctx), side_view(dst, p, ctx)
    porter = _Porter(src, sview, dst, dview, p)
    porter.pairs = [m for m in matches(src, sview, dst, dview) if m.similarity >= p.min_similarity]
    summary = f"port annotations from {src.identity['file_name']} ({len(porter.pairs)} matched functions)"
    entry = edit(dst, ctx, "compare.port_annotations", summary, porter.plan)
    return PortResult(
        journal_id=entry,
        matched=len(porter.pairs),
        copied=porter.copied[:_PORT_CAP],
        skipped=porter.skipped[:_PORT_CAP],
        copied_count=len(porter.copied),
        skipped_count=len(porter.skipped),
    )
