"""Where a function may not start: the user's removed starts, data the loader located in code
sections, the unlisted addresses of an ARM32 Mach-O's LC_FUNCTION_STARTS sections, and (for
heuristic guesses) bytes that read as data."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from binlens.loader.image import Image
from binlens.loader.pe_data import looks_like_data


def data_like_test(image: Image) -> Callable[[int], bool]:
    """A test for a guessed start (a heuristic's) whose bytes read as data: in a PE, a string or
    zeros (`pe_data.looks_like_data`; x64 code outside the functions `.pdata` lists is a small leaf,
    so there a string of two characters is data); elsewhere none."""
    if image.identity.format != "PE":
        return lambda va: False
    listed = set(image.function_hints.get("pdata", ()))
    short = image.identity.arch == "x86-64" and bool(listed)
    return lambda va: va not in listed and looks_like_data(image.read, va, short)


class RefusedStarts:
    """Addresses that may not become function starts (`in`): the user's removed starts (`user`), data
    the loader located in code sections (`Image.data_ranges`), and
    in an ARM32 Mach-O section that LC_FUNCTION_STARTS covers, every address it does not list. On
    armv7 the starts found there besides the linker's list were labels inside functions and ARM
    code decoded as Thumb or the reverse (armv7 BatteryLife of the corpus: 8.5k of them, tail-call
    targets, gap and data-pointer guesses and calls from misdecoded code, beside its 4.6k listed
    functions; a sample of twelve: all inside listed functions). Not on AArch64, where code
    the list leaves out is real: Dart's AOT snapshot (flutter's HelloApp: 3.1k called functions
    the list does not name) and functions after a tail call that data points to."""

    def __init__(self, image: Image, user: set[int]) -> None:
        self.user = user
        arm = image.identity.arch == "arm"
        listed = image.function_hints.get("function_starts") if image.identity.format == "MachO" and arm else None
        self.listed = {a & ~1 if arm else a for a in listed or ()}
        order = sorted(self.listed)

        def holds_one(lo: int, hi: int) -> bool:
            i = bisect.bisect_left(order, lo)
            return i < len(order) and order[i] < hi

        self.spans = sorted((s.va, s.va + s.size) for s in image.sections if s.size and holds_one(s.va, s.va + s.size))
        self.starts = [lo for lo, _hi in self.spans]
        self.data = image.data_ranges  # (sorted, disjoint)
        self.data_starts = [lo for lo, _hi, _k in self.data]

    def __contains__(self, va: object) -> bool:
        if va in self.user:
            return True
        if self.data and isinstance(va, int):
            i = bisect.bisect_right(self.data_starts, va) - 1
            if i >= 0 and va < self.data[i][1]:
                return True
        if not self.spans or va in self.listed or not isinstance(va, int):
            return False
        i = bisect.bisect_right(self.starts, va) - 1
        return i >= 0 and va < self.spans[i][1]
