"""Shared plumbing of the annotation domains: the store per program, caches, names, journaled edits.

On open (`components.OPEN_HOOKS`) every program gets its `AnnotationStore`, its user names loaded
into `Program.user_names`, and the `memory.overlay` that shows patched bytes. In-memory caches
(user names, the type system) are refreshed whenever the database's annotation generation
changes, so edits made by another process on the same database show up too.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import Field

from binlens.api.models import Result
from binlens.api.registry import CallContext
from binlens.cdecl import CType, DeclarationError, TypeSystem, abi_for
from binlens.errors import BinlensError
from binlens.store.annotations import (
    AnnotationStore,
    Change,
    comment_rows_at,
    comment_rows_in,
    name_owner,
    user_name_at,
)
from binlens.workspace import Program, Workspace

_NAME_BAD = re.compile(r"[\x00-\x1f\x7f]|^\s|\s$")
_HEX = re.compile(r"^0[xX][0-9a-fA-F]+$")


class EditResult(Result):
    """What a mutation did: its journal entry (null when nothing changed)."""

    journal_id: int | None = Field(description="Journal entry of this edit; null when it changed nothing.")


def store(prog: Program) -> AnnotationStore:
    """The program's annotation store."""
    st = prog.extensions.get("annotations")
    if st is None:
        st = AnnotationStore(prog.db)
        prog.extensions["annotations"] = st
    return st


def refresh(prog: Program) -> None:
    """Reload in-memory caches (user names) if any process changed the annotations since."""
    st = store(prog)
    gen = st.generation("name")
    if prog.extensions.get("annotations.generation") == gen:
        return
    names = {key[0]: value["name"] for key, value in st.rows("name")}
    prog.user_names.clear()
    prog.user_names.update(names)
    prog.extensions["annotations.generation"] = gen


def invalidate(prog: Program) -> None:
    """Forget cached state (after a rolled-back batch) so the next call reloads it."""
    prog.extensions["annotations.generation"] = None


def types(prog: Program) -> TypeSystem:
    """The program's type system (built-ins plus the user's types), rebuilt when types change."""
    st = store(prog)
    rows = sorted(st.rows("data_type"), key=lambda kv: kv[1]["position"])
    key = [(k[0], v["kind"], v["category"], v["declaration"]) for k, v in rows]
    cached = prog.extensions.get("annotations.types")
    if cached is not None and cached[0] == key:
        return cached[1]
    ts = TypeSystem(abi_of(prog), key)
    prog.extensions["annotations.types"] = (key, ts)
    return ts


def abi_of(prog: Program) -> Any:
    """The program's C data model."""
    i = prog.image.identity
    return abi_for(i.format, i.arch, i.bits)


def client_of(ctx: CallContext | None) -> str:
    """The client id journal entries record."""
    client = ctx.client if ctx is not None else "local"
    return f"local/{os.getpid()}" if client == "local" else client


def edit(
    prog: Program,
    ctx: CallContext | None,
    method: str,
    summary: str,
    plan: Callable[[sqlite3.Connection], list[Change]],
) -> int | None:
    """Run one journaled edit and refresh the caches it touches."""
    refresh(prog)
    st = store(prog)
    cached = prog.extensions.get("annotations.generation")
    seen: dict[str, str] = {}

    def planned(conn: sqlite3.Connection) -> list[Change]:
        seen["names"] = st.generation("name")  # inside the transaction: no other writer can move it now
        return plan(conn)

    entry = None
    try:
        with database_busy():
            entry = st.edit(client_of(ctx), method, summary, planned)
    finally:
        if entry is not None and cached is not None and seen.get("names") == cached:
            _apply_names(prog, *st.last_edit())  # our cache was current: add our own change, skip a reload
        else:
            refresh(prog)
    return entry


def _apply_names(prog: Program, token: str, changes: list[dict[str, Any]]) -> None:
    named = [c for c in changes if c["kind"] == "name"]
    for c in named:
        if c["after"] is None:
            prog.user_names.pop(c["key"][0], None)
        else:
            prog.user_names[c["key"][0]] = c["after"]["name"]
    if named:
        prog.extensions["annotations.generation"] = token


@contextmanager
def database_busy() -> Iterator[None]:
    """Turn SQLite's 'database is locked' (another writer held it past the timeout) into `busy`."""
    try:
        yield
    except sqlite3.OperationalError as err:
        if "locked" not in str(err) and "busy" not in str(err):
            raise
        raise BinlensError("busy", "another client is writing to this program's database; retry shortly") from None


def parse_type(prog: Program, text: str, target: str) -> CType:
    """A C type name, or `invalid_argument` at `target` with the parser's message."""
    try:
        return types(prog).parse_type_name(text)
    except DeclarationError as err:
        raise BinlensError(
            "invalid_argument", f"bad C type {text!r}: {err.message}", target=target, details=err.details()
        ) from None


# --- names ---------------------------------------------------------------------------------------
def check_name(name: str, target: str) -> None:
    """Refuse names that could not be told apart from an address or an offset expression."""
    if not name or len(name) > 1024 or _NAME_BAD.search(name):
        raise BinlensError(
            "invalid_argument", "a name is 1..1024 characters, no control characters or edge spaces", target=target
        )
    if _HEX.match(name) or re.search(r"[+-]\s*(0[xX][0-9a-fA-F]+|\d+)$", name):
        raise BinlensError(
            "invalid_argument", f"{name!r} reads as an address or 'name+offset'; choose another name", target=target
        )


def name_conflict(prog: Program, conn: sqlite3.Connection, va: int, name: str, target: str) -> None:
    """Raise `conflict` when `name` already names another address (user, symbol or analysis name)."""
    named = name_owner(conn, name, va)
    if named is not None:
        raise BinlensError(
            "conflict", f"{name!r} already names {hex(named)}", target=target, details={"address": hex(named)}
        )
    other = prog.lookup_name(name)
    if other is None or other == va:
        return
    renamed = user_name_at(conn, other)
    if renamed is not None and renamed != name:
        return  # that address was renamed away from this name
    raise BinlensError(
        "conflict", f"{name!r} already names {hex(other)}", target=target, details={"address": hex(other)}
    )


def name_change(prog: Program, conn: sqlite3.Connection, va: int, name: str | None, target: str) -> Change:
    """The change that sets (or with None clears) the user name at `va`, after checking it."""
    if name is None:
        return ("name", (va,), None)
    check_name(name, target)
    name_conflict(prog, conn, va, name, target)
    return ("name", (va,), {"name": name})


def original_name(prog: Program, va: int) -> str | None:
    """The name at `va` without user renames (symbol, export, or the engine's name)."""
    user = prog.user_names.pop(va, None)
    try:
        return prog.name_at(va)
    finally:
        if user is not None:
            prog.user_names[va] = user


# --- byte patches --------------------------------------------------------------------------------
def overlay(prog: Program, va: int, length: int, target: str = "/params/address") -> tuple[bytes, bool]:
    """Bytes at `va` with the database's patches applied, and whether any byte differs from the file."""
    base = prog.image.read(va, length)
    if base is None:
        raise BinlensError("invalid_argument", f"{hex(va)}..{hex(va + length)} is not entirely mapped", target=target)
    patches = store(prog).patched_bytes(va, length)
    if not patches:
        return base, False
    data = bytearray(base)
    for addr, value in patches:
        data[addr - va] = value
    out = bytes(data)
    return out, out != base


def on_open(ws: Workspace, prog: Program) -> None:
    """Attach the program's annotation store, user names and patch overlay when it opens
    (`components.OPEN_HOOKS`)."""
    store(prog)
    refresh(prog)
    prog.extensions["memory.overlay"] = overlay
    prog.extensions["annotations.refresh"] = lambda: refresh(prog)
    # for the engine's listing and function views (see docs/ANNOTATIONS.md)
    from binlens.api.function_edit import load_prototype, render_prototype
    from binlens.api.global_variable import global_at

    prog.extensions["annotations.global_at"] = lambda va: global_at(prog, va)
    prog.extensions["annotations.prototype_at"] = lambda va: render_prototype(prog, va, load_prototype(prog, va))
    prog.extensions["annotations.comments_at"] = lambda va: comments_at(prog, va)


def signatures(prog: Program) -> dict[int, dict[str, Any]]:
    """The names `signature.apply` gave, by address ({name, score, reference}), reloaded when they change."""
    st = store(prog)
    gen = st.generation("signature")
    cached = prog.extensions.get("annotations.signatures")
    if cached is not None and cached[0] == gen:
        return cached[1]
    rows = {key[0]: value for key, value in st.rows("signature")}
    prog.extensions["annotations.signatures"] = (gen, rows)
    return rows


def comments_at(prog: Program, va: int) -> dict[str, str]:
    """The comments at `va` by kind (eol, pre, plate), for the listing."""
    return comment_rows_at(prog.db.connect(), va)


def comments_in(prog: Program, start: int, end: int) -> dict[int, dict[str, str]]:
    """Every user comment in [start, end), by address then kind: one query for a whole listing."""
    rows = comment_rows_in(prog.db.connect(), start, end)
    out: dict[int, dict[str, str]] = {}
    for va, kind, text in rows:
        out.setdefault(va, {})[kind] = text
    return out


def put_row(
    prog: Program,
    ctx: CallContext | None,
    method: str,
    kind: str,
    key: tuple[Any, ...],
    value: dict[str, Any] | None,
    *,
    must_exist: bool | None,
    what: str,
    target: str,
    also: Callable[[sqlite3.Connection], list[Change]] | None = None,
) -> int | None:
    """Create (must_exist=False), patch (True), upsert (None) or delete (value None) one row, journaled.

    A create over an existing row is `conflict`; a patch or delete of a missing row is `not_found`.
    `also` adds more changes to the same journal entry (e.g. a global's name).
    """
    verb = "delete" if value is None else {False: "create", True: "patch", None: "upsert"}[must_exist]

    def plan(conn: sqlite3.Connection) -> list[Change]:
        current = store(prog).get(conn, kind, key)
        if must_exist is False and current is not None:
            raise BinlensError("conflict", f"{what} already exists (patch or upsert it)", target=target)
        if must_exist is True and current is None:
            raise BinlensError("not_found", f"no {what}", target=target)
        changes: list[Change] = [(kind, key, value)]
        if also is not None:
            changes += also(conn)
        return changes

    return edit(prog, ctx, method, f"{verb} {what}", plan)


# --- the engine's function list (wired when the analysis engine is present) ----------------------
def engine(prog: Program) -> Any:
    """The analysis engine attached to the program, or None (`function_at`, `define_function`, ...)."""
    return prog.extensions.get("analysis")


def settle_analysis(prog: Program, ctx: CallContext | None, timeout_s: float = 600.0) -> None:
    """Let the program's analysis finish (and be saved) before an edit that consults it opens its
    write transaction: waiting for it inside one kept the analysis process from saving ("database
    is locked"), so a `function.create` before the first analysis failed it. Outside an atomic
    batch only; a failed or unsupported analysis leaves the functions the metadata names. (An engine
    without a background analysis, `require`, has nothing to settle.)"""
    require = getattr(engine(prog), "require", None)
    if require is None or store(prog).in_atomic_batch:
        return
    try:
        require(ctx, timeout_s=timeout_s)
    except BinlensError as err:
        if err.code != "unavailable":  # (a cancellation or a timeout is the caller's answer)
            raise


def sync_engine_functions(prog: Program, changes: list[dict[str, Any]], side: str) -> None:
    """After undo/redo, bring the engine's function list to the user's definitions on `side`.

    A user decision that disappears (None) is undone by the opposite engine call, since the
    engine's interface has define/undefine only.
    """
    analysis = engine(prog)
    if analysis is None:
        return
    other = "after" if side == "before" else "before"
    for ch in changes:
        if ch["kind"] != "function":
            continue
        va = ch["key"][0]
        now_state = (ch[side] or {}).get("state")
        if now_state is None:
            now_state = "undefined" if (ch[other] or {}).get("state") == "defined" else "defined"
        if now_state == "defined":
            analysis.define_function(va)
        else:
            analysis.undefine_function(va)
