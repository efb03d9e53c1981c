"""Decode bytes through a C type into a JSON value."""

from __future__ import annotations

import struct
from typing import Any, Literal

from binlens.cdecl.ctype import CType

MAX_ELEMENTS = 4096
ByteOrder = Literal["little", "big"]


def decode(t: CType, data: bytes, endian: str) -> Any:
    """The value of `data` seen as `t`: numbers, hex pointers, strings for char arrays, dicts, lists."""
    t = t.strip()
    order: ByteOrder = "little" if endian == "little" else "big"
    if t.kind == "scalar":
        return _scalar(t, data, order)
    if t.kind == "enum":
        value = int.from_bytes(data[: t.size or 4], order, signed=True)
        names = [n for n, v in t.enumerators if v == value]
        return names[0] if names else value
    if t.kind == "pointer":
        return hex(int.from_bytes(data[: t.size or 8], order))
    if t.kind == "array":
        elem = t.target.strip() if t.target is not None else None
        if elem is None or elem.size is None:
            return None
        count = t.count if t.count is not None else len(data) // max(elem.size, 1)
        if elem.kind == "scalar" and elem.name in ("char", "signed char", "unsigned char"):
            raw = data[:count]
            return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")
        if elem.size == 0:
            return []
        return [
            decode(elem, data[i * elem.size : (i + 1) * elem.size], endian) for i in range(min(count, MAX_ELEMENTS))
        ]
    if t.kind in ("struct", "union"):
        out: dict[str, Any] = {}
        for i, f in enumerate(t.fields or []):
            key = f.name if f.name is not None else f"<anonymous {i}>"
            size = f.type.size or 0
            chunk = data[f.offset : f.offset + size]
            if f.bit_size is not None and f.bit_offset is not None:  # a bit-field (layout sets both)
                bits = int.from_bytes(chunk, order)
                shift = f.bit_offset if order == "little" else size * 8 - f.bit_offset - f.bit_size
                value = (bits >> shift) & ((1 << f.bit_size) - 1)
                if f.type.strip().signed and value >> (f.bit_size - 1):
                    value -= 1 << f.bit_size
                out[key] = value
            else:
                out[key] = decode(f.type, chunk, endian)
        return out
    return None


def _scalar(t: CType, data: bytes, order: ByteOrder) -> Any:
    size = t.size or 0
    raw = data[:size]
    if t.name == "_Bool":
        return raw != bytes(size)
    if t.floating:
        fmt = ("<" if order == "little" else ">") + {4: "f", 8: "d"}.get(size, "")
        if len(fmt) == 2:
            value = struct.unpack(fmt, raw)[0]
            return value if value == value and abs(value) != float("inf") else str(value)
        if size in (10, 12, 16) and order == "little":
            return _x87(raw[:10])
        return raw.hex()
    return int.from_bytes(raw, order, signed=t.signed)


def _x87(raw: bytes) -> Any:
    mant = int.from_bytes(raw[:8], "little")
    se = int.from_bytes(raw[8:10], "little")
    sign, exp = se >> 15, se & 0x7FFF
    if exp == 0x7FFF:
        return "nan" if mant << 1 & ((1 << 64) - 1) else ("-inf" if sign else "inf")
    if exp == 0 and mant == 0:
        return -0.0 if sign else 0.0
    try:
        value = mant / (1 << 63) * 2.0 ** (exp - 16383)
    except OverflowError:
        return "-inf" if sign else "inf"
    return -value if sign else value
