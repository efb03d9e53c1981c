"""iced-x86's compiled decoder and the six of its constant modules the engine uses, without the rest.

`import iced_x86` runs the package's 40 generated constant modules, `Code.py` alone 738 KB of source
for ~4,900 constants the engine never reads: on a bare interpreter that import is 4.9 MiB of
resident memory and ~30 ms, where the compiled extension alone is 1.6 MiB. This module loads the
extension and `Register`, `OpKind`, `Mnemonic`, `FlowControl`, `MemorySize` and `FormatterSyntax`
from the installed package's own files, so their values are always the installed version's; in an
analysis process, which loads much of the rest anyway, that is 1.2 MiB and ~19 ms less. It gives the
names the engine uses under the package's names (`from binlens.analysis import iced as ix`;
`ix.Decoder`, `ix.Register.RSP`). Where `iced_x86` is already imported, or its files are not laid
out as expected, the package is imported as it is.

The extension is registered as `iced_x86._iced_x86_py`, the name the package gives it, so a later
`import iced_x86` (a test, a user's script) takes this one: a PyO3 module initialises once a process.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType
from typing import Any

_PACKAGE = "iced_x86"
_EXTENSION = f"{_PACKAGE}._iced_x86_py"
CONSTANTS = ("Register", "OpKind", "Mnemonic", "FlowControl", "MemorySize", "FormatterSyntax")
CLASSES = ("Decoder", "Instruction", "Formatter", "RegisterExt")


def _module(name: str, path: Path, register: bool) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if register:
            del sys.modules[name]
        raise
    return module


def _lean() -> dict[str, Any] | None:
    """The names from the extension and the constant modules alone, or None to import the package."""
    if _PACKAGE in sys.modules:
        return None
    spec = importlib.util.find_spec(_PACKAGE)  # (finds a top-level package without importing it)
    roots = spec.submodule_search_locations if spec is not None else None
    if not roots:
        return None
    root = Path(next(iter(roots)))
    ext = sys.modules.get(_EXTENSION)
    if ext is None:
        found = [root / f"_iced_x86_py{suffix}" for suffix in EXTENSION_SUFFIXES]
        so = next((p for p in found if p.is_file()), None)
        if so is None or not all((root / f"{c}.py").is_file() for c in CONSTANTS):
            return None
        ext = _module(_EXTENSION, so, register=True)
    names: dict[str, Any] = {c: getattr(ext, c) for c in CLASSES}
    for c in CONSTANTS:
        names[c] = _module(f"{_PACKAGE}.{c}", root / f"{c}.py", register=False)
    return names


def _load() -> dict[str, Any]:
    names = _lean()
    if names is None:
        import iced_x86

        names = {c: getattr(iced_x86, c) for c in (*CLASSES, *CONSTANTS)}
    return names


globals().update(_load())
Decoder: Any
Instruction: Any
Formatter: Any
RegisterExt: Any
Register: Any
OpKind: Any
Mnemonic: Any
FlowControl: Any
MemorySize: Any
FormatterSyntax: Any
