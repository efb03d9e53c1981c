"""`main` of an ELF executable from its entry code: the first argument the entry passes to the C
runtime's start routine (`__libc_start_main` in glibc, musl's `__libc_start_main` too, uClibc's
`__uClibc_main`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from binlens.analysis.fingerprint.insns import ModelInstruction

START_ROUTINES = frozenset({"__libc_start_main", "__uClibc_main", "__libc_start_main_impl"})
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


def main_from_entry(
    arch: str,
    insns: Sequence[ModelInstruction],
    is_start_routine: Callable[[ModelInstruction], bool],
    is_function: Callable[[int], bool],
) -> int | None:
    """The function the entry code passes as first argument to the start routine: at the call that
    `is_start_routine` recognises, else at the entry's last call (a stripped static executable,
    where the routine has no name). None when no function address is passed."""
    regs = _ARG0.get(arch)
    value: int | None = None
    at_last_call: int | None = None
    pushed: list[int | None] = []
    for ins in insns:
        mnemonic = ins.mnemonic.lower()
        if ins.flow in _CALLS or mnemonic in ("call", "bl", "blx", "jal", "jalr", "bctrl"):
            arg = pushed[-1] if arch == "x86" and pushed else value
            if is_start_routine(ins):
                return arg if arg is not None and is_function(arg) else None
            at_last_call = arg
            continue
        if arch == "x86" and mnemonic == "push":
            pushed.append(next((r for r in (*ins.refs, *ins.targets) if is_function(r)), None))
            continue
        if regs is None:
            continue
        dest = ins.operands.split(",", 1)[0].strip().lower()
        if dest in regs:
            value = next((r for r in reversed(ins.refs) if is_function(r)), None)
    return at_last_call if at_last_call is not None and is_function(at_last_call) else None
