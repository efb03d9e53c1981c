"""Types of the C extension `binlens.store._rows` (`_rows.c`): the analysis rows' packers."""

from array import array
from collections.abc import Sequence
from typing import Any

def pack_by_owner(
    starts: Sequence[int], ends: Sequence[int], fns: Sequence[int], xrefs: Any, codes: dict[str, int], /
) -> list[tuple[int | None, bytes, bytes]]: ...
def merge_spans(
    s1: array[int], e1: array[int], f1: array[int], s2: array[int], e2: array[int], f2: array[int], n1: int, /
) -> int: ...
