"""backtrace.get, thread.list, memory_map.list, debug_address.resolve: a debugged process's stack,
threads, mappings, and its runtime addresses as static ones."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.debug_target import (
    ANALYSIS_WAIT_S,
    REQUIRES,
    DebugId,
    FunctionRef,
    Located,
    RuntimeAddress,
    entry_of,
    function_ref,
    hex_text,
    locate,
    static_of,
)
from binlens.api.models import HexAddress, Page, Params, Result
from binlens.api.registry import READ_ONLY, method
from binlens.providers.target import read_maps

# --- stack, threads, maps, addresses --------------------------------------------------------------


class BacktraceParams(Params):
    """The call stack of a stopped thread."""

    debug_id: DebugId
    thread: int | None = Field(None, ge=1)
    limit: int = Field(64, ge=1, le=1024)


class Frame(Result):
    """One stack frame."""

    level: int
    address: HexAddress
    static_address: HexAddress | None = None
    function: FunctionRef | None = Field(None, description="The program's function (binlens's name).")
    gdb_function: str | None = Field(None, description="gdb's name for frames outside the program.")
    module: str | None = None


class Backtrace(Result):
    """Frames, innermost first."""

    frames: list[Frame]


@method("backtrace.get", effect=READ_ONLY, requires=REQUIRES)
def backtrace_get(ws: Any, p: BacktraceParams) -> Backtrace:
    """The stopped thread's call stack, with the program's frames named by binlens."""
    entry = entry_of(ws, p.debug_id)
    entry.session.require_stopped()
    locate(entry)
    option = f" --thread {p.thread}" if p.thread is not None else ""
    got = entry.session.command(f"-stack-list-frames{option} 0 {p.limit - 1}", timeout=10, check=True)
    frames: list[Frame] = []
    for item in got.get("stack") or []:
        row = item.get("frame", item) if isinstance(item, dict) else {}
        address = int(str(row.get("addr", "0")), 16)
        static = static_of(entry, address)
        func = row.get("func")
        frames.append(
            Frame(
                level=int(row.get("level", len(frames))),
                address=hex(address),
                static_address=hex_text(static),
                function=function_ref(entry, static),
                gdb_function=None if func in (None, "??") else str(func),
                module=str(row["from"]) if row.get("from") else (entry.prog.path.name if static is not None else None),
            )
        )
    return Backtrace(frames=frames)


class ThreadListParams(Params):
    """The target's threads."""

    debug_id: DebugId


class ThreadInfo(Result):
    """One thread."""

    id: int
    target_id: str
    name: str | None = None
    state: str
    address: HexAddress | None = None
    static_address: HexAddress | None = None
    current: bool


class ThreadList(Result):
    """Threads."""

    items: list[ThreadInfo]
    next_cursor: str | None = None


@method("thread.list", effect=READ_ONLY, requires=REQUIRES)
def thread_list(ws: Any, p: ThreadListParams) -> ThreadList:
    """The target's threads: id, kernel id, state and where each one is."""
    entry = entry_of(ws, p.debug_id)
    got = entry.session.command("-thread-info", timeout=10, check=True)
    locate(entry)
    current = str(got.get("current-thread-id", ""))
    items = []
    for t in got.get("threads") or []:
        frame = t.get("frame") or {}
        address = int(frame["addr"], 16) if isinstance(frame, dict) and frame.get("addr") else None
        items.append(
            ThreadInfo(
                id=int(t.get("id", 0)),
                target_id=str(t.get("target-id", "")),
                name=t.get("name"),
                state=str(t.get("state", "")),
                address=hex_text(address),
                static_address=hex_text(static_of(entry, address)),
                current=str(t.get("id")) == current,
            )
        )
    return ThreadList(items=items)


class MemoryMapParams(Params):
    """The target's memory mappings."""

    debug_id: DebugId
    page: Page = Field(default_factory=Page)


class MapItem(Result):
    """One mapping, with the base and slide of the module it belongs to."""

    start: HexAddress
    end: HexAddress
    perms: str
    offset: int
    path: str
    module_base: HexAddress | None = None
    slide: HexAddress | None = Field(None, description="The module's runtime base - its link-time base (ELF modules).")
    program: bool = Field(description="The mapping is the program's file.")


def _link_base(path: str, cache: dict[str, int | None]) -> int | None:
    """The lowest PT_LOAD address of an ELF file (its link-time base), or None."""
    if path in cache:
        return cache[path]
    base = None
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] == b"\x7fELF" and head[4] == 2 and head[5] == 1:
                phoff = int.from_bytes(head[32:40], "little")
                phentsize = int.from_bytes(head[54:56], "little")
                phnum = int.from_bytes(head[56:58], "little")
                f.seek(phoff)
                table = f.read(phentsize * min(phnum, 256))
                loads = [
                    int.from_bytes(table[i + 16 : i + 24], "little")
                    for i in range(0, len(table) - 55, phentsize)
                    if int.from_bytes(table[i : i + 4], "little") == 1
                ]
                base = min(loads) & ~0xFFF if loads else None
    except OSError:
        base = None
    cache[path] = base
    return base


def map_items(entry: Located) -> list[MapItem]:
    ident = entry.identity
    assert ident is not None
    maps = read_maps(ident.pid)
    locate(entry)
    bases: dict[tuple[int, int], int] = {}
    for m in maps:
        if m.inode:
            key = (m.device, m.inode)
            bases[key] = min(bases.get(key, m.start - m.offset), m.start - m.offset)
    links: dict[str, int | None] = {}
    items = []
    for m in maps:
        mine = m.inode != 0 and (m.device, m.inode) == (ident.exe_device, ident.exe_inode)
        base = bases.get((m.device, m.inode)) if m.inode else None
        slide = None
        if mine:
            slide = entry.slide
        elif base is not None and m.path.startswith("/"):
            link = _link_base(m.path, links)
            slide = None if link is None else base - link
        items.append(
            MapItem(
                start=hex(m.start),
                end=hex(m.end),
                perms=m.perms,
                offset=m.offset,
                path=m.path,
                module_base=hex_text(base),
                slide=hex_text(slide),
                program=mine,
            )
        )
    return items


class MapList(Result):
    """Mappings in address order."""

    items: list[MapItem]
    next_cursor: str | None = None


@method("memory_map.list", effect=READ_ONLY, requires=REQUIRES)
def memory_map_list(ws: Any, p: MemoryMapParams) -> MapList:
    """The target's memory mappings (/proc/PID/maps) with each module's base and slide."""
    entry = entry_of(ws, p.debug_id)
    entry.session.check_alive()
    items = map_items(entry)
    qkey = query_key(p, exclude=("page", "program"))
    start = int(decode_cursor(p.page.cursor, entry.prog, qkey)) if p.page.cursor else 0
    chunk = items[start : start + p.page.limit]
    more = start + p.page.limit < len(items)
    return MapList(items=chunk, next_cursor=encode_cursor(entry.prog, qkey, start + p.page.limit) if more else None)


class ResolveParams(Params):
    """A runtime address to resolve."""

    debug_id: DebugId
    address: RuntimeAddress


class Resolved(Result):
    """Where a runtime address is: its module, and in the program its static address and function."""

    address: HexAddress
    module: str | None = None
    module_base: HexAddress | None = None
    slide: HexAddress | None = None
    program: bool
    static_address: HexAddress | None = None
    function: FunctionRef | None = None
    perms: str | None = None


@method("debug_address.resolve", effect=READ_ONLY, requires=REQUIRES)
def debug_address_resolve(ws: Any, p: ResolveParams) -> Resolved:
    """A runtime address → its module, the module's slide, and (in the program) the static address and function."""
    entry = entry_of(ws, p.debug_id)
    entry.session.check_alive()
    return resolved_at(map_items(entry), entry, int(p.address, 16))


def resolved_at(items: list[MapItem], where: Located, runtime: int, wait: float = ANALYSIS_WAIT_S) -> Resolved:
    """`runtime` in the mappings `items` of the process `where` names: its module, slide, and (in the
    program) static address and function (the analysis waited for at most `wait` seconds)."""
    for item in items:
        if int(item.start, 16) <= runtime < int(item.end, 16):
            static = static_of(where, runtime) if item.program else None
            return Resolved(
                address=hex(runtime),
                module=item.path or None,
                module_base=item.module_base,
                slide=item.slide,
                program=item.program,
                static_address=hex_text(static),
                function=function_ref(where, static, wait),
                perms=item.perms,
            )
    return Resolved(address=hex(runtime), program=False)
