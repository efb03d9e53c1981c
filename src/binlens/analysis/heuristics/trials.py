"""Trials in gaps: decoding code nothing reached to see whether it behaves like a function of its own."""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import TYPE_CHECKING

from binlens.analysis.model import T_BAD, T_CALL, T_COND, T_FALL, T_ICALL, T_IJUMP, T_JUMP, T_RET

if TYPE_CHECKING:
    from binlens.analysis.discovery.explorer import Explorer

_TRIAL_CHUNKS = 4096  # chunks a trial decodes at most before it is taken as no function


def _nowhere(va: int, lo: int, hi: int) -> bool:
    """`self_contained`'s default: no jump target is the entry of another gap's function."""
    return False


def self_contained(
    explorer: Explorer,
    start: int,
    gap_end: int,
    starts: Container[int],
    elsewhere: Callable[[int, int, int], bool] = _nowhere,
    case_labels: set[int] | None = None,
) -> tuple[bool, set[int]]:
    """Does code decoded from `start` stay inside its gap (leaving only by calls and tail calls)?
    Returns that and the chunks the trial decoded.

    Unreached blocks of a function (cases of an unresolved switch, code after a call wrongly
    thought to return) jump back into explored code; a function that nothing calls does not.
    The cases of a bounded switch met on the way are part of the trial (and added to `case_labels`).
    """
    # (address, soft): code reached through a switch's cases is soft: a case that leaves the gap
    # or runs into bytes decoded otherwise before is skipped, not taken as evidence against
    stack = [(start, False)]
    seen: set[int] = set()
    rets = 0
    while stack:
        a, soft = stack.pop()
        if a in seen:
            continue
        seen.add(a)
        if len(seen) > _TRIAL_CHUNKS:
            return False, seen
        if a != start and a in starts:
            continue
        if not start <= a < gap_end:
            if soft:
                continue
            return False, seen
        c = explorer.chunk(a)
        if c is None or c[1] == T_BAD:
            if soft:
                continue
            return False, seen
        _end, term, t, last = c
        if term == T_JUMP and t[0] != start and (t[0] in starts or elsewhere(t[0], start, gap_end)):
            rets += 1  # a tail call to a known function, or to an aligned entry in another gap
        elif term in (T_FALL, T_JUMP):
            if term == T_FALL:
                explorer.note_trial_path(a, t[0])  # the path a switch's bound check is found on
            stack.append((t[0], soft))
        elif term == T_COND:
            explorer.note_trial_path(a, t[1])
            stack.extend((x, soft) for x in t)
        elif term in (T_CALL, T_ICALL):
            stack.append((t[1], soft))
        elif term == T_RET:
            rets += 1
        elif term == T_IJUMP:
            cases = explorer.trial_cases(a, last)
            if cases:
                stack.extend((x, True) for x in cases)
                if case_labels is not None:
                    case_labels.update(cases)
    return rets > 0, seen


def descend(explorer: Explorer, entry: int) -> list[int]:
    """The chunks descent from `entry` reaches that it had not reached before (the discovery after
    this round walks on from them): what a function taken now covers, callees and literal pools
    read included, before the next candidate in its gap is looked for."""
    fresh: list[int] = []
    explorer.traverse([entry], explorer.noreturn, fresh)
    return fresh


def decodes(explorer: Explorer, va: int) -> bool:
    """Does code at `va` decode into a chunk without an invalid instruction?"""
    c = explorer.chunk(va)
    return c is not None and c[1] != T_BAD
