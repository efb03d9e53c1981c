"""The engine's optional C extensions (built by setup.py): `_x86scan`, `_descent`.

Each has a Python path beside it that gives the same results, slower; that path runs where the
extension was not built (no C compiler at install time) or when `BINLENS_PURE_PYTHON` is set.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def native(name: str, *terminators: int) -> ModuleType | None:
    """`binlens.analysis.native.<name>`, told the engine's terminator codes (when given); None where the
    Python path runs."""
    if os.environ.get("BINLENS_PURE_PYTHON"):
        return None
    try:
        module = importlib.import_module(f"binlens.analysis.native.{name}")
    except ImportError:  # pragma: no cover - a build without a C compiler
        return None
    if terminators:
        module.configure(*terminators)
    return module
