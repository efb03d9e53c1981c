"""What the indexer hands the corpus store for one binary (`BinaryRecord`), and what the store
answers (`CorpusInfo`, `FunctionHit`, `BinaryHit`).

Plain data: a Ray worker builds a `BinaryRecord` in its own process and returns it to the driver,
which writes it to the store in one transaction, so a killed run leaves each binary either wholly
indexed or absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from binlens.analysis.fingerprint.model import Fingerprint


@dataclass(frozen=True, slots=True)
class BinaryRecord:
    """One analysed binary as the corpus keeps it."""

    sha256: str  # hex digest of the file's bytes: the corpus's key for it
    path: str  # absolute path where the indexer found it (the first, when copies exist)
    size: int  # bytes
    format: str  # elf | pe | macho
    arch: str  # the loader's architecture name (x86-64, aarch64, ...)
    bits: int
    functions: Sequence[Fingerprint]  # every function's fingerprint
    strings: Sequence[str]  # distinct strings found in the binary
    imports: Sequence[str]  # distinct imported symbol names
    seconds: float  # analysis and fingerprinting time
    # function entry -> the functions it tail-jumps to (calls its fingerprint's callees leave out)
    tail_calls: Mapping[int, Sequence[int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FileFailure:
    """A file the indexer could not index: why, so a rerun can report it without retrying blindly."""

    path: str
    sha256: str | None  # None when the file could not even be read
    code: str  # a BinlensError code (analysis_failed, timeout, unsupported_format, ...)
    message: str


@dataclass(frozen=True, slots=True)
class CorpusInfo:
    """One corpus's counts and build state."""

    name: str
    binaries: int
    functions: int
    strings: int
    imports: int
    failures: int
    created_at: str  # ISO 8601 UTC
    updated_at: str


@dataclass(frozen=True, slots=True)
class FunctionHit:
    """A function of the corpus similar to the one searched for."""

    sha256: str
    file: str
    address: int
    name: str | None
    similarity: float  # 0..1, exact fingerprints score 1.0


@dataclass(frozen=True, slots=True)
class BinaryHit:
    """A binary of the corpus holding a searched string or import."""

    sha256: str
    file: str
    matches: Sequence[str]  # the strings or imports that matched
