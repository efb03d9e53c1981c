"""How the corpus ranks its candidates: a score for functions of builds at different optimisation
levels (`corpus_similarity`), and a function's inlined view (`inlined`): the function merged with
the callees a compiler may inline into it.

Across optimisation levels the code's shape moves most (inlining, unrolling, scheduling change the
block and instruction counts), the values a function uses least (its constants, strings, imports):
`corpus_similarity` weighs the same parts as `similarity()` (`compare.programs`'s pairwise score)
with the shape counting less (0.1, not 0.2) and the shared values more (0.25, not 0.15).

Inlining: at -O3 a function often holds the bodies of callees that stay calls at -O2, so it
resembles neither its -O2 self nor any one callee. The MinHash of a union of feature sets is the
bin-wise minimum of their MinHashes, so the store keeps, beside each function, the ids of its
inlinable callees, finds functions by the bands of their inlined view too, and scores a candidate
smaller than the query as the better of itself and its inlined view. A query given its program's
other functions has an inlined view too, scored against stored functions larger than itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from binlens.analysis.fingerprint.features import Weights, similarity
from binlens.analysis.fingerprint.model import Fingerprint
from binlens.corpus.codec import stored_form

INLINE_MIN_INSTRUCTIONS = 3  # a callee smaller is a thunk or a stub: nothing to inline
INLINE_MAX_INSTRUCTIONS = 200  # a callee larger is rarely inlined whole
INLINE_MAX_CALLEES = 16  # the context a function keeps at most (its first callees by call site)
_MAX_CONSTANTS = 64  # as a fingerprint keeps them


def inline_callees(
    fp: Fingerprint, by_address: Mapping[int, Fingerprint], tail_calls: Sequence[int] = ()
) -> list[Fingerprint]:
    """The callees of `fp` (from the same binary, `by_address`; its calls, then the functions it
    tail-jumps to, `tail_calls`) a compiler may inline into it: neither itself, nor a PLT thunk,
    nor under `INLINE_MIN_INSTRUCTIONS` or over `INLINE_MAX_INSTRUCTIONS` instructions; at most
    `INLINE_MAX_CALLEES`, in call-site order."""
    out = []
    for address in dict.fromkeys((*fp.callees, *tail_calls)):
        callee = by_address.get(address)
        if callee is None or address == fp.address or (callee.name or "").endswith("@plt"):
            continue
        if INLINE_MIN_INSTRUCTIONS <= callee.instructions <= INLINE_MAX_INSTRUCTIONS:
            out.append(callee)
            if len(out) == INLINE_MAX_CALLEES:
                break
    return out


def inlined(fp: Fingerprint, callees: Sequence[Fingerprint]) -> Fingerprint | None:
    """`fp` with `callees` merged in, as if inlined: MinHash the bin-wise minimum, counts and the
    histogram summed, constants, strings and imports united; None without callees. Its exact
    fingerprint is never a real one (an inlined view is never an exact match)."""
    if not callees:
        return None
    parts = [fp, *callees]
    return replace(
        fp,
        exact=b"inlined:" + fp.exact,
        blocks=sum(p.blocks for p in parts),
        edges=sum(p.edges for p in parts),
        loops=sum(p.loops for p in parts),
        instructions=sum(p.instructions for p in parts),
        classes=tuple(sum(column) for column in zip(*(p.classes for p in parts), strict=True)),
        constants=tuple(sorted({c for p in parts for c in p.constants}))[:_MAX_CONSTANTS],
        strings=tuple(sorted({s for p in parts for s in p.strings})),
        imports=tuple(sorted({s for p in parts for s in p.imports})),
        callees=(),
        minhash=tuple(min(column) for column in zip(*(p.minhash for p in parts), strict=True)),
    )


def query_view(
    query: Fingerprint, context: Sequence[Fingerprint], tail_calls: Sequence[int] = ()
) -> Fingerprint | None:
    """The inlined view of a query (in its stored form) from `context`, the other functions of
    its program (in any form), and the functions it tail-jumps to; None without inlinable
    callees."""
    by_address = {c.address: c for c in context}
    callees = inline_callees(query, by_address, tail_calls)
    return inlined(stored_form(query), [stored_form(c) for c in callees])


# code shape counts for less across builds, shared constants, strings and imports for more
CORPUS_WEIGHTS: Weights = (0.4, 0.1, 0.25, 0.25)


def corpus_similarity(a: Fingerprint, b: Fingerprint) -> float:
    """How alike two functions of possibly different builds are, 0..1: `similarity` weighing the
    MinHash estimate 0.4, the instruction-class histogram 0.25, the constants, strings and imports
    they share 0.25 and the CFG shape 0.1 (at most 0.99; 1.0 exactly when the exact fingerprints agree)."""
    return similarity(a, b, CORPUS_WEIGHTS)


def may_have_inlined(query: Fingerprint, stored: Fingerprint) -> bool:
    """Whether `query` may be `stored` with callees inlined: only a larger function can be (a
    stored function as large as the query or larger is scored as itself)."""
    return stored.instructions < query.instructions


def candidate_score(
    query: Fingerprint, stored: Fingerprint, view: Fingerprint | None, query_view: Fingerprint | None = None
) -> float:
    """A stored function's score for `query`: the best of itself, its inlined `view` (built only
    for a stored function smaller than the query) and, for a stored function larger than the
    query, the query's own inlined `query_view`."""
    score = corpus_similarity(query, stored)
    if score < 1.0:
        if view is not None:
            score = max(score, corpus_similarity(query, view))
        if query_view is not None and may_have_inlined(stored, query):
            score = max(score, corpus_similarity(query_view, stored))
    return score
