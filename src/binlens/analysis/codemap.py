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

from binlens.analysis.native import native
from binlens.loader.image import Image

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
    """All executable regions of an image, found by VA with bisect."""

    def __init__(self, image: Image) -> None:
        self.regions: list[CodeRegion] = []
        secs = [s for s in image.sections if s.kind == "code" and s.size > 0 and s.fsize > 0 and s.va > 0]
        if image.identity.format == "MachO":
            from binlens.analysis.strings import MACHO_CODE

            secs = [s for s in secs if s.name.rsplit(",", 1)[-1] in MACHO_CODE or "stub" in s.name]
        if not secs:
            for seg in image.segments:
                if "x" in seg.perms and seg.fsize > 0:
                    data = image.data[seg.offset : seg.offset + min(seg.fsize, seg.vsize)]
                    self.regions.append(CodeRegion(seg.name, seg.va, bytes(data)))
        else:
            for s in sorted(secs, key=lambda s: s.va):
                data = image.data[s.offset : s.offset + min(s.fsize, s.size)]
                if self.regions and s.va < self.regions[-1].end:
                    continue  # overlapping section headers: keep the first
                self.regions.append(CodeRegion(s.name, s.va, bytes(data)))
        # (an i386 switch table lies inside its function, after the code: the code around it stays
        # one region, so that a gap trial sees the whole function; no start is taken in it: `_Refused`)
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
        return _AddrBits([(r.va, len(r.data)) for r in self.regions])  # type: ignore[no-any-return]

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
