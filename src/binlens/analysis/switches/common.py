"""What the capstone jump-table resolvers (AArch64, ARM32, MIPS, PowerPC, RISC-V) share.

Each resolver decodes the jump's own chunk (its slice), checks that the jump reads a table, then
evaluates the recorded path to the jump (earlier chunks, most distant first, then the slice) with
its own symbolic state; a bound learnt on the table index gives the number of entries, which are
read from a mapped, read-only table and kept only where they land on code next to the jump. The
architecture-specific parts (instruction shapes, register names, the symbolic state) stay in the
resolvers; this module holds the decoding, the table read and the target filter.
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import capstone as cs

from binlens.analysis.codemap import CodeMap
from binlens.analysis.switches.tables import writable

if TYPE_CHECKING:
    from binlens.analysis.decode.capstone_backend import CapstoneBackend
    from binlens.loader.image import Image

T = TypeVar("T")

MAX_ENTRIES = 4096  # a bound above this is not a switch table
WINDOW = 1 << 20  # case targets lie within 1 MiB of the jump
Chunks = Sequence[tuple[int, int]]  # the chunks on the path to a jump, (start, end), the most recent first
Resolution = tuple[list[int], int, bool]  # case targets, the table's address (0: none), guarded by a bound?
NONE: Resolution = ([], 0, True)  # what a resolver returns for a jump it leaves unresolved
_SIZE_CODE = {1: "B", 2: "H", 4: "I", 8: "Q"}


class Stepper(Protocol):
    """A resolver's symbolic state: it evaluates one instruction at a time along a path."""

    def step(self, ins: cs.CsInsn, next_va: int) -> None:
        """Evaluate `ins`; `next_va` is the address executed after it on this path."""
        ...


class PerBackend(Generic[T]):
    """What a resolver works out once per analysis (one backend) and keeps between jumps: a MIPS
    `_gp`, the PowerPC function extents. Held here, keyed weakly by the backend, so it goes with
    the analysis and the backend carries no resolver's state."""

    def __init__(self, make: Callable[[CapstoneBackend], T]) -> None:
        self._make = make
        self._values: weakref.WeakKeyDictionary[CapstoneBackend, T] = weakref.WeakKeyDictionary()

    def get(self, backend: CapstoneBackend) -> T:
        """The value for `backend`, made on first use."""
        values = self._values
        if backend in values:
            return values[backend]
        value = values[backend] = self._make(backend)
        return value


def decode_path(md: cs.Cs, image: Image, segments: Sequence[tuple[int, int]]) -> Iterator[cs.CsInsn]:
    """The instructions of each `(start, end)` range in turn (an unmapped range yields nothing)."""
    for start, end in segments:
        data = image.read(start, end - start) if end > start else None
        if data is None:
            continue
        yield from md.disasm(data, start)


def jump_slice(
    backend: CapstoneBackend, slice_start: int, jump_va: int, thumb: bool = False, short_end: bool = False
) -> tuple[Image, cs.Cs, list[cs.CsInsn]]:
    """The backend's image, its disassembler (`thumb`: for Thumb code) and the jump's chunk decoded
    from `slice_start` up to and including the instruction at `jump_va`. The caller checks that the
    last instruction is the jump: when none starts at `jump_va` the chunk is decoded out of step.
    `short_end`: where `jump_va + 3` is unmapped, decode only to `jump_va + 2` (a 2-byte RISC-V
    `c.jr` may end the code)."""
    image = backend.image
    md = backend.md(thumb)
    end = jump_va + 2 if short_end and not image.is_mapped(jump_va + 3) else jump_va + 4
    own = [ins for ins in decode_path(md, image, [(slice_start, end)]) if ins.address <= jump_va]
    return image, md, own


def path_to_jump(md: cs.Cs, image: Image, earlier: Chunks, max_chunks: int, own: list[cs.CsInsn]) -> list[cs.CsInsn]:
    """The recorded path to the jump: up to `max_chunks` earlier chunks (`earlier` lists the most
    recent first), oldest first, then the jump's own slice."""
    return [*decode_path(md, image, list(reversed(earlier[:max_chunks]))), *own]


def walk(state: Stepper, insns: list[cs.CsInsn]) -> None:
    """Evaluate every instruction of the path but the jump: `state.step(ins, next address)`."""
    for k, ins in enumerate(insns[:-1]):
        state.step(ins, insns[k + 1].address)


def entry_count(bounds: Mapping[tuple, int], index: tuple) -> int | None:
    """The number of table entries a bound on `index` allows, or None (no bound, or not a table's)."""
    count = bounds.get(index)
    if count is None or count <= 0 or count > MAX_ENTRIES:
        return None
    return count


def read_entries(image: Image, table: int, size: int, count: int, signed: bool) -> list[int] | None:
    """The `count` entries of `size` bytes at `table` in the image's byte order, or None when the
    table is unmapped, writable (an array of function pointers, not a switch) or cut short."""
    if not image.is_mapped(table) or writable(image, table):
        return None
    raw = image.read(table, size * count)
    if raw is None or len(raw) < size * count:
        return None
    endian = "<" if image.identity.endian == "little" else ">"
    code = _SIZE_CODE[size].lower() if signed else _SIZE_CODE[size]
    return [v for (v,) in struct.iter_unpack(endian + code, raw)]


def near_code(codemap: CodeMap, target: int, jump_va: int, align: int) -> bool:
    """Can `target` be a case of the jump at `jump_va`: aligned, within `WINDOW`, in code?"""
    return not target % align and abs(target - jump_va) <= WINDOW and codemap.contains(target)
