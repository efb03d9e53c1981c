"""What the engine asks of a decoder: the `Backend` Protocol, and `make_backend` choosing one.

A backend decodes straight-line chunks for the explorer and, as it decodes, records the
references the instructions make (`x_src`, `x_dst`, `x_kind`: parallel columns the reference pass
drains). `X86Backend` (iced-x86 and the C scanner) and `CapstoneBackend` (every other ISA) are
the two; the per-ISA passes that need more of a backend than this (capstone's decoders, the
Thumb state) name the concrete class.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Protocol, TypeGuard

from binlens.analysis.arch.profiles import profile
from binlens.errors import BinlensError

if TYPE_CHECKING:
    from binlens.analysis.codemap import CodeMap
    from binlens.analysis.decode.capstone_backend import CapstoneBackend
    from binlens.analysis.decode.x86 import X86Backend
    from binlens.analysis.model import Instruction
    from binlens.loader.image import Image

# (end, terminator, targets, address of the last instruction) of one decoded chunk
Chunk = tuple[int, int, tuple[int, ...], int]


class Backend(Protocol):
    """A decoder of one image's code."""

    image: Image
    codemap: CodeMap
    ptr_size: int
    x_src: array  # reference sources (u64), filled as chunks are decoded
    x_dst: array  # reference targets (u64)
    x_kind: bytearray  # reference kinds (`model.XREF_KINDS` codes)

    def decode_chunk(self, va: int) -> Chunk | None:
        """Decode straight-line code from `va` up to and including its first branch; None when
        `va` does not begin an instruction in code."""
        ...

    def instructions(self, start: int, end: int) -> list[Instruction]:
        """The instructions decoded from `start` up to `end`, as the API shows them."""
        ...


def is_capstone(backend: Backend) -> TypeGuard[CapstoneBackend]:
    """Is `backend` the capstone one (every ISA but x86)? The ARM32 passes ask it for the Thumb
    state, and the jump-table resolvers for its decoders."""
    return not profile(backend.image.identity.arch).x86


def is_x86(backend: Backend) -> TypeGuard[X86Backend]:
    """Is `backend` the x86 one (iced-x86 and the C scanner)? Passes that read x86 instructions
    themselves (the jump-table resolver, the gap heuristics) ask it."""
    return profile(backend.image.identity.arch).x86


def make_backend(image: Image, codemap: CodeMap) -> Backend:
    """The decoder for the image's architecture, or `unsupported`."""
    arch = image.identity.arch
    if profile(arch).x86:
        from binlens.analysis.decode.x86 import X86Backend

        return X86Backend(image, codemap)
    from binlens.analysis.decode import capstone_backend

    if capstone_backend.supported(image):
        return capstone_backend.CapstoneBackend(image, codemap)
    raise BinlensError("unsupported", f"no disassembler for architecture {arch!r}", target="/params/program")
