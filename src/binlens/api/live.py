"""live.*: xref's inspection of one verified live process, kept with xref's names and bounds.

`binlens mcp FILE --allow-live-pid PID` (or `serve`) verifies, before serving anything, that PID
runs FILE (`pin_live`: the executable's device/inode is FILE's, or its bytes have FILE's sha256)
and pins the process's identity (pid, start time, exe device/inode, sha256), re-checked on every
call (`process_exited`, `process_changed`). `live.maps`, `live.resolve`, `live.memscan` and
`live.watch` read /proc only (the process is never stopped); `live.probe` and `live.profile`
attach gdb for their duration and detach. At most one live call runs at a time (`busy`
otherwise), none lasts more than 5 s, and a response holds at most 64 KiB.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from pydantic import Field, model_validator

from binlens.api.analysis import select_address
from binlens.api.cursor import decode_cursor, encode_cursor, query_key
from binlens.api.debug_process import MapList, Resolved, map_items, resolved_at
from binlens.api.debug_target import (
    Located,
    PlaceParams,
    hex_text,
    locate,
    static_of,
)
from binlens.api.models import HexAddress, Page, Params, Result, Selector
from binlens.api.registry import READ_ONLY, CallContext, method, response_size, response_too_large
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of
from binlens.providers.target import TargetIdentity, read_maps

LIVE_KEY = "live.target"  # Workspace.extensions key of the pinned `LiveTarget`
MAX_RESPONSE = 64 * 1024
MAX_SCAN_MS = 5000
CHUNK = 1 << 20
REQUIRES = ("permission:live",)

RuntimeAddress = Annotated[str, Field(pattern=r"^0[xX][0-9a-fA-F]{1,16}$", description="A runtime address in hex.")]


@dataclass(kw_only=True)
class LiveTarget(Located):
    """The process the server was started on, pinned, and the one-call-at-a-time lock."""

    pinned: TargetIdentity
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def identity(self) -> TargetIdentity | None:
        """The pinned process."""
        return self.pinned


def pin_live(ws: Any, prog: Any, pid: int) -> LiveTarget:
    """Verify that `pid` runs `prog`'s file (its executable is the file, or has its bytes) and pin
    it for the live methods; BinlensError (`process_exited`, `conflict`) when it does not."""
    ident = TargetIdentity.pin(pid)
    try:
        st = os.stat(prog.path)
        same_file = (st.st_dev, st.st_ino) == (ident.exe_device, ident.exe_inode)
    except OSError:
        same_file = False
    if not same_file and ident.sha256 != prog.image.identity.sha256:
        raise BinlensError(
            "conflict",
            f"process {pid} runs {ident.exe}, which is not {prog.path.name}",
            target="/params/pid",
            details={"reason": "exe_mismatch", "sha256": ident.sha256, "program_sha256": prog.image.identity.sha256},
        )
    target = LiveTarget(prog=prog, pinned=ident)
    ws.extensions[LIVE_KEY] = target
    analysis_of(prog).start()  # function names for resolve, watch and probe results
    return target


class LiveCall:
    """One live call: the target checked, the lock held (`busy` when another live call runs)."""

    def __init__(self, ws: Any) -> None:
        target = ws.extensions.get(LIVE_KEY)
        if not isinstance(target, LiveTarget):
            raise BinlensError(
                "unavailable",
                "no live process is pinned",
                details={"reason": "no live process", "remediation": "start the server with --allow-live-pid PID"},
            )
        self.target = target

    def __enter__(self) -> LiveTarget:
        if not self.target.lock.acquire(blocking=False):
            raise BinlensError("busy", "another live call is running; one runs at a time")
        try:
            self.target.pinned.check()
        except BaseException:
            self.target.lock.release()
            raise
        return self.target

    def __exit__(self, *exc: object) -> None:
        self.target.lock.release()


R = TypeVar("R", bound=Result)


def bounded(result: R) -> R:
    """`result`, unless its JSON is over 64 KiB (`response_too_large`)."""
    size = response_size(result.model_dump(mode="json"))
    if size > MAX_RESPONSE:
        raise response_too_large(size, MAX_RESPONSE)
    return result


class LiveMapsParams(Params):
    """The pinned process's mappings."""

    page: Page = Field(default_factory=Page)


@method("live.maps", effect=READ_ONLY, requires=REQUIRES)
def live_maps(ws: Any, p: LiveMapsParams) -> MapList:
    """The pinned process's memory mappings (/proc/PID/maps) with each module's base and slide."""
    with LiveCall(ws) as target:
        items = map_items(target)
    qkey = query_key(p, exclude=("page", "program"))
    start = int(decode_cursor(p.page.cursor, target.prog, qkey)) if p.page.cursor else 0
    more = start + p.page.limit < len(items)
    nxt = encode_cursor(target.prog, qkey, start + p.page.limit) if more else None
    result = MapList(items=items[start : start + p.page.limit], next_cursor=nxt)
    bounded(result)
    return result


class LiveResolveParams(Params):
    """Runtime addresses of the pinned process to resolve."""

    addresses: list[RuntimeAddress] = Field(min_length=1, max_length=256)


class LiveResolved(Result):
    """Each address's module, slide, static address and function."""

    items: list[Resolved]


@method("live.resolve", effect=READ_ONLY, requires=REQUIRES)
def live_resolve(ws: Any, p: LiveResolveParams) -> LiveResolved:
    """Runtime addresses of the pinned process → module, slide, static address and function."""
    with LiveCall(ws) as target:
        items = map_items(target)
        result = LiveResolved(items=[resolved_at(items, target, int(a, 16), 0) for a in p.addresses])
    bounded(result)
    return result


class ScanValue(Params):
    """One value to look for: an integer of `size` bytes (little-endian), hex bytes, or UTF-8 text."""

    integer: Annotated[int, Field(ge=-(1 << 63), lt=1 << 64)] | None = None
    size: Annotated[int, Field(ge=1, le=8, description="Bytes of 'integer'.")] = 4
    hex: Annotated[str, Field(min_length=2, max_length=512, pattern=r"^([0-9a-fA-F]{2})+$")] | None = None
    text: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    @model_validator(mode="after")
    def _one(self) -> ScanValue:
        if sum(x is not None for x in (self.integer, self.hex, self.text)) != 1:
            raise ValueError("give exactly one of 'integer', 'hex' or 'text'")
        return self

    def pattern(self) -> bytes:
        """The bytes to find."""
        if self.hex is not None:
            return bytes.fromhex(self.hex)
        if self.text is not None:
            return self.text.encode()
        assert self.integer is not None
        value = self.integer % (1 << (8 * self.size))
        return value.to_bytes(self.size, "little")


class LiveMemscanParams(Params):
    """Find values in the pinned process's writable memory."""

    values: list[ScanValue] = Field(min_length=1, max_length=16)
    max_hits: int = Field(100, ge=1, le=1000)
    timeout_ms: int = Field(1000, ge=10, le=MAX_SCAN_MS)
    writable_only: bool = Field(True, description="Scan only writable mappings (data, heap, stack).")


class ScanHit(Result):
    """One place a value was found."""

    address: HexAddress
    value: int = Field(description="The index of the value in 'values'.")
    module: str | None = None
    static_address: HexAddress | None = None


class LiveMemscan(Result):
    """Where the values are, as far as the scan got."""

    items: list[ScanHit]
    complete: bool
    stop_reason: str = Field(description="'range_end', 'limit' (max_hits) or 'timeout'.")
    scanned_bytes: int


@method("live.memscan", effect=READ_ONLY, long_running=True, requires=REQUIRES)
def live_memscan(ws: Any, p: LiveMemscanParams, ctx: CallContext) -> LiveMemscan:
    """Scan the pinned process's memory for values (/proc/PID/mem; it keeps running), bounded in time and hits."""
    patterns = [v.pattern() for v in p.values]
    overlap = max(len(x) for x in patterns) - 1
    deadline = time.monotonic() + p.timeout_ms / 1000
    hits: list[ScanHit] = []
    scanned = 0
    reason = "range_end"
    with LiveCall(ws) as target:
        pid = target.pinned.pid
        locate(target)
        maps = [
            m
            for m in read_maps(pid)
            if m.perms.startswith("r") and (not p.writable_only or m.perms[1] == "w") and m.path != "[vvar]"
        ]
        try:
            mem = open(f"/proc/{pid}/mem", "rb", buffering=0)  # noqa: SIM115 - closed below
        except OSError:
            raise BinlensError(
                "unavailable", "the server cannot read the process's memory", details={"reason": "permission_denied"}
            ) from None
        try:
            for m in maps:
                pos = m.start
                while pos < m.end and reason == "range_end":
                    if time.monotonic() > deadline:
                        reason = "timeout"
                        break
                    ctx.check_cancelled()
                    n = min(CHUNK, m.end - pos)
                    try:
                        mem.seek(pos)
                        data = mem.read(n + overlap if pos + n < m.end else n) or b""
                    except OSError:
                        break  # (a mapping that went away or cannot be read)
                    scanned += n
                    for index, pat in enumerate(patterns):
                        at = data.find(pat)
                        while at != -1 and at < n:
                            runtime = pos + at
                            hits.append(
                                ScanHit(
                                    address=hex(runtime),
                                    value=index,
                                    module=m.path or None,
                                    static_address=hex_text(static_of(target, runtime)),
                                )
                            )
                            if len(hits) >= p.max_hits:
                                reason = "limit"
                                break
                            at = data.find(pat, at + 1)
                        if reason != "range_end":
                            break
                    pos += n
                if reason != "range_end":
                    break
        finally:
            mem.close()
    hits.sort(key=lambda h: int(h.address, 16))
    result = LiveMemscan(items=hits, complete=reason == "range_end", stop_reason=reason, scanned_bytes=scanned)
    bounded(result)
    return result


class WatchTarget(PlaceParams):
    """A place to watch: a runtime address or a static selector of the program (through the slide)."""

    address: RuntimeAddress | None = None
    selector: Selector | None = None
    size: int = Field(8, ge=1, le=64)


class LiveWatchParams(Params):
    """Sample places of the pinned process's memory for a while and report each change."""

    targets: list[WatchTarget] = Field(min_length=1, max_length=16)
    duration_ms: int = Field(1000, ge=1, le=MAX_SCAN_MS)
    interval_ms: int = Field(10, ge=1, le=1000, description="Time between two samples.")
    max_changes: int = Field(200, ge=1, le=1000)


class WatchChange(Result):
    """One observed change of a place."""

    t_ms: float = Field(description="Milliseconds after the watch started.")
    target: int = Field(description="The index of the place in 'targets'.")
    old: str = Field(description="Hex bytes before.")
    new: str = Field(description="Hex bytes after.")


class WatchedPlace(Result):
    """A watched place and its first and last values."""

    address: HexAddress
    static_address: HexAddress | None = None
    initial: str | None = Field(description="Hex bytes at the start (null: unreadable).")
    final: str | None


class LiveWatch(Result):
    """What changed, sampled every interval_ms (a change and its undo between two samples go unseen)."""

    places: list[WatchedPlace]
    items: list[WatchChange]
    samples: int
    complete: bool
    stop_reason: str = Field(description="'duration' or 'limit' (max_changes).")


def read_place(mem: Any, address: int, size: int) -> bytes | None:
    try:
        mem.seek(address)
        data = mem.read(size)
    except OSError:
        return None
    return data if data is not None and len(data) == size else None


@method("live.watch", effect=READ_ONLY, long_running=True, requires=REQUIRES)
def live_watch(ws: Any, p: LiveWatchParams, ctx: CallContext) -> LiveWatch:
    """Sample places of the pinned process's memory for up to 5 s and report each change (it keeps running)."""
    with LiveCall(ws) as target:
        locate(target)
        places: list[int] = []
        for i, t in enumerate(p.targets):
            if t.address is not None:
                places.append(int(t.address, 16))
                continue
            assert t.selector is not None
            static, _ = select_address(target.prog, t.selector)
            if target.slide is None:
                raise BinlensError(
                    "unavailable", "the program is not mapped in the process", target=f"/params/targets/{i}"
                )
            places.append(static + target.slide)
        try:
            mem = open(f"/proc/{target.pinned.pid}/mem", "rb", buffering=0)  # noqa: SIM115 - closed below
        except OSError:
            raise BinlensError(
                "unavailable", "the server cannot read the process's memory", details={"reason": "permission_denied"}
            ) from None
        changes: list[WatchChange] = []
        reason = "duration"
        samples = 0
        try:
            start = time.monotonic()
            initial = [read_place(mem, a, t.size) for a, t in zip(places, p.targets, strict=True)]
            last = list(initial)
            while time.monotonic() - start < p.duration_ms / 1000 and reason == "duration":
                time.sleep(p.interval_ms / 1000)
                ctx.check_cancelled()
                samples += 1
                for i, (a, t) in enumerate(zip(places, p.targets, strict=True)):
                    now = read_place(mem, a, t.size)
                    if now != last[i] and now is not None and last[i] is not None:
                        old = last[i]
                        assert old is not None
                        t_ms = round((time.monotonic() - start) * 1000, 3)
                        changes.append(WatchChange(t_ms=t_ms, target=i, old=old.hex(), new=now.hex()))
                        if len(changes) >= p.max_changes:
                            reason = "limit"
                            break
                    last[i] = now
        finally:
            mem.close()
    result = LiveWatch(
        places=[
            WatchedPlace(
                address=hex(a),
                static_address=hex_text(static_of(target, a)),
                initial=v.hex() if v is not None else None,
                final=f.hex() if f is not None else None,
            )
            for a, v, f in zip(places, initial, last, strict=True)
        ],
        items=changes,
        samples=samples,
        complete=reason == "duration",
        stop_reason=reason,
    )
    bounded(result)
    return result
