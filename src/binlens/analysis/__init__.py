"""The analysis engine: pure functions from an Image to facts (no I/O, no SQLite, no JSON).

`analyze(image, progress=None) -> ProgramAnalysis` runs everything in-process.

The names below load with the first use of one (PEP 562): a process that only reads stored
analyses, as the CLI does while the analysis runs in its own process, needs `ENGINE_VERSION`
alone, and importing the engine cost the CLI ~0.6 MiB and ~14 ms.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from binlens.analysis.version import ENGINE_VERSION

if TYPE_CHECKING:
    from binlens.analysis.decode.backend import make_backend
    from binlens.analysis.engine import analyze
    from binlens.analysis.model import BasicBlock, Edge, FoundString, Function, Instruction, ProgramAnalysis, Xref

_WHERE = {
    "analyze": "engine",
    "make_backend": "decode.backend",
    **dict.fromkeys(
        ("BasicBlock", "Edge", "FoundString", "Function", "Instruction", "ProgramAnalysis", "Xref"), "model"
    ),
}


def __getattr__(name: str) -> Any:
    """The engine's public names, imported on first use."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"binlens.analysis.{where}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ENGINE_VERSION",
    "BasicBlock",
    "Edge",
    "FoundString",
    "Function",
    "Instruction",
    "ProgramAnalysis",
    "Xref",
    "analyze",
    "make_backend",
]
