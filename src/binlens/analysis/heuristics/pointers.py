"""The pointer stages: code addresses taken by instructions (`code_offsets`), code pointers in data
(`data_prologues`: those whose target starts like a function; then `data_pointers`: all)."""

from __future__ import annotations

import bisect
from itertools import chain

from binlens.analysis.codemap import instruction_start
from binlens.analysis.heuristics.arm import arm_pushes
from binlens.analysis.heuristics.entries import prologue_test, starts_like_function
from binlens.analysis.heuristics.round import Round
from binlens.analysis.refs.xrefs import pointers_in_data


def code_offsets(r: Round) -> None:
    """Code addresses taken by instructions (`lea`, immediates) in code a function reaches; the stage
    runs again after later stages, since code found later takes addresses too (main's handlers).
    Each reference is looked at once, in the first round where its instruction is reached."""
    # AArch64, RISC-V, PowerPC, MIPS: a code address taken by code that starts like a function is
    # an entry even where a found function's blocks seem to run on (x86: `starts_like_function`)
    r.taken = prologue_test(r.image, r.codemap, r.mips) if not (r.x86 or r.arm) else None
    pending = r.gaps.offset_refs(r.backend)
    if not pending:
        return
    held = _held(r, pending)
    later = []
    # AArch64, RISC-V, PowerPC, MIPS (`taken`): an address that descent already ran into (the
    # fall-through after a call that does not return, which the callee's analysis missed) is
    # a function of its own when it starts like one (x86 has its own test in `Round.accept`)
    prologue = r.taken
    for (src, dst), inside_held in zip(pending, held, strict=True):
        if inside_held:
            if (
                prologue is not None
                and dst not in r.starts
                and not r.unexplored(dst)
                and instruction_start(r.codemap, dst)
                and not r.inside(dst)
                and prologue(dst)
            ):
                r.out[dst] = "pointer"
            else:
                r.accept(dst, "pointer")
        else:
            later.append((src, dst))
    pending[:] = later  # (the references whose instruction no function holds yet wait for a later round)


def _held(r: Round, pending: list[tuple[int, int]]) -> bytearray:
    """Whether each reference's source lies in a chunk some function holds, a byte each, taken before
    `accept` decodes (and may split) code (a list of every chunk's end would take 16 MiB on gcc's cc1)."""
    reached = sorted(chain.from_iterable(b.chunks for b in r.bodies.values()))  # repeats are harmless
    chunks = r.explorer.chunks
    return bytearray(
        (i := bisect.bisect_right(reached, src) - 1) >= 0 and src < chunks[reached[i]][0] for src, _ in pending
    )


def data_prologues(r: Round) -> None:
    """Code pointers in data whose target starts like a function (x86, MIPS, ARM in the state the
    pointer names): before the rest, so that a switch table's case labels do not become functions."""
    for _src, dst in pointers_in_data(r.image, r.codemap, set()):
        if (
            (r.x86 and starts_like_function(r.codemap, dst))
            or (r.mips and r.mips(dst))
            or (r.arm and arm_pushes(r.image, r.codemap, dst))  # a push in the state the pointer names
        ):
            r.accept(dst, "pointer")


def data_pointers(r: Round) -> None:
    """Every code pointer in data."""
    for _src, dst in pointers_in_data(r.image, r.codemap, set()):
        r.accept(dst, "pointer")
