"""Symbol demangling, raw name always kept by the caller.

Itanium C++ (and legacy Rust, which uses Itanium mangling) goes through libstdc++'s own
`__cxa_demangle` via cxxfilt, the reference implementation. Rust v0 (`_R`), Swift (`$s`, `_$s`,
`$S`) and MSVC (`?`) names go through the pure-Python `demangle` package.
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

# Both demanglers are loaded on the first name that needs one: most C programs have none, and
# loading them costs every process that reads a binary ~45 ms (cxxfilt looks for libc and
# libstdc++ with `ldconfig -p`, twice).


@cache
def _itanium_demangler() -> Any:
    try:
        import cxxfilt

        return cxxfilt.Demangler()
    except Exception:  # noqa: BLE001 - no libstdc++ found: fall back to the pure-Python demangler
        return None


@cache
def _multi_demangler() -> Any:
    try:
        import demangle

        return demangle
    except Exception:  # noqa: BLE001
        return None


_OTHER_PREFIXES = ("_R", "$s", "_$s", "$S", "_$S", "_T0", "?")


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """Demangled `name`, or `name` itself when it is not mangled or cannot be demangled."""
    if name.startswith(("_Z", "__Z")):
        raw = name[1:] if name.startswith("__Z") else name
        out = _itanium(raw)
        if out is not None:
            return _drop_rust_hash(out)
    if name.startswith(_OTHER_PREFIXES) and (multi := _multi_demangler()) is not None:
        try:
            out = multi.demangle(name)
        except Exception:  # noqa: BLE001 - not a valid mangling
            return name
        if isinstance(out, str) and out:
            return out
    return name


def _itanium(raw: str) -> str | None:
    itanium = _itanium_demangler()
    if itanium is not None:
        try:
            return itanium.demangle(raw)
        except Exception:  # noqa: BLE001 - invalid mangling
            return None
    multi = _multi_demangler()
    if multi is not None:
        try:
            return multi.demangle(raw)
        except Exception:  # noqa: BLE001
            return None
    return None


def _drop_rust_hash(text: str) -> str:
    """Legacy Rust symbols end in `::h<16 hex>`; readers want the path without it."""
    head, sep, tail = text.rpartition("::h")
    if sep and len(tail) == 16 and all(c in "0123456789abcdef" for c in tail):
        return head
    return text
