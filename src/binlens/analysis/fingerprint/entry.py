"""`main` of an executable from its entry code.

ELF: the first argument the entry passes to the C runtime's start routine (`__libc_start_main` in
glibc, musl's `__libc_start_main` too, uClibc's `__uClibc_main`). Position-independent entry code
computes it from the GOT register (i386: `call __x86.get_pc_thunk.bx; add ebx, X` then
`push [ebx+Y]` or `lea eax, [ebx+Y]`; MIPS: `bal; lui/addiu/addu $gp` then `lw $a0, Y($gp)` and
`lw $t9, Z($gp); jalr $t9`), which a few registers' worth of constant tracking follows.

PE (`main_from_crt`): the C runtime's start function (mingw's `__tmainCRTStartup`, MSVC's
`__scrt_common_main_seh`, reached from the entry) calls `main` (or `WinMain`) and keeps its result
for the exit call: the local function whose result the start code moves out of eax/rax within a
few instructions of the call, nearest before a call to an exit routine (`exit`, `_cexit`, `ExitProcess`, ...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from binlens.analysis.fingerprint.insns import ModelInstruction

START_ROUTINES = frozenset({"__libc_start_main", "__uClibc_main", "__libc_start_main_impl"})
EXIT_ROUTINES = frozenset({"exit", "_exit", "_cexit", "_c_exit", "_amsg_exit", "ExitProcess", "__crtExitProcess"})
# the first argument's register, per architecture, as the disassembly spells it
_ARG0: dict[str, tuple[str, ...]] = {
    "x86-64": ("rdi", "edi"),
    "aarch64": ("x0", "w0"),
    "arm": ("r0",),
    "mips": ("$a0", "a0"),
    "mips64": ("$a0", "a0"),
    "riscv": ("a0",),
    "riscv64": ("a0",),
    "ppc": ("r3",),
    "ppc64": ("r3",),
}
_CALLS = ("call", "indirect_call")
_MASK32 = 0xFFFFFFFF
_X86_MEM = re.compile(r"\[\s*(e[a-ds][xip]|e[sd]i)\s*(?:([+-])\s*(0x[0-9a-f]+|\d+))?\s*\]")
_MIPS_MEM = re.compile(r"^(-?(?:0x[0-9a-f]+|\d+))?\((\$\w+)\)$")
_EXIT_KEYS = frozenset(e.lstrip("_") for e in EXIT_ROUTINES)  # (`_exit` and `exit` alike, `ExitProcess@4`)
_RESULT_WINDOW = 4  # instructions after a call that may keep its result (the compiler interleaves loads)
_RESULT_MOVE = re.compile(r"^mov\s+[^,]+,\s*(eax|rax)$")

# (the value a register is known to hold, the memory slot it was loaded from)
Regs = dict[str, int]
WordReader = Callable[[int], int | None]


def _num(text: str) -> int | None:
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


class _Tracker:
    """The few constants position-independent entry code computes (i386 and MIPS), in order."""

    def __init__(self, arch: str, read_word: WordReader | None, pc_thunk: Callable[[int], str | None] | None) -> None:
        self.arch, self.read_word, self.pc_thunk = arch, read_word, pc_thunk
        self.vals: Regs = {"$zero": 0, "zero": 0}
        self.slots: Regs = {}
        self._pending: str | None = None  # a register a pc thunk loads with the address after its call

    def x86_mem(self, operands: str) -> int | None:
        """The address of an i386 memory operand based on a register with a known value."""
        m = _X86_MEM.search(operands.lower())
        if m is None or m.group(1) not in self.vals:
            return None
        disp = int(m.group(3), 0) if m.group(3) else 0
        return (self.vals[m.group(1)] + (-disp if m.group(2) == "-" else disp)) & _MASK32

    def load(self, slot: int | None) -> int | None:
        """The word at `slot` (a GOT entry) as the file holds it."""
        return None if slot is None or self.read_word is None else self.read_word(slot)

    def step(self, ins: ModelInstruction) -> None:
        """Follow one instruction that is not the start routine's call."""
        if self._pending is not None:
            self.vals[self._pending] = ins.address
            self._pending = None
        mnemonic, ops = ins.mnemonic.lower(), [o.strip() for o in ins.operands.lower().split(",")]
        if self.arch == "x86":
            self._x86(ins, mnemonic, ops)
        elif self.arch.startswith("mips"):
            self._mips(ins, mnemonic, ops)

    def _x86(self, ins: ModelInstruction, mnemonic: str, ops: list[str]) -> None:
        if mnemonic == "call" and self.pc_thunk is not None and ins.targets:
            self._pending = self.pc_thunk(ins.targets[0])
            return
        if len(ops) != 2:
            return
        dest, src = ops
        if mnemonic in ("add", "sub") and dest in self.vals and (n := _num(src)) is not None:
            self.vals[dest] = (self.vals[dest] + (n if mnemonic == "add" else -n)) & _MASK32
        elif mnemonic == "mov" and (n := _num(src)) is not None:
            self.vals[dest] = n & _MASK32
            self.slots.pop(dest, None)
        elif mnemonic == "lea" and (va := self.x86_mem(src)) is not None:
            self.vals[dest] = va
        elif mnemonic == "mov" and (va := self.x86_mem(src)) is not None:
            self.slots[dest] = va
            got = self.load(va)
            if got is None:
                self.vals.pop(dest, None)
            else:
                self.vals[dest] = got
        elif dest in self.vals or dest in self.slots:
            self.vals.pop(dest, None)
            self.slots.pop(dest, None)

    def _mips(self, ins: ModelInstruction, mnemonic: str, ops: list[str]) -> None:
        if mnemonic in ("bal", "bltzal", "bgezal"):
            self.vals["$ra"] = (ins.address + 8) & _MASK32
            return
        if not ops or not ops[0].startswith("$"):
            return
        dest = ops[0]
        value: int | None = None
        if mnemonic == "lui" and len(ops) == 2 and (n := _num(ops[1])) is not None:
            value = (n << 16) & _MASK32
        elif (
            mnemonic in ("addiu", "addi") and len(ops) == 3 and ops[1] in self.vals and (n := _num(ops[2])) is not None
        ):
            value = (self.vals[ops[1]] + n) & _MASK32
        elif mnemonic in ("addu", "add") and len(ops) == 3 and ops[1] in self.vals and ops[2] in self.vals:
            value = (self.vals[ops[1]] + self.vals[ops[2]]) & _MASK32
        elif mnemonic == "move" and len(ops) == 2 and ops[1] in self.vals:
            value = self.vals[ops[1]]
        elif mnemonic == "lw" and len(ops) == 2 and (m := _MIPS_MEM.match(ops[1])) and m.group(2) in self.vals:
            slot = (self.vals[m.group(2)] + (_num(m.group(1) or "0") or 0)) & _MASK32
            self.slots[dest] = slot
            value = self.load(slot)
            if value is not None:
                self.vals[dest] = value
            else:
                self.vals.pop(dest, None)
            return
        self.slots.pop(dest, None)
        if value is None:
            if dest not in ("$zero", "zero"):
                self.vals.pop(dest, None)
        else:
            self.vals[dest] = value

    def call_slot(self, ins: ModelInstruction) -> int | None:
        """The memory slot an indirect call's target was loaded from (`jalr $t9`, `call [ebx+X]`)."""
        ops = ins.operands.lower().split(",")
        reg = ops[-1].strip()
        if reg in self.slots:
            return self.slots[reg]
        return self.x86_mem(ins.operands) if self.arch == "x86" else None


def main_from_entry(
    arch: str,
    insns: Sequence[ModelInstruction],
    is_start_routine: Callable[[ModelInstruction, int | None], bool],
    is_function: Callable[[int], bool],
    read_word: WordReader | None = None,
    pc_thunk: Callable[[int], str | None] | None = None,
) -> int | None:
    """The function the entry code passes as first argument to the start routine: at the call that
    `is_start_routine` recognises (given the instruction and the memory slot an indirect call's
    target came from), else at the entry's last call (a stripped static executable, where the
    routine has no name). None when no function address is passed. `read_word` reads a GOT entry
    and `pc_thunk` names the register a function loads with its return address (i386's
    `__x86.get_pc_thunk.bx`): with them, position-independent entry code is followed."""
    regs = _ARG0.get(arch)
    value: int | None = None
    at_last_call: int | None = None
    pushed: list[int | None] = []
    track = _Tracker(arch, read_word, pc_thunk)
    for ins in insns:
        mnemonic = ins.mnemonic.lower()
        if ins.flow in _CALLS or mnemonic in ("call", "bl", "blx", "jal", "jalr", "bctrl"):
            arg = pushed[-1] if arch == "x86" and pushed else value
            if is_start_routine(ins, track.call_slot(ins)):
                return arg if arg is not None and is_function(arg) else None
            at_last_call = arg
            track.step(ins)
            continue
        if arch == "x86" and mnemonic == "push":
            got = next((r for r in (*ins.refs, *ins.targets) if is_function(r)), None)
            if got is None:
                op = ins.operands.strip().lower()
                got = track.vals.get(op) if op in track.vals else track.load(track.x86_mem(op))
            pushed.append(got)
            continue
        track.step(ins)
        if regs is None:
            continue
        dest = ins.operands.split(",", 1)[0].strip().lower()
        if dest in regs:
            value = next((r for r in reversed(ins.refs) if is_function(r)), None)
            if value is None:
                value = track.vals.get(dest)
    return at_last_call if at_last_call is not None and is_function(at_last_call) else None


def main_from_crt(
    insns: Sequence[ModelInstruction],
    callee: Callable[[ModelInstruction], tuple[int | None, str | None]],
    image_base: int | None,
) -> tuple[int, str] | None:
    """`(address, "main" | "WinMain")` in a PE C runtime's start function, or None.

    `callee(ins)` gives a call's local function (not an import thunk) or the import it reaches.
    The candidate calls are to local functions whose result one of the next few instructions
    moves out of eax/rax; the one nearest before a call to an exit routine is `main`. It is `WinMain` when the
    module handle (the image base) is among the arguments set up for it.
    """
    candidates: list[tuple[int, int]] = []  # (index, function)
    exits: list[int] = []
    for k, ins in enumerate(insns):
        if ins.flow not in _CALLS and ins.mnemonic.lower() != "call":
            continue
        local, imported = callee(ins)
        if imported is not None and imported.lstrip("_").split("@")[0] in _EXIT_KEYS:
            exits.append(k)
        elif local is not None and _keeps_result(insns[k + 1 : k + 1 + _RESULT_WINDOW]):
            candidates.append((k, local))
    best: tuple[int, int, int] | None = None  # (distance, index, function)
    for k, fn in candidates:
        after = [e - k for e in exits if e > k]
        if after and (best is None or min(after) < best[0]):
            best = (min(after), k, fn)
    if best is None:
        return None
    _d, k, fn = best
    winmain = image_base is not None and any(_passes(ins, image_base) for ins in insns[max(0, k - 8) : k])
    return fn, "WinMain" if winmain else "main"


def _keeps_result(after: Sequence[ModelInstruction]) -> bool:
    """Whether the instructions after a call move its result out of eax/rax (before another call
    or a write of eax)."""
    for ins in after:
        text = f"{ins.mnemonic.lower()} {ins.operands.lower()}".strip()
        if _RESULT_MOVE.match(text):
            return True
        if ins.flow in _CALLS or ins.flow in ("jump", "conditional", "return"):
            return False
        if ins.operands.lower().split(",", 1)[0].strip() in ("eax", "rax", "ax", "al"):
            return False
    return False


def _passes(ins: ModelInstruction, value: int) -> bool:
    """Whether an instruction sets up `value` (a reference to it, or `push value`)."""
    return value in ins.refs or (ins.mnemonic.lower() == "push" and _num(ins.operands) == value)
