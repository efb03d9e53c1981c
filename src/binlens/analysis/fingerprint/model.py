"""What a fingerprint is made from (`FunctionFacts`, `InsnFeature`) and what it is (`Fingerprint`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# Instruction classes counted by the histogram (`Fingerprint.classes`), one index each.
CLASSES = (
    "call",
    "return",
    "jump",
    "conditional",
    "move",
    "arith",
    "logic",
    "shift",
    "compare",
    "stack",
    "vector",
    "string",
    "setcc",
    "other",
)
CLASS_INDEX = {name: i for i, name in enumerate(CLASSES)}
MINHASH_BINS = 32  # one-permutation MinHash: 32 bins of 32-bit minima
EMPTY_BIN = 0xFFFFFFFF


# One instruction as fingerprints see it: (its bytes with every address masked, a hash of its
# mnemonic (CRC-32 of the spelling, the same for every ISA), its class (a `CLASSES` index), the
# immediates that are not addresses). A tuple: libc has 316k instructions.
InsnFeature = tuple[bytes, int, int, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class FunctionFacts:
    """What the analysis knows of one function, as fingerprinting reads it."""

    address: int
    size: int
    name: str | None  # its symbol or export, else `<import>@plt` for a thunk; None for `sub_<hex>`
    blocks: Sequence[tuple[int, int]]  # (start, end) by address
    edges: Sequence[tuple[int, int]]  # (src block, dst block)
    callees: Sequence[int]  # called function entries, by call site
    imports: Sequence[str]  # imports it calls or reads
    strings: Sequence[str]  # the strings it references


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """One function's exact fingerprint and fuzzy features."""

    address: int
    size: int
    name: str | None
    exact: bytes  # 16-byte BLAKE2b of the masked instruction bytes in block order
    blocks: int
    edges: int
    loops: int  # edges back to an address at or before their source
    instructions: int
    classes: tuple[int, ...]  # count per `CLASSES` entry
    constants: tuple[int, ...]  # sorted distinct immediates that are not addresses (at most 64)
    strings: tuple[str, ...]  # sorted distinct referenced strings (at most 32)
    imports: tuple[str, ...]  # sorted distinct imports called or read
    callees: tuple[int, ...]  # distinct callees in call-site order
    minhash: tuple[int, ...] = field(default=())  # `MINHASH_BINS` minima, `EMPTY_BIN` where none
