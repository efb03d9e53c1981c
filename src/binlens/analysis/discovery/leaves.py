"""When an unconditional jump leaves its function: a tail call, unless it goes to a veneer.

A linker may move a branch of a long Thumb-2 function out of it: the Cortex-A8 erratum fix
(`--fix-cortex-a8`, the default for ARMv7-A) replaces a 32-bit branch that straddles a 4 KiB page
boundary with a `b.w` to a veneer placed after the last section, which does the branch (`beq.n
1f; b.w taken; 1: b.w fallthrough`) and jumps back. The veneer is part of the function that jumps
to it: every path through it goes back into that function's range at once, so its targets are
no function entries (taken for tail calls, they split SQLite's `resolveExprStep` into 25 parts).
"""

from __future__ import annotations

from collections.abc import Callable

from binlens.analysis.model import T_COND, T_JUMP

_VENEER_CHUNKS = 3  # a veneer's straight runs: a conditional branch and the two jumps back


def leaves(
    chunks: dict[int, tuple],
    f: int,
    nxt: int,
    ext: int | None,
    s: int,
    fragments: Callable[[int], bool],
) -> bool:
    """Does an unconditional jump from function `f` (the next start at `nxt`, its unwind range `ext`
    bytes when known) to `s` leave it (a tail call)? Not into a cold fragment, nor to a veneer."""
    if ext:
        out = not (f <= s < f + ext) and not fragments(s)
        hi = f + ext
    else:
        out = not fragments(s) and (s < f or s >= nxt)
        hi = nxt
    return out and not _veneer(chunks, s, f, hi)


def _veneer(chunks: dict[int, tuple], s: int, lo: int, hi: int) -> bool:
    """Is the code at `s` (outside [lo, hi)) a veneer: a few chunks of branches that all end in
    jumps back into [lo, hi)?"""
    todo, seen, back = [s], set(), False
    while todo:
        a = todo.pop()
        if a in seen:
            continue
        seen.add(a)
        c = chunks.get(a)
        if c is None or len(seen) > _VENEER_CHUNKS or c[0] - a > 8:
            return False  # unknown, longer, or more than a branch: code of its own
        _end, term, targets, _last = c
        if term not in (T_JUMP, T_COND):
            return False
        for t in targets:
            if lo <= t < hi:
                back = True
            elif t != s:
                todo.append(t)
    return back
