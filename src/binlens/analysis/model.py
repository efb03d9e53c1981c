"""The engine's facts: instructions, basic blocks, functions, references, strings.

These are plain data (no I/O). One name for one thing: the api layer turns these same objects
into its result models.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

# Flow kinds of one instruction (the instruction model); "data" marks bytes a linear
# listing shows as `.byte` because they do not decode (binlens.api.instruction.decode_range).
FLOW_KINDS = ("fallthrough", "jump", "conditional", "call", "return", "indirect_jump", "indirect_call", "stop", "data")

# How a chunk of straight-line code ends (internal, compact).
T_FALL, T_JUMP, T_COND, T_CALL, T_RET, T_IJUMP, T_ICALL, T_STOP, T_BAD = range(9)
TERM_NAMES = (
    "fallthrough",
    "jump",
    "conditional",
    "call",
    "return",
    "indirect_jump",
    "indirect_call",
    "stop",
    "invalid",
)

# Kinds of references, and of CFG edges.
XREF_KINDS = ("call", "jump", "jump_table", "tail_call", "read", "write", "offset", "pointer", "string")
EDGE_KINDS = ("fallthrough", "jump", "conditional_taken", "conditional_fallthrough", "jump_table", "call_return")

# Sources of a function start (SPEC "Shapes").
SOURCES = (
    "entry",
    "symbol",
    "export",
    "eh_frame",
    "pdata",
    "function_starts",
    "thunk",
    "call",
    "tail_call",
    "jump_table",
    "pointer",
    "prologue",
    "user",
)


@dataclass(frozen=True, slots=True)
class Instruction:
    """One decoded instruction."""

    address: int
    size: int
    bytes: bytes
    mnemonic: str
    operands: str
    flow: str  # one of FLOW_KINDS
    targets: tuple[int, ...] = ()  # direct branch/call targets
    refs: tuple[int, ...] = ()  # memory references and immediates that may be addresses

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.operands}".strip()


# BasicBlock, Edge and Xref are values the engine makes by the hundred thousand (libc: 70k, 103k
# and 80k) and nothing changes after: not `frozen`, whose __init__ sets each field through
# object.__setattr__ (0.61-0.75 us an object here, against 0.17-0.18 us), but hashed and compared
# by value all the same (`unsafe_hash`). Treat them as read-only.
@dataclass(slots=True, unsafe_hash=True)
class BasicBlock:
    """A maximal run of instructions entered only at its start; calls that return do not end it."""

    start: int
    end: int  # exclusive
    instruction_count: int
    terminator: str  # a TERM_NAMES entry

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(slots=True, unsafe_hash=True)
class Edge:
    """A control-flow edge between two blocks of one function."""

    src: int
    dst: int
    kind: str  # one of EDGE_KINDS


@dataclass(slots=True, unsafe_hash=True)
class Xref:
    """A reference from an instruction or data address to an address."""

    src: int
    dst: int
    kind: str  # one of XREF_KINDS


@dataclass(slots=True)
class Refs:
    """References packed: three parallel arrays in the order of (src, dst, kind name) tuples, each kind
    as its index in `XREF_KINDS`. An `Xref` object costs ~120 bytes with its ints (gcc's cc1 has
    1.76M references: 177 MiB as objects, 30 MiB packed); the analysis process stores these as they
    are (`store.analysis_save.reference_rows`)."""

    src: array  # u64 ('Q')
    dst: array  # u64 ('Q')
    kind: bytearray

    def __len__(self) -> int:
        return len(self.kind)

    def xrefs(self) -> list[Xref]:
        """The same references as `Xref` objects, in order."""
        names = XREF_KINDS
        return [Xref(s, d, names[k]) for s, d, k in zip(self.src, self.dst, self.kind, strict=True)]


@dataclass(slots=True)
class Body:
    """What one function's entry reaches (discovery's view): chunk starts, edges, calls, tail calls."""

    chunks: list[int] = field(default_factory=list)
    # flat (src chunk, dst chunk, kind) triples: three list slots per edge, no tuple each; None while
    # discovery walks without them (`Explorer.record_edges`: `Explorer.body_edges` walks them again)
    edges: list[int | str] | None = field(default_factory=list)
    # flat (call site, callee) pairs: a list while the walk fills it, then `pack_calls`'s array
    calls: array | list[int] = field(default_factory=list)
    tails: list[tuple[int, int]] = field(default_factory=list)
    cond_tails: list[int] = field(default_factory=list)  # function starts reached by a conditional jump
    has_ret: bool = False
    open_end: bool = False  # an unresolved indirect jump or undecodable code: assume it returns
    # `noreturn.returning_functions`' view of a function that calls itself, once per body: None
    # before it is looked at, () when it does not call itself, else (a way out reached, the tail
    # calls reached) without the edges back from those calls
    self_exits: tuple | None = None


def pack_calls(flat: array | list[int]) -> array | list[int]:
    """A body's flat (site, callee) pairs as unsigned 64-bit words: 16 bytes a call, against a list
    slot, a 2-tuple and the site's int (~100 bytes; gcc's cc1 has 357k calls). The list itself where
    a value does not fit a word."""
    if isinstance(flat, array):
        return flat
    try:
        return array("Q", flat)
    except (OverflowError, TypeError):
        return flat


def pairs(flat: array | list[int]) -> Iterator[tuple[int, int]]:
    """(site, callee) of each call of `Body.calls` or `Function.calls`."""
    it = iter(flat)
    return zip(it, it, strict=True)


def edge_triples(flat: list[int | str]) -> Iterator[tuple[int, int, str]]:
    """(src chunk, dst chunk, kind) of each edge of `Body.edges`."""
    it = iter(flat)
    return cast("Iterator[tuple[int, int, str]]", zip(it, it, it, strict=True))  # (the triples' types)


def function_display_name(address: int, symbol: str | None = None, thunk: str | None = None) -> str:
    """The name a function goes by when no one has named it: its symbol, else the import its thunk
    jumps to, else `sub_<hex>` (the form `binlens.jobs.state` resolves back to an address)."""
    return symbol or thunk or f"sub_{address:x}"


@dataclass(frozen=True, slots=True)
class FoundString:
    """A string found in the image's data."""

    address: int
    size: int  # bytes, without the terminator
    encoding: str  # "ascii" | "utf-8" | "utf-16le"
    text: str
    section: str | None


@dataclass
class Function:
    """A function: its entry, extent, blocks, edges and what it calls."""

    address: int
    size: int
    sources: tuple[str, ...]
    blocks: list[BasicBlock] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    symbol_name: str | None = None  # a symbol or export exactly at the entry
    thunk_name: str | None = None  # the import a PLT/IAT/stub thunk jumps to
    noreturn: bool = False
    # (call site, callee address) pairs, sorted, flat and packed as `Body.calls` (see `call_pairs`)
    calls: array | list[int] = field(default_factory=list)
    mode: str | None = None  # "thumb" for ARM Thumb code; None otherwise

    @property
    def end(self) -> int:
        return self.address + self.size

    def display_name(self) -> str:
        """The engine's own name for the function (`function_display_name`)."""
        return function_display_name(self.address, self.symbol_name, self.thunk_name)

    def call_pairs(self) -> list[tuple[int, int]]:
        """(call site, callee address) of each call, in order."""
        return list(pairs(self.calls))


@dataclass
class ProgramAnalysis:
    """Everything the engine found in one image."""

    engine_version: str
    arch: str
    functions: list[Function]  # sorted by address
    xrefs: list[Xref]  # sorted by (src, dst)
    strings: list[FoundString]  # sorted by address
    code_bytes: int = 0
    covered_bytes: int = 0
    stats: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # what of the image was not analysed, and why
    _starts: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._starts = [f.address for f in self.functions]

    def function_at(self, va: int) -> Function | None:
        """The function whose entry is `va`, else the one whose blocks contain `va`."""
        i = bisect.bisect_right(self._starts, va) - 1
        if i >= 0 and self.functions[i].address == va:
            return self.functions[i]
        for j in range(i, max(-1, i - 64), -1):
            f = self.functions[j]
            if any(b.start <= va < b.end for b in f.blocks):
                return f
        for f in self.functions:  # a far chunk (cold part) of an earlier function
            if any(b.start <= va < b.end for b in f.blocks):
                return f
        return None

    @property
    def coverage(self) -> float:
        return self.covered_bytes / self.code_bytes if self.code_bytes else 0.0
