"""Names as the engine reads them: every section, symbol, export and import name as text."""

from __future__ import annotations

import dataclasses
from typing import Any

from binlens.loader.image import Image


def _text(value: object) -> str:
    return value.decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)


def text_names(image: Image) -> Image:
    """The image with every section and symbol name as text (malformed files can carry raw bytes)."""
    # records of four kinds, each with a `name` (and a `raw_name`, but sections), treated alike
    lists: dict[str, list[Any]] = {
        "sections": image.sections,
        "symbols": image.symbols,
        "exports": image.exports,
        "imports": image.imports,
    }
    fixed: dict[str, Any] = {}
    for key, items in lists.items():
        if any(not isinstance(x.name, str) or not isinstance(getattr(x, "raw_name", ""), str) for x in items):
            fixed[key] = [
                dataclasses.replace(
                    x, name=_text(x.name), **({"raw_name": _text(x.raw_name)} if hasattr(x, "raw_name") else {})
                )
                for x in items
            ]
    return dataclasses.replace(image, **fixed) if fixed else image
