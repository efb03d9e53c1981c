"""`Round`: what the heuristic stages share in one round, and the test every guessed start passes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

from binlens.analysis.codemap import instruction_start
from binlens.analysis.heuristics.arm import arm_after_end, arm_pushes, set_arm_state
from binlens.analysis.heuristics.entries import mips_prologue, starts_like_function
from binlens.analysis.heuristics.gapmap import Gaps, body_spans
from binlens.analysis.heuristics.prologues import INSN_ALIGN
from binlens.analysis.heuristics.trials import self_contained
from binlens.analysis.intervals import IntervalSet
from binlens.analysis.model import T_BAD, T_JUMP, T_RET, Body
from binlens.loader.image import Image

if TYPE_CHECKING:
    from binlens.analysis.decode.backend import Backend
    from binlens.analysis.decode.capstone_backend import CapstoneBackend
    from binlens.analysis.discovery.explorer import Explorer


class Round:
    """One round of one heuristic stage: the image and the discovery so far (read only, apart from
    the chunks the explorer decodes), the starts the round takes (`out`, each with its source),
    and the architecture's flags the stages branch on."""

    def __init__(
        self,
        image: Image,
        explorer: Explorer,
        starts: Mapping[int, frozenset[str]],
        known: dict[int, int],
        bodies: dict[int, Body],
        gaps: Gaps,
    ) -> None:
        """`starts`: the function starts of the last discovery; `known`: where the heuristics look
        for no new starts (unwind ranges and sized symbols: start -> size); `bodies`: what each
        start reaches; `gaps`: the gap stage's coverage, kept between rounds."""
        self.image = image
        self.explorer = explorer
        self.codemap = explorer.codemap
        self.backend: Backend = explorer.backend
        self.starts = starts
        self.known = known
        self.bodies = bodies
        self.gaps = gaps
        self.out: dict[int, str] = {}  # the starts this round takes, and why
        self.bound: set[int] = set(starts)  # the starts, and those the gap stages take as they go
        self.inside = IntervalSet(list(known.items()))
        self._spans: IntervalSet | None = None  # the bodies' spans, made when first asked
        arch = image.identity.arch
        self.arch = arch
        self.x86 = arch in ("x86-64", "x86")
        self.arm = arch == "arm"
        self.mips = mips_prologue(image, self.codemap) if arch == "mips" else None
        # (Mach-O's LC_FUNCTION_STARTS lists every function: the rest of its code is not an entry, but
        # landing pads and code after calls that do not return, which a trial cannot tell apart)
        self.a64 = arch == "aarch64" and not image.function_hints.get("function_starts")
        self.insn_align = INSN_ALIGN.get(arch, 1)
        # a test of code that starts like a function, which lets a code address taken inside a found
        # function's blocks be an entry (the code-offset stage sets it; x86: `starts_like_function`)
        self.taken: Callable[[int], bool] | None = None

    @property
    def capstone(self) -> CapstoneBackend:
        """The backend as the ARM32 tests read it (capstone decodes ARM32: literal pools, states)."""
        return cast("CapstoneBackend", self.backend)

    def unexplored(self, va: int, lax: bool = False) -> bool:
        """Is `va` code nothing decoded, outside the known ranges (`lax`: inside them too) unless it
        starts one?"""
        r = self.codemap.region(va)
        return r is not None and r.state[va - r.va] == 0 and (lax or not (self.inside(va) and va not in self.known))

    def inside_body(self, va: int) -> bool:
        """Does `va` lie inside a found function's chunks (the spans as they are when first asked)?"""
        if self._spans is None:
            self._spans = IntervalSet(body_spans(self.explorer, self.bodies))
        return self._spans(va)

    def accept(
        self,
        va: int,
        source: str,
        need_ret: bool = False,
        in_range: bool = False,
        gap_end: int = 0,
        trial: bool = False,
    ) -> None:
        """Take `va` as a function start (into `out`) when code there is an entry nothing found yet.

        `need_ret`: the first block returns or jumps (not with `trial`), or (with the gap's end
        `gap_end`) the code from here stays in the gap, leaving it only by calls and tail calls.
        `in_range`: ARM, a gap's push or leaf, which may start inside an unwind range."""
        placed = self._placed(va)
        if placed is None:
            return
        va, thumb = placed
        if va in self.starts or va in self.out:
            return
        if not self.unexplored(va, self._lax(va, thumb, source, in_range)) and va not in self.explorer.unproven:
            self._reached_entry(va, source)
            return
        if source == "pointer" and self._label(va):
            return  # a label inside a function (computed goto, unresolved table), not an entry
        if self.arm:
            backend = self.capstone
            if va in backend.literals:
                return  # a literal pool word a pc-relative load reads: data
            set_arm_state(backend, va, thumb)
        c = self.explorer.chunk(va)
        if c is None or c[1] == T_BAD:
            return
        ends = not trial and c[1] in (T_RET, T_JUMP)
        if not need_ret or ends or (gap_end and self_contained(self.explorer, va, gap_end, self.bound)[0]):
            self.out[va] = source

    def _placed(self, va: int) -> tuple[int, bool] | None:
        """(`va`, Thumb?) where an instruction may start, else None. ARM: a code address with bit 0
        set names Thumb code at the even address; else word-aligned ARM code."""
        if self.arm:
            thumb = bool(va & 1)
            va &= ~1
            if not thumb and va & 3:
                return None  # ARM instructions are word-aligned: no ARM function starts here
            return va, thumb
        if va % self.insn_align:
            return None  # no instruction of the architecture starts here
        return va, False

    def _lax(self, va: int, thumb: bool, source: str, in_range: bool) -> bool:
        """ARM: may `va` start inside a known range? A linker merges the unwind entry of a function
        into the one before when the two describe the same frame, so one range may hold a second
        function: a gap's push or leaf (`in_range`), or code a data pointer names that begins with
        a push in its state or comes right after a return."""
        if not self.arm:
            return False
        return in_range or (
            source == "pointer"
            and (
                arm_pushes(self.image, self.codemap, va | thumb)
                or arm_after_end(self.image, self.codemap, self.capstone, va, thumb, tail=True)
            )
        )

    def _reached_entry(self, va: int, source: str) -> None:
        """`accept` at code descent already decoded: an address-taken x86 prologue that descent ran
        into (the fall-through after a call that does not return) is still a function of its own."""
        if (
            source == "pointer"
            and self.x86
            and self.image.identity.format == "ELF"
            and instruction_start(self.codemap, va)
            and not self.inside(va)
            and starts_like_function(self.codemap, va)
        ):
            self.out[va] = source

    def _label(self, va: int) -> bool:
        """Is the pointer target `va` a label inside a found function rather than an entry (one that
        starts like a function, by `taken` or x86's prologues, is an entry)?"""
        return (
            self.inside_body(va)
            and not (self.x86 and starts_like_function(self.codemap, va))
            and not (self.taken is not None and self.taken(va))
        )
