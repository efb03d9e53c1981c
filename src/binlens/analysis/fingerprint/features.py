"""A function's fingerprint (`fingerprint`), its MinHash, and the similarity of two fingerprints."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from binlens.analysis.fingerprint.model import (
    CLASSES,
    EMPTY_BIN,
    MINHASH_BINS,
    Fingerprint,
    FunctionFacts,
    InsnFeature,
)

InsnSource = Callable[[int, int], list[InsnFeature]]
_MASK64 = 0xFFFFFFFFFFFFFFFF
_MAX_CONSTANTS = 64
_MAX_STRINGS = 32
_STRING_CAP = 200


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of a 64-bit value (the same in every process)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _text_hash(tag: str, text: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{tag}\0{text}".encode(errors="replace"), digest_size=8).digest(), "little")


def minhash(tokens: Iterable[int]) -> tuple[int, ...]:
    """One-permutation MinHash of 64-bit feature hashes: the top 5 bits pick a bin, each bin keeps
    the least low 32 bits (`EMPTY_BIN` when no feature fell in it)."""
    bins = [EMPTY_BIN] * MINHASH_BINS
    shift = 64 - (MINHASH_BINS.bit_length() - 1)
    for token in tokens:
        h = _mix(token)
        b = h >> shift
        v = h & 0xFFFFFFFF
        if v < bins[b]:
            bins[b] = v
    return tuple(bins)


def minhash_similarity(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """The share of bins two MinHashes agree on, of those not empty in both (an estimate of the
    Jaccard similarity of their feature sets)."""
    seen = same = 0
    for x, y in zip(a, b, strict=False):
        if x == EMPTY_BIN and y == EMPTY_BIN:
            continue
        seen += 1
        same += x == y
    return same / seen if seen else 1.0


def fingerprint(facts: FunctionFacts, insns: InsnSource) -> Fingerprint:
    """The fingerprint of one function, its instructions read block by block through `insns`."""
    digest = hashlib.blake2b(digest_size=16)
    classes = [0] * len(CLASSES)
    constants: set[int] = set()
    features: list[int] = []
    count = 0
    mix = 0x100000001B3
    for start, end in facts.blocks:
        feats = insns(start, end)
        digest.update(b"\xff".join([f[0] for f in feats]))
        digest.update(b"\xfe")
        prev2 = prev1 = 0
        for _token, m, cls, imm in feats:
            classes[cls] += 1
            if imm:
                constants.update(imm)
            features.append((prev2 * mix ^ prev1 * 0x1000193 ^ m) & _MASK64)  # a mnemonic 3-gram
            prev2, prev1 = prev1, m
        count += len(feats)
    loops = sum(1 for s, d in facts.edges if d <= s)
    strings = sorted({s[:_STRING_CAP] for s in facts.strings})[:_MAX_STRINGS]
    imports = sorted(set(facts.imports))
    consts = sorted(constants)[:_MAX_CONSTANTS]
    features += [_mix(c ^ 0x5EED) for c in consts]
    features += [_text_hash("s", s) for s in strings]
    features += [_text_hash("i", s) for s in imports]
    features.append(_text_hash("g", f"{len(facts.blocks)}/{len(facts.edges)}/{loops}"))
    return Fingerprint(
        address=facts.address,
        size=facts.size,
        name=facts.name,
        exact=digest.digest(),
        blocks=len(facts.blocks),
        edges=len(facts.edges),
        loops=loops,
        instructions=count,
        classes=tuple(classes),
        constants=tuple(consts),
        strings=tuple(strings),
        imports=tuple(imports),
        callees=tuple(dict.fromkeys(facts.callees)),
        minhash=minhash(set(features)),
    )


def _ratio(a: int, b: int) -> float:
    return (min(a, b) + 1) / (max(a, b) + 1)


def _jaccard(a: Iterable[object], b: Iterable[object]) -> float | None:
    sa, sb = set(a), set(b)
    union = sa | sb
    return len(sa & sb) / len(union) if union else None


def shared_values(a: Fingerprint, b: Fingerprint) -> float | None:
    """The Jaccard similarity of two functions' constants, strings and imports (None: neither has
    any): what tells apart template instances whose code differs only in a table size or a shift."""
    return _jaccard(
        [*a.constants, *("s" + s for s in a.strings), *("i" + s for s in a.imports)],
        [*b.constants, *("s" + s for s in b.strings), *("i" + s for s in b.imports)],
    )


# the weights of `similarity`'s parts: (MinHash, CFG shape, class histogram, shared values)
Weights = tuple[float, float, float, float]
PAIR_WEIGHTS: Weights = (0.4, 0.2, 0.25, 0.15)


def similarity(a: Fingerprint, b: Fingerprint, weights: Weights = PAIR_WEIGHTS) -> float:
    """How alike two functions are, 0..1: 1.0 exactly when their exact fingerprints agree; else a
    weighted mean (`weights`) of the MinHash estimate, the CFG shape, the instruction-class
    histogram and the constants, strings and imports they share (at most 0.99)."""
    if a.exact == b.exact:
        return 1.0
    shape = (
        _ratio(a.blocks, b.blocks)
        + _ratio(a.edges, b.edges)
        + _ratio(a.instructions, b.instructions)
        + _ratio(a.loops, b.loops)
    ) / 4
    total = sum(a.classes) + sum(b.classes)
    hist = 1.0 - sum(abs(x - y) for x, y in zip(a.classes, b.classes, strict=True)) / total if total else 1.0
    w_mh, w_shape, w_hist, w_values = weights
    parts = [(w_mh, minhash_similarity(a.minhash, b.minhash)), (w_shape, shape), (w_hist, hist)]
    sets = shared_values(a, b)
    if sets is not None:
        parts.append((w_values, sets))
    score = sum(w * v for w, v in parts) / sum(w for w, _ in parts)
    return min(0.99, round(score, 4))
