"""How the corpus store keeps a fingerprint compactly, and the LSH bands it is found by.

A stored function is its exact fingerprint (16 bytes), its MinHash (`MINHASH_BINS` little-endian
u32 minima, 128 bytes) and its other features as one blob of varints (`encode_features`): sizes,
CFG shape, the class histogram, the constants, and a 32-bit hash of each string and import (the
Jaccard similarity `similarity()` takes of those sets is the same on their hashes, barring
collisions), then the function's inlining context: the ids of the callees a compiler may inline
into it (`ranking.inline_callees`), each as its difference from the function's own id.
`stored_form` turns any fingerprint into what the store would give back, so a query and a stored
function are scored alike.

Bands: the MinHash's bins cut into `BANDS` bands of `BAND_ROWS` bins; each band not wholly empty
is hashed with its number and the corpus's id into one signed 64-bit key. Two functions share a band with probability
about s^BAND_ROWS for a MinHash similarity s, so with 16 bands of 2 bins a pair at s = 0.5 shares at
least one band 99% of the time, at s = 0.3 78% of the time. A function with an inlining context
also has the bands of its inlined view (`first_band` = `BANDS`: band numbers 16..31).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from binlens.analysis.fingerprint.model import CLASSES, EMPTY_BIN, MINHASH_BINS, Fingerprint

BAND_ROWS = 2
BANDS = MINHASH_BINS // BAND_ROWS
FEATURES_VERSION = 2  # the first byte of a features blob (1: without the callee list)
_MH = struct.Struct(f"<{MINHASH_BINS}I")


def pack_minhash(minhash: tuple[int, ...]) -> bytes:
    """The MinHash as a blob (an absent one as every bin empty)."""
    bins = minhash if len(minhash) == MINHASH_BINS else (EMPTY_BIN,) * MINHASH_BINS
    return _MH.pack(*bins)


def unpack_minhash(blob: bytes) -> tuple[int, ...]:
    """The MinHash a `pack_minhash` blob holds."""
    return tuple(_MH.unpack(bytes(blob)))


def band_keys(minhash: tuple[int, ...], corpus_id: int, first_band: int = 0) -> list[int]:
    """The LSH band keys of a MinHash in one corpus (signed 64-bit, one per band not wholly empty;
    the corpus is hashed in, so the band table needs no corpus column). Bands are numbered from
    `first_band`: `BANDS` for an inlined view, whose keys never meet a function's own."""
    bins = minhash if len(minhash) == MINHASH_BINS else (EMPTY_BIN,) * MINHASH_BINS
    keys = []
    for band in range(BANDS):
        part = bins[band * BAND_ROWS : (band + 1) * BAND_ROWS]
        if all(b == EMPTY_BIN for b in part):
            continue
        head = struct.pack("<QB", corpus_id, first_band + band)
        digest = hashlib.blake2b(head + struct.pack(f"<{BAND_ROWS}I", *part), digest_size=8).digest()
        keys.append(int.from_bytes(digest, "little", signed=True))
    return keys


def text_hash(text: str) -> str:
    """A string's or import's 32-bit hash as the stored features spell it (8 hex digits)."""
    return hashlib.blake2b(text.encode(errors="replace"), digest_size=4).hexdigest()


def _varint(out: bytearray, value: int) -> None:
    v = (value << 1) if value >= 0 else ((-value) << 1) - 1  # zigzag: small negatives stay small
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def encode_features(fp: Fingerprint, calls: Sequence[int] = ()) -> bytes:
    """The features `similarity()` reads, besides the exact fingerprint and the MinHash, as varints;
    then `calls`, the inlining context's callee ids relative to the function's own."""
    out = bytearray([FEATURES_VERSION])
    for v in (fp.size, fp.blocks, fp.edges, fp.loops, fp.instructions, *fp.classes):
        _varint(out, v)
    _varint(out, len(fp.constants))
    for c in fp.constants:
        _varint(out, c)
    for texts in (fp.strings, fp.imports):
        hashes = sorted({t[1:] if _is_hash(t) else text_hash(t) for t in texts})
        _varint(out, len(hashes))
        for h in hashes:
            _varint(out, int(h, 16))
    _varint(out, len(calls))
    for c in calls:
        _varint(out, c)
    return bytes(out)


_HEX = frozenset("0123456789abcdef")


def _is_hash(text: str) -> bool:
    """A hash as `decode_fingerprint` spells it (`#` and 8 hex digits); a binary's own string of 9
    characters starting with `#` (`#!/bin/sh`) is not one."""
    return len(text) == 9 and text[0] == "#" and _HEX.issuperset(text[1:])


def _varints(blob: bytes) -> list[int]:
    """Every zigzag varint of `blob` after its version byte (a features blob is nothing else)."""
    out = []
    v = shift = 0
    for byte in blob[1:]:
        v |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            continue
        out.append((v >> 1) if not v & 1 else -((v + 1) >> 1))
        v = shift = 0
    return out


def _parse(blob: bytes) -> tuple[list[int], list[tuple[int, ...]], tuple[int, ...]]:
    """A features blob's head (sizes, CFG shape, histogram), its three sets (constants, string and
    import hashes) and its relative callee ids (none in format 1)."""
    if not blob or blob[0] not in (1, FEATURES_VERSION):
        raise ValueError(f"unknown features format {blob[:1]!r}")
    values = _varints(blob)
    pos = 5 + len(CLASSES)
    sets: list[tuple[int, ...]] = []
    for _ in range(3 if blob[0] == 1 else 4):
        n = values[pos]
        sets.append(tuple(values[pos + 1 : pos + 1 + n]))
        pos += 1 + n
    calls = sets.pop() if len(sets) == 4 else ()
    return values[: 5 + len(CLASSES)], sets, calls


def decode_fingerprint(address: int, name: str | None, exact: bytes, minhash: bytes, features: bytes) -> Fingerprint:
    """The fingerprint a stored row holds (strings and imports as their `#`-prefixed hashes)."""
    return decode_stored(0, address, name, exact, minhash, features)[0]


def decode_stored(
    function_id: int, address: int, name: str | None, exact: bytes, minhash: bytes, features: bytes
) -> tuple[Fingerprint, tuple[int, ...]]:
    """The fingerprint a stored row holds, and the ids of its inlining context's callees
    (`function_id` is the row's own id)."""
    head, sets, calls = _parse(bytes(features))
    size, blocks, edges, loops, instructions = head[:5]
    return Fingerprint(
        address=address,
        size=size,
        name=name,
        exact=bytes(exact),
        blocks=blocks,
        edges=edges,
        loops=loops,
        instructions=instructions,
        classes=tuple(head[5:]),
        constants=sets[0],
        strings=tuple(f"#{h:08x}" for h in sets[1]),
        imports=tuple(f"#{h:08x}" for h in sets[2]),
        callees=(),
        minhash=unpack_minhash(minhash),
    ), tuple(function_id + c for c in calls)


def stored_form(fp: Fingerprint) -> Fingerprint:
    """`fp` as the store keeps it, so a query scores against stored functions as they do among
    themselves."""
    return decode_fingerprint(fp.address, fp.name, fp.exact, pack_minhash(fp.minhash), encode_features(fp))
