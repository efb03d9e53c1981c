"""`sha256_hex`: a file's identity digest, without mapping OpenSSL into a process that has not already.

`hashlib` loads OpenSSL's libcrypto, which adds 3.8 MiB to a process's resident memory (`import hashlib`
alone). The analysis process checks the bytes it reads against the
caller's digest and never needs OpenSSL otherwise, so there CPython's own SHA-256 module serves
(~6 ms for libc.so.6's 1.8 MiB, against ~1 ms); where `hashlib` is loaded already (a server, the
CLI) it is used. Both give the same digest.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

_builtin: Callable[[bytes], object] | None
try:  # CPython 3.12+: `_sha2`; 3.11: `_sha256`
    from _sha2 import sha256 as _builtin  # type: ignore[import-not-found]
except ImportError:
    try:
        from _sha256 import sha256 as _builtin  # type: ignore[import-not-found,no-redef]
    except ImportError:  # pragma: no cover - an interpreter without its builtin hash modules
        _builtin = None


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """The SHA-256 digest of `data`, as lowercase hex."""
    hashlib = sys.modules.get("hashlib")
    if hashlib is None and _builtin is not None:
        return _builtin(data).hexdigest()  # type: ignore[attr-defined]
    if hashlib is None:  # pragma: no cover
        import hashlib
    return hashlib.sha256(data).hexdigest()
