"""i386 position-independent code: which registers and stack slots hold a known address.

gcc's i386 PIC code gets its own address from a `__x86.get_pc_thunk.REG` (`mov REG, [esp]; ret`):
after the call, REG holds the return address; `add REG, GOT - here` makes it the GOT's address,
and data is then reached GOT-relative (`lea eax, [REG + str@GOTOFF]`, `mov eax, [REG + idx*4 +
table@GOTOFF]`). Optimised code keeps REG in a register; -O0 code stores it in a stack slot
(`mov [ebp - 0x73c], eax`) and loads it again into another register before each use. `PicState`
follows both, within a chunk and along the chunks the code flows to (`X86Backend._pc_chunk`), and
`step` records the address each memory operand based on such a register forms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from binlens.analysis.decode import iced as ix

OK = ix.OpKind
MN = ix.Mnemonic
REG_NONE = ix.Register.NONE
EBP = ix.Register.EBP
CALLER_SAVED = (ix.Register.EAX, ix.Register.ECX, ix.Register.EDX)
THUNK_REGS = {  # the ModRM byte of `mov REG, [esp]` -> REG
    0x04: ix.Register.EAX,
    0x0C: ix.Register.ECX,
    0x14: ix.Register.EDX,
    0x1C: ix.Register.EBX,
    0x2C: ix.Register.EBP,
    0x34: ix.Register.ESI,
    0x3C: ix.Register.EDI,
}
_IMM = (OK.IMMEDIATE32, OK.IMMEDIATE8TO32)
_FULL = {  # 32-bit register of each 8/16-bit one (a write to AL changes EAX)
    getattr(ix.Register, small): getattr(ix.Register, big)
    for big, smalls in (
        ("EAX", ("AX", "AL", "AH")),
        ("ECX", ("CX", "CL", "CH")),
        ("EDX", ("DX", "DL", "DH")),
        ("EBX", ("BX", "BL", "BH")),
        ("ESI", ("SI",)),
        ("EDI", ("DI",)),
        ("EBP", ("BP",)),
    )
    for small in smalls
}


@dataclass
class PicState:
    """Registers and `[ebp + d]` stack slots holding a known address, at one point of the code."""

    regs: dict[int, int] = field(default_factory=dict)
    slots: dict[int, int] = field(default_factory=dict)

    def copy(self) -> PicState:
        return PicState(dict(self.regs), dict(self.slots))

    def after_call(self) -> PicState:
        """What a call leaves: the callee-saved registers and the frame's slots."""
        return PicState({r: v for r, v in self.regs.items() if r not in CALLER_SAVED}, dict(self.slots))


def step(ins: ix.Instruction, state: PicState, record: Callable[[int], None]) -> None:
    """Record (`record(address)`) the address a memory operand based on a known register
    forms (with an index register: the start of the array it indexes), then follow `ins`'s effect
    on the known registers and slots."""
    regs = state.regs
    base = ins.memory_base
    if base != REG_NONE and base in regs:
        record((regs[base] + ins.memory_displacement) & 0xFFFFFFFF)
    k0 = ins.op0_kind if ins.op_count else None
    m = ins.mnemonic
    if k0 == OK.REGISTER:
        r = _FULL.get(ins.op0_register, ins.op0_register)
        if m == MN.ADD and r in regs and ins.op1_kind in _IMM:
            regs[r] = (regs[r] + ins.immediate(1)) & 0xFFFFFFFF
        elif m == MN.MOV and ins.op1_kind == OK.REGISTER and ins.op1_register in regs:
            regs[r] = regs[ins.op1_register]
        elif m == MN.MOV and ins.op1_kind == OK.MEMORY and base == EBP and ins.memory_index == REG_NONE:
            v = state.slots.get(ins.memory_displacement)
            if v is None:
                regs.pop(r, None)
            else:
                regs[r] = v
        elif m not in (MN.CMP, MN.TEST, MN.PUSH, MN.BT):
            regs.pop(r, None)
            if r == EBP:
                state.slots.clear()
    elif k0 == OK.MEMORY and base == EBP and ins.memory_index == REG_NONE and m not in (MN.CMP, MN.TEST):
        d = ins.memory_displacement
        if m == MN.MOV and ins.op1_kind == OK.REGISTER and ins.op1_register in regs:
            state.slots[d] = regs[ins.op1_register]
        else:
            state.slots.pop(d, None)
