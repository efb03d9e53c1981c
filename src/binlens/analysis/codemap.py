"""Where code may be, and which bytes the engine has decoded: one byte of state per code byte.

State values: 0 unexplored, 1 instruction start, 2 instruction body, 3 chunk (block) start.
Keeping this as a `bytearray` per region lets splits and gap searches run in C (`rfind`,
`find`, `count`) instead of Python loops.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from binlens.analysis.native.kernels import native
from binlens.loader.image import ADDRESS_END, Image

UNEXPLORED, INSN, BODY, CHUNK = 0, 1, 2, 3
_descent = native("_descent")
_AddrBits = _descent.AddrBits if _descent is not None else None


@dataclass
class CodeRegion:
    """A contiguous run of executable bytes with its decode-state map."""

    name: str
    va: int
    data: bytes
    state: bytearray = field(repr=False, default_factory=bytearray)

    end: int = 0

    def __post_init__(self) -> None:
        if not self.state:
            self.state = bytearray(len(self.data))
        self.end = self.va + len(self.data)


class CodeMap:
    """All executable regions of an image, found by VA with bisect.

    The regions are ascending, not overlapping, not empty and end at `ADDRESS_END` at most, whatever the
    file's section or segment table says (`code_ranges`); `warnings` says what of that table was
    cut or left out to make them so.
    """

    def __init__(self, image: Image) -> None:
        self.warnings: list[str] = []
        self.regions: list[CodeRegion] = [
            CodeRegion(name, va, data) for name, va, data in code_ranges(image, self.warnings)
        ]
        # (an i386 switch table lies inside its function, after the code: the code around it stays
        # one region, so that a gap trial sees the whole function; no start is taken in it: `refused.RefusedStarts`)
        cut = [r for r in image.data_ranges if r[2] != "table"]
        if cut:
            self.regions = _without_data(self.regions, cut)
        self._starts = [r.va for r in self.regions]
        self._last: CodeRegion | None = None
        # `xrefs.pointers_in_data(image, self, set())`, once: the words in data that hold a code
        # address depend only on the image and these regions (several passes ask for them)
        self.data_pointers: array | None = None  # flat (data address, code address) words

    def region(self, va: int) -> CodeRegion | None:
        """The region containing `va`, or None (the last hit is tried first: lookups cluster)."""
        r = self._last
        if r is not None and r.va <= va < r.end:
            return r
        i = bisect.bisect_right(self._starts, va) - 1
        if i >= 0:
            r = self.regions[i]
            if va < r.end:
                self._last = r
                return r
        return None

    def contains(self, va: int) -> bool:
        return self.region(va) is not None

    def address_set(self) -> set[int]:
        """An empty set of addresses for the walks: a bit per code byte (`_descent.AddrBits`) where
        the C extension is built, else a set (a set of gcc's cc1's 1.33M chunk starts is 64 MiB)."""
        if _AddrBits is None:
            return set()
        return _AddrBits([(r.va, len(r.data)) for r in self.regions])

    @property
    def total_bytes(self) -> int:
        return sum(len(r.data) for r in self.regions)


def _without_data(regions: list[CodeRegion], ranges: list[tuple[int, int, str]]) -> list[CodeRegion]:
    """`regions` cut around the data ranges (sorted, disjoint): no code is decoded in data, no
    function starts there, and decoding that runs up to data stops where the data begins."""
    out = []
    starts = [lo for lo, _hi, _k in ranges]
    for r in regions:
        va = r.va
        i = max(0, bisect.bisect_right(starts, va) - 1)
        while va < r.end:
            while i < len(ranges) and ranges[i][1] <= va:
                i += 1
            if i < len(ranges) and ranges[i][0] <= va:
                va = ranges[i][1]  # inside data: skip it
                continue
            stop = min(r.end, ranges[i][0]) if i < len(ranges) else r.end
            out.append(CodeRegion(r.name, va, r.data[va - r.va : stop - r.va]))
            va = stop
    return out


MAX_WARNINGS = 20  # a file with thousands of odd sections says so in this many lines, and a count


def code_ranges(image: Image, warnings: list[str]) -> list[tuple[str, int, bytes]]:
    """(name, address, bytes) of each run of code to analyse, ascending and not overlapping: the code
    sections (the executable segments where there are none) as far as the file holds their bytes
    and the address space has room for them. A section whose bytes lie past the end of the file is
    left out; one that runs past `ADDRESS_END` is cut there; one that overlaps an earlier one (by address)
    keeps only its part past that one's end (nothing when it lies inside it). What was cut or left
    out is added to `warnings`, a line each (at most `MAX_WARNINGS`, then a count)."""
    secs = [s for s in image.sections if s.kind == "code" and s.size > 0 and s.fsize > 0 and s.va > 0]
    if image.identity.format == "MachO":
        from binlens.analysis.refs.strings import MACHO_CODE

        secs = [s for s in secs if s.name.rsplit(",", 1)[-1] in MACHO_CODE or "stub" in s.name]
    if secs:
        what = "section"
        cands = [(s.name, s.va, s.offset, min(s.fsize, s.size)) for s in secs]
    else:
        what = "segment"
        cands = [(g.name, g.va, g.offset, min(g.fsize, g.vsize)) for g in image.segments if "x" in g.perms]
        cands = [c for c in cands if c[3] > 0]
    said: list[str] = []
    out: list[tuple[str, int, bytes]] = []
    end = 0  # where the last range kept ends
    last = ""
    for name, va, offset, size in sorted(cands, key=lambda c: (c[1], -c[3])):
        label = f"code {what} {warning_name(name)} at {va:#x}"
        data = image.data[offset : offset + size]
        if not data:
            said.append(f"{label}: its bytes (file offset {offset:#x}) lie past the end of the file; not analysed")
            continue
        notes = []
        if len(data) < size:
            notes.append(f"the file holds {len(data):#x} of its {size:#x} bytes; the rest is not analysed")
        if va + len(data) > ADDRESS_END:
            data = data[: max(0, ADDRESS_END - va)]
            if not data:
                said.append(f"{label}: lies at the end of the address space; not analysed")
                continue
            notes.append(f"runs past the end of the address space; cut at {ADDRESS_END:#x}")
        if va < end:
            if va + len(data) <= end:
                said.append(f"{label}: lies inside code {what} {warning_name(last)}; analysed once, as that one")
                continue
            notes.append(f"overlaps code {what} {warning_name(last)}; analysed from {end:#x} on")
            data = data[end - va :]
            va = end
        said += [f"{label}: {note}" for note in notes]
        out.append((name, va, bytes(data)))
        end, last = va + len(data), name
    if len(said) > MAX_WARNINGS:
        said[MAX_WARNINGS:] = [f"and {len(said) - MAX_WARNINGS} more warnings about code {what}s"]
    warnings += said
    return out


def warning_name(name: object) -> str:
    """A section name for a warning: text, without control characters, at most 64 characters."""
    text = name.decode("latin-1") if isinstance(name, bytes | bytearray) else str(name)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return repr(text[:64] + ("..." if len(text) > 64 else ""))


def instruction_start(codemap: CodeMap, va: int) -> bool:
    """Does an instruction decoded so far begin at `va`?"""
    r = codemap.region(va)
    return r is not None and r.state[va - r.va] in (1, 3)


def zero_runs(m: bytearray, pos: int = 0, stop: int | None = None) -> Iterator[tuple[int, int]]:
    """(start, end) of each maximal run of two or more zero bytes in a map of 0s and 1s (C-speed
    finds), within [pos, stop) when given (a run is cut at `stop`)."""
    find = m.find
    stop = len(m) if stop is None else stop
    while True:
        start = find(b"\x00\x00", pos, stop)
        if start < 0:
            return
        end = find(b"\x01", start, stop)
        if end < 0:
            end = stop
        yield start, end
        pos = end
