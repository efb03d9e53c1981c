"""One profile per instruction set: the facts of an ISA that several passes branch on.

A pass asks the profile (`PROFILES[image.identity.arch]`) rather than testing architecture
names, so adding an ISA is adding a row here, a backend in `decode/`, a module in `switches/`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IsaProfile:
    """What the engine's passes need to know of one instruction set."""

    name: str  # `image.identity.arch`
    x86: bool = False  # variable-length x86 decoding (iced-x86 and the C scanner)
    insn_align: int = 1  # least alignment of an instruction (ARM32: 2, bit 0 names Thumb)
    thumb_bit: int = 0  # 1 where an odd code pointer means Thumb code (ARM32)
    delay_slots: int = 0  # instructions after a branch that run before it (MIPS)
    # the walk records conditional predecessors: the jump-table resolvers of RISC ISAs look for
    # the guard of a `cmp; b.ls dispatch` that nothing falls into
    cond_preds: bool = False
    # when both paths to a table fail, try the path preferring conditional branches too
    cond_first: bool = False
    # without an FDE or symbol extent, a function holding a guarded table reaches at least its
    # highest case label: a jump up to there is no tail call past the next entry
    case_extent: bool = False
    # ISAs whose gaps are searched for per-ISA prologues (`heuristics/prologues.py`)
    prologues: bool = False


PROFILES: dict[str, IsaProfile] = {
    p.name: p
    for p in (
        IsaProfile("x86-64", x86=True),
        IsaProfile("x86", x86=True),
        IsaProfile("aarch64", insn_align=4, cond_preds=True),
        IsaProfile("arm", insn_align=2, thumb_bit=1, cond_preds=True),
        IsaProfile("mips", insn_align=4, delay_slots=1, cond_preds=True, prologues=True),
        IsaProfile("ppc", insn_align=4, cond_preds=True, cond_first=True, case_extent=True, prologues=True),
        IsaProfile("riscv", insn_align=2, cond_preds=True, cond_first=True, case_extent=True, prologues=True),
    )
}

# an architecture the loader names but no backend decodes: its analysis is refused before any
# pass asks (`decode.backend.make_backend`); the passes that run on it anyway (strings) need none
UNKNOWN = IsaProfile("unknown")


def profile(arch: str) -> IsaProfile:
    """The profile of `arch` (`UNKNOWN` for one without a backend)."""
    return PROFILES.get(arch, UNKNOWN)
