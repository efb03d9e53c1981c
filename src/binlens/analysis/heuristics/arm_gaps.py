"""The gap stage of ARM32 (little-endian code): pushes in gaps, then leaf functions (no push)."""

from __future__ import annotations

from binlens.analysis.heuristics.arm import arm_gap_candidates, arm_leaf_candidates, arm_runs_into
from binlens.analysis.heuristics.gapmap import cover
from binlens.analysis.heuristics.round import Round
from binlens.analysis.heuristics.trials import descend

_PROLOGUE = frozenset({"prologue"})  # the sources of a start only the gap stages guessed
# one leaf to look at: (after a push, address, gap end, after a tail call, the sub-gap (entry, end) it lies in)
Leaf = tuple[bool, int, int, bool, "tuple[int, int] | None"]


def arm_gaps(r: Round) -> None:
    """Pushes in gaps are functions; leaf functions (no push) are looked at only after the data
    pointers, which name a function's state (a guess in the wrong one would stay), and only in a
    round that found no push, since descent from a push claims its gap."""
    if r.image.code_endian != "little":
        return
    covered = r.gaps.covered(r.bodies)
    for va, _gap_end in arm_gap_candidates(r.codemap, r.capstone, covered, r.gaps.memo):
        r.accept(va, "prologue", in_range=True)
    if not r.out and r.gaps.after_data:
        _leaves(r, covered)


def _leaves(r: Round, covered: dict[int, bytearray]) -> None:
    """Leaf functions in gaps. A leaf taken covers what descent from it reaches, and the rest of its
    gap is looked at again in the same round, as the next round would: its push first, then its leaf
    (else runs of small leaves laid out one after another take a round each: ~50 rounds on some
    armv7 files). Not for pushes: found in the first rounds, in gaps that still hold much unreached code,
    a push guessed before the discovery of the code around it can be a literal pool's words."""
    image, codemap, backend = r.image, r.codemap, r.capstone
    decoded = backend.decoded_thumb
    prior = 2 * sum(decoded.get(f, False) for f in r.starts) >= len(r.starts)  # most functions' state
    first = arm_leaf_candidates(image, codemap, backend, covered, prior)
    work: list[Leaf] = [(False, *leaf, None) for leaf in reversed(first)]
    while work:
        push, va, gap_end, after_tail, within = work.pop()
        if push:
            r.accept(va, "prologue", in_range=True)
            if (va & ~1) not in r.out:  # no function there: the sub-gap's leaf, if any
                sub = arm_leaf_candidates(image, codemap, backend, covered, prior, within)
                work.extend((False, *leaf, within) for leaf in reversed(sub))
                continue
        elif r.starts.get(gap_end) == _PROLOGUE and arm_runs_into(codemap, backend, va, gap_end):
            # the checks before a frame whose push was found first: the entry is here (the
            # push, which this code now runs into, is dropped after the next discovery)
            r.accept(va, "prologue", in_range=True)
            continue
        else:
            r.accept(va, "prologue", need_ret=True, in_range=True, gap_end=gap_end, trial=after_tail)
        entry = va & ~1
        if entry not in r.out or entry in r.bound:
            continue
        r.bound.add(entry)
        cover(codemap, covered, r.explorer, descend(r.explorer, entry))
        within = (entry, gap_end)
        pushes = arm_gap_candidates(codemap, backend, covered, r.gaps.memo, within)
        if pushes:
            work.extend((True, p, end, False, within) for p, end in reversed(pushes))
        else:
            sub = arm_leaf_candidates(image, codemap, backend, covered, prior, within)
            work.extend((False, *leaf, within) for leaf in reversed(sub))
