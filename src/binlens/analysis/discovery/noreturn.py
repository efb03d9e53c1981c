"""Which functions cannot return: the fixpoint over function bodies (`Discovery.run` in engine.py).

`returning_functions` is the least fixpoint on the bodies of one round; `noret_callers` carries
the functions just found not to return on to their callers on the same bodies, so a chain of
callers is found in one round instead of one level a round.
"""

from __future__ import annotations

from collections.abc import Callable

from binlens.analysis.model import T_CALL, T_RET, Body

EdgesOf = Callable[[int, Body], list]  # a body's edges (`Explorer.body_edges`: walked again when not kept)


def _kept_edges(_f: int, b: Body) -> list:
    return b.edges or []


def returning_functions(
    bodies: dict[int, Body],
    noret_slots: set[int],
    chunks: dict[int, tuple] | None = None,
    edges_of: EdgesOf = _kept_edges,
) -> set[int]:
    """Least fixpoint: the functions that can return to their caller. A function returns when it
    has a reachable return or an open end (benefit of the doubt), tail-calls something outside the
    bodies that is not known not to return, or tail-calls a function that returns; a worklist
    carries each new returning function to the functions waiting on it.

    With `chunks`, a function that calls itself is looked at without the edges back from those
    calls: its innermost activation returns, if any does, by a path with no such call on it, so
    code reached only after one (`call luaD_throw; nop`, running into the next function) does
    not make it return."""
    returns: set[int] = set()
    waiting: dict[int, list[int]] = {}  # callee -> the functions that tail-call it
    work: list[int] = []
    for f, b in bodies.items():
        ok = b.has_ret or b.open_end
        tails = b.tails
        if chunks is not None:
            if b.self_exits is None:  # once per body (one is rebuilt when anything it holds changes)
                calls_itself = f in b.calls[1::2]
                b.self_exits = _exits(f, b, chunks, {f}, edges_of(f, b)) if calls_itself else ()
            if b.self_exits:
                ok, tails = b.self_exits
        if not ok:
            for _site, callee in tails:
                if callee in bodies:
                    waiting.setdefault(callee, []).append(f)
                elif callee not in noret_slots:
                    ok = True
                    break
        if ok:
            returns.add(f)
            work.append(f)
    while work:
        for f in waiting.pop(work.pop(), ()):
            if f not in returns:
                returns.add(f)
                work.append(f)
    return returns


def noret_callers(
    bodies: dict[int, Body],
    chunks: dict[int, tuple],
    noret: set[int],
    found: set[int],
    noret_slots: set[int],
    edges_of: EdgesOf = _kept_edges,
) -> set[int]:
    """The functions of `bodies` that cannot return once the calls to `found` do not: what the
    next rounds of the fixpoint would find, one level of callers per round (each a full
    re-walk of the code), found here on the bodies already built.

    `bodies` were walked with `noret` less `found`: a call to a function of `found` still falls
    through in them. A caller whose entry reaches no return, no open end and no tail call to a
    function that may return once those call-return edges are cut joins the answer, and its
    own callers are looked at again. Only functions that certainly cannot return are given:
    the caller runs the round again with them, which checks the answer on the bodies walked anew.
    """
    callers: dict[int, set[int]] = {}
    for f, b in bodies.items():
        for callee in b.calls[1::2]:
            callers.setdefault(callee, set()).add(f)
        for _site, callee in b.tails:
            callers.setdefault(callee, set()).add(f)
    dead = noret | found
    out: set[int] = set()
    work = [g for g in found if g in callers]
    while work:
        for f in callers.get(work.pop(), ()):
            if f not in dead and not _may_return(f, bodies, chunks, dead, noret_slots, edges_of):
                dead.add(f)
                out.add(f)
                work.append(f)
    return out


def _may_return(
    f: int, bodies: dict[int, Body], chunks: dict[int, tuple], dead: set[int], noret_slots: set[int], edges_of: EdgesOf
) -> bool:
    """Can `f`'s body reach a return from its entry without a call to a function of `dead`?"""
    ok, tails = _exits(f, bodies[f], chunks, dead, edges_of(f, bodies[f]))
    return ok or any((c not in dead) if c in bodies else (c not in noret_slots) for _site, c in tails)


def _exits(f: int, b: Body, chunks: dict[int, tuple], cut: set[int], edges: list) -> tuple[bool, list[tuple[int, int]]]:
    """From `f`'s entry, without the edges back from calls to `cut`: (a return, an open end or an
    undecoded chunk is reached; the tail calls reached, as `Body.tails` lists them)."""
    if b.open_end:
        return True, []
    tails: dict[int, list[tuple[int, int]]] = {}
    for site, callee in b.tails:
        tails.setdefault(site, []).append((site, callee))
    succ: dict[int, list[tuple[int, str]]] = {}
    it = iter(edges)
    for src, dst, kind in zip(it, it, it, strict=True):
        succ.setdefault(src, []).append((dst, kind))
    reached: list[tuple[int, int]] = []
    seen = {f}
    stack = [f]
    while stack:
        a = stack.pop()
        c = chunks.get(a)
        if c is None:
            return True, []
        _end, term, t, last = c
        if term == T_RET:
            return True, []
        reached.extend(tails.get(last, ()))
        for dst, kind in succ.get(a, ()):
            if kind == "call_return" and term == T_CALL and t[0] in cut:
                continue
            if dst not in seen:
                seen.add(dst)
                stack.append(dst)
    return False, reached
