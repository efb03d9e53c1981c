"""Symbol demangling: Itanium C++ (and legacy Rust) through libstdc++'s demangler."""

from __future__ import annotations

from functools import lru_cache

try:
    import cxxfilt

    _DEMANGLER = cxxfilt.Demangler()
except Exception:  # noqa: BLE001 - no libstdc++/libc++ found: names stay raw
    _DEMANGLER = None


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """Demangled `name`, or `name` itself when it is not mangled or cannot be demangled."""
    if _DEMANGLER is None or not name.startswith(("_Z", "__Z")):
        return name
    raw = name[1:] if name.startswith("__Z") else name
    try:
        out = _DEMANGLER.demangle(raw)
    except Exception:  # noqa: BLE001 - invalid mangling
        return name
    if raw.startswith("_ZN") and out.endswith("E") is False and "::h" in out:
        # legacy Rust: drop the trailing ::h<16 hex> hash
        head, _, tail = out.rpartition("::h")
        if len(tail) == 16 and all(c in "0123456789abcdef" for c in tail):
            out = head
    return out
