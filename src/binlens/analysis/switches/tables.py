"""Where a jump table may lie: what every resolver asks of a table's place in the image.

Kept apart from `common.py` (which decodes with capstone) so the x86 resolver, which decodes with
iced-x86, does not load capstone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from binlens.loader.image import Image


def writable(image: Image, va: int) -> bool:
    """Whether `va` lies in a section written at run time (a table there may change: not a jump table)."""
    sec = image.section_at(va)
    if sec is None or sec.name.startswith(".data.rel.ro"):  # read-only once relocated (RELRO)
        return False
    return sec.perms[1] == "w" and sec.kind != "code"
