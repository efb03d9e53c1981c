"""Function starts with their sources, as the engine gathers them before and between its passes."""

from __future__ import annotations

from binlens.analysis.arch.profiles import profile
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode.backend import Backend, is_capstone
from binlens.analysis.metadata.thunks import find_thunks
from binlens.loader.image import Image, Section, Symbol


class Seeds:
    """Function starts with their sources, normalised (Thumb bit) and limited to code."""

    def __init__(self, image: Image, codemap: CodeMap, backend: Backend) -> None:
        self.codemap = codemap
        # ARM32: bit 0 of a code address names Thumb state; the backend's set of Thumb starts
        self.thumb: set[int] | None = None
        if profile(image.identity.arch).thumb_bit and is_capstone(backend):
            self.thumb = backend.thumb
        self.arm = self.thumb is not None
        self.starts: dict[int, frozenset[str]] = {}
        if self.thumb is not None:  # Thumb code marked elsewhere than in bit 0 (Mach-O N_ARM_THUMB_DEF symbols)
            self.thumb.update(va & ~1 for va in image.function_hints.get("thumb", []))

    def add(self, va: int, source: str) -> int | None:
        """Note `source` for the start at `va` (ARM: bit 0 names Thumb code); its address, or None
        when `va` is not in code."""
        if self.thumb is not None and va & 1:
            va &= ~1
            self.thumb.add(va)
        if not self.codemap.contains(va):
            return None
        self.starts[va] = with_source(self.starts.get(va), source)
        return va


_SOURCE_SETS: dict[frozenset[str], frozenset[str]] = {}


def with_source(sources: frozenset[str] | None, source: str) -> frozenset[str]:
    """`sources` and `source`, as the one frozenset every start with those sources shares (gcc's
    cc1: a set for each of 40k starts, held twice, would be 19 MiB)."""
    new = sources | {source} if sources else frozenset((source,))
    return _SOURCE_SETS.setdefault(new, new)


def file_seeds(image: Image, seeds: Seeds) -> dict[int, str]:
    """Add the starts the file names (entry, function symbols, exports, pdata, LC_FUNCTION_STARTS,
    init/fini arrays and constructors, .init/.fini, import thunks) to `seeds`; the thunks' names."""
    s: Symbol | Section  # (the loops below walk symbols, then sections)
    ident = image.identity
    if ident.entry:
        seeds.add(ident.entry, "entry")
    for s in image.symbols:
        if s.kind == "function" or (s.kind == "other" and ident.format != "ELF"):
            seeds.add(s.address, "symbol")
    for e in image.exports:
        seeds.add(e.address, "export")
    for key, source in (("pdata", "pdata"), ("function_starts", "function_starts")):
        for va in image.function_hints.get(key, []):
            seeds.add(va, source)
    for key in ("init_array", "fini_array", "ctor", "dtor", "opd"):  # (opd: PowerPC64 ELFv1 descriptors)
        for va in image.function_hints.get(key, []):
            seeds.add(va, "pointer")
    if ident.format == "ELF":
        for s in image.sections:
            if s.name in (".init", ".fini") and s.size:
                seeds.add(s.va, "entry")
    thunks: dict[int, str] = {}
    for va, name in find_thunks(image, seeds.codemap).items():
        got = seeds.add(va, "thunk")
        if got is not None:
            thunks[got] = name
    return thunks
