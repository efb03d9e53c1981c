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
from typing import Any


def _builtin_sha256() -> Callable[[bytes | bytearray | memoryview], Any] | None:
    """CPython's own SHA-256 constructor (`_sha2` on 3.12+, `_sha256` on 3.11), or None."""
    for name in ("_sha2", "_sha256"):
        try:
            return __import__(name).sha256
        except ImportError:
            continue
    return None  # pragma: no cover - an interpreter without its builtin hash modules


_builtin = _builtin_sha256()


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """The SHA-256 digest of `data`, as lowercase hex."""
    if "hashlib" not in sys.modules and _builtin is not None:
        return _builtin(data).hexdigest()
    import hashlib  # already loaded, except on an interpreter without the builtin hash modules

    return hashlib.sha256(data).hexdigest()
