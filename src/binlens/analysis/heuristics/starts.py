"""The heuristic stages for code descent did not reach, in one table, most trusted first.

The engine runs `SCHEDULE` in order: each stage is a function of one `Round` (what the stages
share: the image, the explorer, the last discovery's starts and bodies, the gap coverage kept
between rounds) that puts the starts it guesses into `Round.out`, each through `Round.accept` or
a test of its own as strict; the engine filters them (refused starts, data), runs discovery again
when a round found any, and skips a repeated stage until some round finds new code.

A new heuristic stage goes here: a function `stage(r: Round) -> None` (a module of
`heuristics/` where it is big), a row in `STAGES`, and its place in `SCHEDULE` by how far its
guesses are trusted. Per-instruction-set tests go in `entries.py` (first instructions),
`prologues.py` (MIPS, PowerPC, RISC-V prologue kit) or `arm.py` (ARM32).
"""

from __future__ import annotations

from collections.abc import Callable

from binlens.analysis.heuristics.arm_gaps import arm_gaps
from binlens.analysis.heuristics.gaps import ARCHES as GAP_ARCHES
from binlens.analysis.heuristics.gaps import gaps
from binlens.analysis.heuristics.pointers import code_offsets, data_pointers, data_prologues
from binlens.analysis.heuristics.round import Round

_OFFSET_ROUNDS = 8  # each round looks at the addresses taken by code reached so far
_GAP_ROUNDS = 200  # each round looks at the first address of every remaining gap


def gap_stage(r: Round) -> None:
    """Code no function covers: ARM32's pushes and leaves (`arm_gaps.py`), the prologues and trials
    of x86, AArch64, MIPS, PowerPC and RISC-V (`gaps.py`); nothing on other architectures."""
    if r.arm:
        arm_gaps(r)
    elif r.arch in GAP_ARCHES:
        gaps(r)


# name -> stage: each puts the starts it guesses into `Round.out`
STAGES: dict[str, Callable[[Round], None]] = {
    "code_offsets": code_offsets,  # code addresses taken by instructions in reached code
    "gaps": gap_stage,  # code no function covers that starts like one or stays in its gap
    "data_prologues": data_prologues,  # code pointers in data to code that starts like a function
    "data_pointers": data_pointers,  # every code pointer in data
}

# (stage, rounds in a row at most), most trusted first. Data pointers come after the gaps: a switch
# table of a function nothing has reached yet would otherwise turn its case labels into functions;
# within data pointers, targets that start like functions go first for the same reason. The code
# offsets run again after each stage, since code found later takes addresses too.
SCHEDULE: tuple[tuple[str, int], ...] = (
    ("code_offsets", _OFFSET_ROUNDS),
    ("gaps", _GAP_ROUNDS),
    ("code_offsets", _OFFSET_ROUNDS),
    ("data_prologues", 1),
    ("data_pointers", 1),
    ("code_offsets", _OFFSET_ROUNDS),
    ("gaps", _GAP_ROUNDS),
    ("code_offsets", _OFFSET_ROUNDS),
)
DATA_STAGES = ("data_prologues", "data_pointers")  # after these, switch tables and goto tables are read again


def schedule() -> list[str]:
    """The stages in the order the engine runs them, one entry per round."""
    return [name for name, rounds in SCHEDULE for _ in range(rounds)]


def heuristic_starts(stage: str, r: Round) -> dict[int, str]:
    """Run `stage` (a key of `STAGES`) over `r`: the starts it guesses, each with its source."""
    STAGES[stage](r)
    return r.out
