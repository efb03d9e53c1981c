"""`.eh_frame` parsed from the bytes: FDE ranges, and whether each starts in the entry state.

An FDE whose CFI changes the CFA or saves a register before its first location advance does
not describe a function entry (gcc's `.cold` parts, for example): it is a fragment of a
function, not a function start.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from binlens.loader.image import Image

# CFA opcodes that are neutral at an entry (operands: number of ULEBs to skip).
_NEUTRAL = {0x00: 0, 0x07: 1, 0x08: 1, 0x2E: 1, 0x2D: 0}
_ADVANCE = {0x02, 0x03, 0x04}


@dataclass(frozen=True, slots=True)
class FDE:
    """One frame description: [start, start+size), and whether its CFI starts in the entry state."""

    start: int
    size: int
    entry: bool


def _uleb(b: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while i < len(b):
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            break
    return v, i


def _sleb(b: bytes, i: int) -> tuple[int, int]:
    v, j = _uleb(b, i)
    if j > i and b[j - 1] & 0x40:  # sign bit of the last byte read
        v -= 1 << (7 * (j - i))
    return v, j


class _Reader:
    def __init__(self, data: bytes, va: int, ptr: int, endian: str) -> None:
        self.d, self.va, self.ptr = data, va, ptr
        self.e = "<" if endian == "little" else ">"

    def u(self, fmt: str, i: int) -> tuple[int, int]:
        size = struct.calcsize(fmt)
        return struct.unpack_from(self.e + fmt, self.d, i)[0], i + size

    def encoded(self, enc: int, i: int) -> tuple[int, int]:
        if enc == 0xFF:
            return 0, i
        start = i
        fmt = enc & 0x0F
        if fmt == 0x00:
            v, i = self.u("Q" if self.ptr == 8 else "I", i)
        elif fmt == 0x01:
            v, i = _uleb(self.d, i)
        elif fmt == 0x09:
            v, i = _sleb(self.d, i)
        else:
            code = {0x02: "H", 0x03: "I", 0x04: "Q", 0x0A: "h", 0x0B: "i", 0x0C: "q"}.get(fmt)
            if code is None:
                raise ValueError("bad pointer encoding")
            v, i = self.u(code, i)
        app = enc & 0x70
        if app == 0x10:
            v += self.va + start
        return v & ((1 << (self.ptr * 8)) - 1), i


def _entry_state(cfi: bytes) -> bool:
    i = 0
    while i < len(cfi):
        op = cfi[i]
        hi = op & 0xC0
        if hi == 0x40 or op in _ADVANCE:
            return True
        if hi:  # DW_CFA_offset / restore with a register: a change before any advance
            return False
        if op not in _NEUTRAL:
            return False
        i += 1
        for _ in range(_NEUTRAL[op]):
            _v, i = _uleb(cfi, i)
    return True


def parse_eh_frame(image: Image) -> list[FDE]:
    """All FDEs of the image's `.eh_frame` (empty when it has none or it is malformed)."""
    sec = next((s for s in image.sections if s.name == ".eh_frame" and s.size and s.fsize), None)
    if sec is None:
        return []
    data = bytes(image.data[sec.offset : sec.offset + sec.fsize])
    ptr = 8 if image.identity.bits == 64 else 4
    rd = _Reader(data, sec.va, ptr, image.identity.endian)
    cies: dict[int, tuple[int, bool]] = {}
    out: list[FDE] = []
    pos = 0
    try:
        while pos + 4 <= len(data):
            length, i = rd.u("I", pos)
            if length == 0:
                break
            if length == 0xFFFFFFFF:
                length, i = rd.u("Q", i)
            start = i
            nxt = start + length
            if nxt > len(data):
                break
            cid, i = rd.u("I", i)
            if cid == 0:
                cies[pos] = _parse_cie(rd, i)
            else:
                cie = cies.get(start - cid)
                if cie is not None:
                    enc, has_z = cie
                    begin, i = rd.encoded(enc, i)
                    size, i = rd.encoded(enc & 0x0F, i)
                    if has_z:
                        alen, i = _uleb(data, i)
                        i += alen
                    if begin:
                        out.append(FDE(begin, size, _entry_state(data[i:nxt])))
            pos = nxt
    except (struct.error, ValueError, IndexError):
        pass
    return out


def _parse_cie(rd: _Reader, i: int) -> tuple[int, bool]:
    d = rd.d
    version = d[i]
    i += 1
    end = d.index(b"\0", i)
    aug = d[i:end].decode("latin-1")
    i = end + 1
    if "eh" in aug:
        i += rd.ptr
    _ca, i = _uleb(d, i)
    _da, i = _sleb(d, i)
    if version == 1:
        i += 1
    else:
        _ra, i = _uleb(d, i)
    enc = 0x00
    if aug.startswith("z"):
        _alen, i = _uleb(d, i)
        for ch in aug[1:]:
            if ch == "R":
                enc = d[i]
                i += 1
            elif ch == "P":
                penc = d[i]
                i += 1
                _p, i = rd.encoded(penc & 0x7F, i)
            elif ch == "L":
                i += 1
    return enc, aug.startswith("z")
