"""live.probe, live.profile: gdb attached to the pinned process for at most 5 s (breakpoints that
count and sample, and where every thread is), then detached; the process keeps running."""

from __future__ import annotations

import contextlib
import time
from typing import Annotated, Any

from pydantic import Field

from binlens.api.analysis import select_address
from binlens.api.debug_target import (
    ANALYSIS_WAIT_S,
    function_ref,
    hex_text,
    locate,
    static_of,
)
from binlens.api.live import MAX_SCAN_MS, REQUIRES, LiveCall, LiveTarget, WatchTarget, bounded
from binlens.api.models import HexAddress, Params, Result
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.jobs.state import analysis_of
from binlens.providers.target import read_maps


class LiveProbeParams(Params):
    """Count hits of places in the pinned process for a while, with callers and registers."""

    addresses: list[WatchTarget] = Field(
        min_length=1, max_length=16, description="Places (a runtime address or a static selector; 'size' is ignored)."
    )
    callers: bool = Field(True, description="Report each hit's caller (the return address, resolved).")
    regs: list[Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,31}$")]] = Field(
        default_factory=list, max_length=16
    )
    duration_ms: int = Field(1000, ge=1, le=MAX_SCAN_MS)
    max_hits: int = Field(200, ge=1, le=1000)


class ProbeHit(Result):
    """One hit of a probed place."""

    t_ms: float
    probe: int = Field(description="The index of the place in 'addresses'.")
    thread: int | None = None
    caller: HexAddress | None = None
    caller_static: HexAddress | None = None
    caller_function: str | None = None
    regs: dict[str, str] = Field(default_factory=dict)


class LiveProbe(Result):
    """The hits, per place and one by one."""

    places: list[HexAddress]
    counts: list[int]
    items: list[ProbeHit]
    complete: bool
    stop_reason: str = Field(description="'duration', 'limit' (max_hits) or 'exited'.")


@method("live.probe", effect=READ_ONLY, long_running=True, requires=(*REQUIRES, "provider-kind:debugger"))
def live_probe(ws: Any, p: LiveProbeParams, ctx: CallContext) -> LiveProbe:
    """Break on places of the pinned process for up to 5 s (gdb attached, then detached): hits, callers, registers.

    Each hit stops the process for a moment (a few gdb round trips) before it runs on; once the
    duration is over the breakpoints are removed and gdb detaches, the process keeps running.
    """
    from binlens.providers import registry as providers
    from binlens.providers.gdb import GdbSession

    provider, _ = providers.choose("auto", "debugger")
    with LiveCall(ws) as target:
        locate(target)
        places = []
        for i, t in enumerate(p.addresses):
            if t.address is not None:
                places.append(int(t.address, 16))
            else:
                assert t.selector is not None
                static, _ = select_address(target.prog, t.selector)
                if target.slide is None:
                    raise BinlensError("unavailable", "the program is not mapped", target=f"/params/addresses/{i}")
                places.append(static + target.slide)
        if p.callers:  # names for the callers, before the process is stopped at all
            with contextlib.suppress(BinlensError):
                analysis_of(target.prog).require(ctx, wait=True, timeout_s=ANALYSIS_WAIT_S)
        session = provider.open_session(target.prog.image)
        assert isinstance(session, GdbSession)
        try:
            return bounded(_probe(session, target, places, p, ctx))
        finally:
            session.close()  # (an attached process is detached, never killed)


def _probe(session: Any, target: LiveTarget, places: list[int], p: LiveProbeParams, ctx: CallContext) -> LiveProbe:
    session.attach(target.pinned.pid, 10)
    names: list[str] = [
        str(n) for n in session.command("-data-list-register-names", timeout=10).get("register-names") or []
    ]
    numbers = []
    for i, reg in enumerate(p.regs):
        if reg not in names:
            raise BinlensError("not_found", f"no register {reg!r}", target=f"/params/regs/{i}")
        numbers.append(names.index(reg))
    index = {}
    for i, address in enumerate(places):
        got = session.command(f"-break-insert *{hex(address)}", timeout=10)
        index[int((got.get("bkpt") or {}).get("number", 0))] = i
    counts = [0] * len(places)
    hits: list[ProbeHit] = []
    reason = "duration"
    start = time.monotonic()
    deadline = start + p.duration_ms / 1000
    seq = session.seq
    session.command("-exec-continue", timeout=10)
    while True:
        ctx.check_cancelled()
        event = session.wait_event(seq, max(0.0, deadline - time.monotonic()))
        if event is None:
            break
        seq = event["seq"]
        if event["kind"] == "exited":
            reason = "exited"
            break
        if event["kind"] == "breakpoint" and event.get("breakpoint") in index:
            probe = index[event["breakpoint"]]
            counts[probe] += 1
            hit = ProbeHit(t_ms=round((time.monotonic() - start) * 1000, 3), probe=probe, thread=event.get("thread"))
            if numbers:
                got = session.command(f"-data-list-register-values x {' '.join(map(str, numbers))}", timeout=10)
                hit.regs = {names[int(r["number"])]: str(r["value"]) for r in got.get("register-values") or []}
            if p.callers:
                frames = session.command("-stack-list-frames 1 1", timeout=10).get("stack") or []
                row = frames[0].get("frame", frames[0]) if frames and isinstance(frames[0], dict) else {}
                if row.get("addr"):
                    caller = int(str(row["addr"]), 16)
                    static = static_of(target, caller)
                    fn = function_ref(target, static, 0)
                    hit.caller, hit.caller_static = hex(caller), hex_text(static)
                    hit.caller_function = fn.name if fn else (row.get("func") if row.get("func") != "??" else None)
            hits.append(hit)
            if len(hits) >= p.max_hits:
                reason = "limit"
                break
        if time.monotonic() >= deadline:
            break
        session.command("-exec-continue", timeout=10)
    if session.state == "running":
        session.command("-exec-interrupt", timeout=10)
        session.wait_stop(5)
    if session.state == "stopped":
        for number in index:
            session.command(f"-break-delete {number}", timeout=10)
        session.command("-target-detach", timeout=10)
        session.state = "detached"
    return LiveProbe(
        places=[hex(a) for a in places], counts=counts, items=hits, complete=reason == "duration", stop_reason=reason
    )


class LiveProfileParams(Params):
    """Sample where the pinned process's threads are for a while."""

    duration_ms: int = Field(1000, ge=1, le=MAX_SCAN_MS)
    interval_ms: int = Field(10, ge=1, le=1000, description="Time the process runs between two samples.")
    top: int = Field(50, ge=1, le=500, description="Places reported, most sampled first.")


class ProfileEntry(Result):
    """Samples in one function of the program (or one module outside it)."""

    samples: int
    share: float = Field(description="samples / all samples.")
    function: str | None = None
    static_address: HexAddress | None = Field(None, description="The function's start in the program.")
    module: str | None = None


class LiveProfile(Result):
    """Where the threads were, most sampled first."""

    samples: int
    items: list[ProfileEntry]
    stop_reason: str = Field(description="'duration' or 'exited'.")


@method("live.profile", effect=READ_ONLY, long_running=True, requires=(*REQUIRES, "provider-kind:debugger"))
def live_profile(ws: Any, p: LiveProfileParams, ctx: CallContext) -> LiveProfile:
    """Sample every thread's place in the pinned process for up to 5 s (gdb attached, then detached).

    The process runs `interval_ms` between two samples, stopped for a moment at each (an
    interrupt, the threads' places, a continue); samples are grouped by the program's function,
    else by module.
    """
    from binlens.providers import registry as providers
    from binlens.providers.gdb import GdbSession

    provider, _ = providers.choose("auto", "debugger")
    with LiveCall(ws) as target:
        locate(target)
        with contextlib.suppress(BinlensError):
            analysis_of(target.prog).require(ctx, wait=True, timeout_s=ANALYSIS_WAIT_S)
        session = provider.open_session(target.prog.image)
        assert isinstance(session, GdbSession)
        try:
            counts, total, reason = _profile(session, target, p, ctx)
        finally:
            session.close()  # (an attached process is detached, never killed)
    items = []
    for (name, start, module), n in sorted(counts.items(), key=lambda kv: -kv[1])[: p.top]:
        items.append(
            ProfileEntry(
                samples=n,
                share=round(n / total, 4) if total else 0.0,
                function=name,
                static_address=hex_text(start),
                module=module,
            )
        )
    return bounded(LiveProfile(samples=total, items=items, stop_reason=reason))


def _profile(
    session: Any, target: LiveTarget, p: LiveProfileParams, ctx: CallContext
) -> tuple[dict[tuple[str | None, int | None, str | None], int], int, str]:
    session.attach(target.pinned.pid, 10)
    maps = read_maps(target.pinned.pid)
    counts: dict[tuple[str | None, int | None, str | None], int] = {}
    total = 0
    reason = "duration"
    deadline = time.monotonic() + p.duration_ms / 1000
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        for t in session.command("-thread-info", timeout=10).get("threads") or []:
            frame = t.get("frame") if isinstance(t, dict) else None
            if not isinstance(frame, dict) or not frame.get("addr"):
                continue
            pc = int(str(frame["addr"]), 16)
            static = static_of(target, pc)
            fn = function_ref(target, static, 0)
            if fn is not None:
                key: tuple[str | None, int | None, str | None] = (fn.name, int(fn.address, 16), target.prog.path.name)
            else:
                module = next((m.path for m in maps if m.start <= pc < m.end), None)
                key = (frame.get("func") if frame.get("func") != "??" else None, None, module)
            counts[key] = counts.get(key, 0) + 1
            total += 1
        seq = session.seq
        session.command("-exec-continue", timeout=10)
        if session.wait_event(seq, p.interval_ms / 1000) is not None:  # (a stop of its own: it exited, a signal)
            if session.state == "exited":
                reason = "exited"
                break
            continue
        seq = session.seq
        session.command("-exec-interrupt", timeout=10)
        if session.wait_event(seq, 5) is None or session.state == "exited":
            reason = "exited" if session.state == "exited" else reason
            break
    if session.state == "running":
        session.command("-exec-interrupt", timeout=10)
        session.wait_stop(5)
    if session.state == "stopped":
        session.command("-target-detach", timeout=10)
        session.state = "detached"
    return counts, total, reason
