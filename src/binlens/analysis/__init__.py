"""The analysis engine: pure functions from an Image to facts (no I/O, no SQLite, no JSON).

`analyze(image, progress=None) -> ProgramAnalysis` runs everything in-process.
"""

from binlens.analysis.engine import ENGINE_VERSION, analyze, make_backend
from binlens.analysis.model import (
    BasicBlock,
    Edge,
    Function,
    Instruction,
    ProgramAnalysis,
    StringItem,
    Xref,
)

__all__ = [
    "ENGINE_VERSION",
    "BasicBlock",
    "Edge",
    "Function",
    "Instruction",
    "ProgramAnalysis",
    "StringItem",
    "Xref",
    "analyze",
    "make_backend",
]
