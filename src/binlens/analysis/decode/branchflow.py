"""How a branch, return or trap flows, per architecture of the capstone backend, from its mnemonic,
its operand text and its direct target.

The target comes from the instruction's operands (`CapstoneBackend.classify`, on an instruction
decoded with details) or from its operand text (`text_flow`: the chunk decoder, which then needs
no detailed decode of the branch): capstone prints the immediate it decoded as the last operand.
Both feed the same per-architecture function, so they cannot disagree on the flow.
"""

from __future__ import annotations

from collections.abc import Callable

F_NEXT, F_JUMP, F_COND, F_CALL, F_RET, F_IJUMP, F_ICALL, F_STOP = range(8)
# a conditional indirect jump (ARM `addls pc, pc, rI, lsl #2`, `ldrls pc, [pc, rI, lsl #2]`): the
# chunk ends there, and the path where the condition fails falls through
F_CIJUMP = 8

Flow = tuple[int, int]  # (flow kind, direct target or -1)
_A64_INDIRECT = {
    **dict.fromkeys(("br", "braa", "brab", "braaz", "brabz"), F_IJUMP),
    **dict.fromkeys(("blr", "blraa", "blrab", "blraaz", "blrabz"), F_ICALL),
    **dict.fromkeys(("ret", "retaa", "retab", "eret"), F_RET),
    **dict.fromkeys(("brk", "udf", "hlt"), F_STOP),
}
_A64_DIRECT = {"b": F_JUMP, "bl": F_CALL, "cbz": F_COND, "cbnz": F_COND, "tbz": F_COND, "tbnz": F_COND}


def a64_flow(m: str, tgt: int) -> Flow:
    """AArch64."""
    kind = _A64_DIRECT.get(m)
    if kind is None and m.startswith("b."):
        kind = F_COND
    if kind is not None:
        return kind, tgt
    return _A64_INDIRECT.get(m, F_NEXT), -1


def mips_flow(m: str, text: str, a: int, tgt: int) -> Flow:
    """MIPS (`bal` to the next-but-one instruction reads the PC: crt1's `__start`, PIC code)."""
    if m in ("j", "b"):
        return F_JUMP, tgt
    if m in ("jal", "bal", "jalx"):
        return (F_NEXT, -1) if m == "bal" and tgt == a + 8 else (F_CALL, tgt)
    if m in ("jr", "jr.hb", "jrc"):
        return (F_RET if text.strip() in ("$ra", "ra") else F_IJUMP), -1
    if m in ("jalr", "jalr.hb", "jalrc"):
        return F_ICALL, -1
    if (m.startswith("b") or m.startswith("j")) and tgt != -1:
        return F_COND, tgt
    if m in ("break", "sdbbp"):
        return F_STOP, -1
    return F_NEXT, -1


def ppc_flow(m: str, a: int, tgt: int, global_entry: Callable[[int], int]) -> Flow:
    """PowerPC (`bl 1f; 1: mflr rP` reads the PC: clang's PIC base, no call); `global_entry` moves
    a PPC64 ELFv2 call to a local entry to its function's global entry."""
    if m == "b" or m == "ba":
        return F_JUMP, global_entry(tgt)
    if m in ("bl", "bla"):
        return (F_NEXT, -1) if tgt == a + 4 else (F_CALL, global_entry(tgt))
    if m == "blr":
        return F_RET, -1
    if m == "bctr":
        return F_IJUMP, -1
    if m == "bctrl":
        return F_ICALL, -1
    if m == "trap":
        return F_STOP, -1
    if m.startswith("b") and tgt != -1 and not m.endswith("l"):
        return F_COND, tgt
    return F_NEXT, -1


def riscv_flow(m: str, text: str, tgt: int) -> Flow:
    """RISC-V (`m` without its `c.` prefix; `tgt` absolute)."""
    if m == "j":
        return F_JUMP, tgt
    if m == "jal":
        return F_CALL, tgt
    if m == "ret" or m in ("jr", "mret", "sret") and text.strip() in ("ra", "x1", ""):
        return F_RET, -1
    if m == "jr":
        return F_IJUMP, -1
    if m == "jalr":
        return F_ICALL, -1
    if m.startswith("b") and tgt != -1:
        return F_COND, tgt
    if m in ("ebreak", "unimp"):
        return F_STOP, -1
    return F_NEXT, -1


_ARM_CONDS = ("eq", "ne", "hs", "cs", "lo", "cc", "mi", "pl", "vs", "vc", "hi", "ls", "ge", "lt", "gt", "le")


def arm_base(m: str) -> tuple[str, bool]:
    """ARM32: a branch's mnemonic without its width (`.w`, `.n`) and condition suffixes, and whether
    it had a condition suffix (`beq.w` -> ("b", True); `bls` -> ("b", True); `bic` -> ("bic", False))."""
    base = m.split(".")[0]
    for suffix in _ARM_CONDS:
        if base.endswith(suffix) and base[: -len(suffix)] in ("b", "bl", "bx", "blx"):
            return base[: -len(suffix)], True
    return base, False


def arm_direct_flow(base: str, cond: bool, tgt: int) -> Flow | None:
    """ARM32 `b`, `cbz`/`cbnz`, and `bl`/`blx` to an address (`base` from `arm_base`; `cond`: the
    branch is conditional); None for any other instruction."""
    if base == "b":
        return (F_COND if cond else F_JUMP), tgt
    if base in ("cbz", "cbnz"):
        return F_COND, tgt
    if base in ("bl", "blx") and tgt != -1:
        return F_CALL, tgt
    return None


def last_number(text: str) -> int | None:
    """The last operand of `text` as a number (-1: it is no number); None when unsure."""
    last = text.rpartition(", ")[2].strip().removeprefix("#")
    if not last or last[0] not in "-0123456789":
        return -1
    try:
        v = int(last, 0)
    except ValueError:
        return None
    return v - (1 << 64) if v >= 1 << 63 else v  # (the operand is signed: -0x4e04 prints as 0xff...b1fc)


def text_flow(arch: str, global_entry: Callable[[int], int]) -> Callable[[str, str, int], Flow | None] | None:
    """For AArch64, ARM32, MIPS, PowerPC and RISC-V: (mnemonic, operand text, address) -> what
    `CapstoneBackend.classify` answers for that instruction, with the target read from the text
    (None when the text does not say it surely: the instruction is then decoded with details)."""

    target = last_number  # (the last operand: where capstone prints a branch's target)
    if arch == "aarch64":

        def a64(m: str, text: str, _a: int) -> Flow | None:
            if m in _A64_INDIRECT:
                return _A64_INDIRECT[m], -1
            tgt = target(text) if "#0x" in text else None  # (a register operand: not a direct branch)
            return None if tgt is None or tgt == -1 else a64_flow(m, tgt)

        return a64
    if arch == "mips":

        def mips(m: str, text: str, a: int) -> Flow | None:
            tgt = -1 if "(" in text.rpartition(", ")[2] else target(text)  # (a memory operand: no target)
            return None if tgt is None else mips_flow(m, text, a, tgt)

        return mips
    if arch == "ppc":

        def ppc(m: str, text: str, a: int) -> Flow | None:
            tgt = target(text)
            return None if tgt is None else ppc_flow(m, a, tgt, global_entry)

        return ppc
    if arch == "arm":  # (only outside an IT block: inside, the condition comes from the `it`)

        def arm(m: str, text: str, _a: int) -> Flow | None:
            base, cond = arm_base(m)
            if base not in ("b", "bl", "blx", "cbz", "cbnz") or not text.rpartition(", ")[2].startswith("#0x"):
                return None  # (`bx lr`, `blx r3`, `bic`, ...: decoded with details)
            tgt = target(text)  # (at 2**31 and above the operand is a negative number: decoded with details)
            return None if tgt is None or not 0 <= tgt < 1 << 31 else arm_direct_flow(base, cond, tgt)

        return arm
    if arch == "riscv":

        def riscv(m: str, text: str, a: int) -> Flow | None:
            tgt = target(text)
            return None if tgt is None else riscv_flow(m.removeprefix("c."), text, tgt + a if tgt != -1 else -1)

        return riscv
    return None
