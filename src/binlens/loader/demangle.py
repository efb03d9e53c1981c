"""Symbol demangling, raw name always kept by the caller.

Itanium C++ (and legacy Rust, which uses Itanium mangling) goes through libstdc++'s own
`__cxa_demangle` via cxxfilt, the reference implementation. Rust v0 (`_R`), Swift (`$s`, `_$s`,
`$S`) and MSVC (`?`) names go through the pure-Python `demangle` package.
"""

from __future__ import annotations

from functools import lru_cache

try:
    import cxxfilt

    _ITANIUM = cxxfilt.Demangler()
except Exception:  # noqa: BLE001 - no libstdc++ found: fall back to the pure-Python demangler
    _ITANIUM = None

try:
    import demangle as _multi
except Exception:  # noqa: BLE001
    _multi = None

_OTHER_PREFIXES = ("_R", "$s", "_$s", "$S", "_$S", "_T0", "?")


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """Demangled `name`, or `name` itself when it is not mangled or cannot be demangled."""
    if name.startswith(("_Z", "__Z")):
        raw = name[1:] if name.startswith("__Z") else name
        out = _itanium(raw)
        if out is not None:
            return _drop_rust_hash(out)
    if name.startswith(_OTHER_PREFIXES) and _multi is not None:
        try:
            out = _multi.demangle(name)
        except Exception:  # noqa: BLE001 - not a valid mangling
            return name
        if isinstance(out, str) and out:
            return out
    return name


def _itanium(raw: str) -> str | None:
    if _ITANIUM is not None:
        try:
            return _ITANIUM.demangle(raw)
        except Exception:  # noqa: BLE001 - invalid mangling
            return None
    if _multi is not None:
        try:
            return _multi.demangle(raw)
        except Exception:  # noqa: BLE001
            return None
    return None


def _drop_rust_hash(text: str) -> str:
    """Legacy Rust symbols end in `::h<16 hex>`; readers want the path without it."""
    head, sep, tail = text.rpartition("::h")
    if sep and len(tail) == 16 and all(c in "0123456789abcdef" for c in tail):
        return head
    return text
