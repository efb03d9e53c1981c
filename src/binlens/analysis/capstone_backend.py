"""AArch64, ARM/Thumb, MIPS, PowerPC and RISC-V decoding with capstone.

Flow is classified from the mnemonic per architecture (capstone's groups are uneven across
them). MIPS branches keep their delay slot in the same chunk. AArch64 `adrp` + `add`/`ldr`
pairs give data references; on RISC-V, PowerPC and MIPS the address an instruction pair forms
inside one chunk (`auipc`/`lui` + `addi`, `lis`/`addis` + `addi`, `lui` or a `$gp` GOT load +
`addiu`, and loads and stores based on such a high part) is found by the jump-table resolvers'
forward evaluation (`PairRefs`) and recorded as a reference of the instruction that completes it.
"""

from __future__ import annotations

from array import array

import capstone as cs
from capstone import arm as _ARM

from binlens.analysis.addrpairs import PairRefs
from binlens.analysis.codemap import BODY, CHUNK, INSN, CodeMap
from binlens.analysis.model import (
    T_BAD,
    T_CALL,
    T_COND,
    T_FALL,
    T_ICALL,
    T_IJUMP,
    T_JUMP,
    T_RET,
    T_STOP,
    TERM_NAMES,
    XREF_KINDS,
    Instruction,
)
from binlens.loader.image import Image

F_NEXT, F_JUMP, F_COND, F_CALL, F_RET, F_IJUMP, F_ICALL, F_STOP = range(8)
# a conditional indirect jump (ARM `addls pc, pc, rI, lsl #2`, `ldrls pc, [pc, rI, lsl #2]`): the
# chunk ends there, and the path where the condition fails falls through
F_CIJUMP = 8
_FLOW_NAMES = (*TERM_NAMES[:8], "indirect_jump")  # F_NEXT .. F_STOP name like T_FALL .. T_STOP; then F_CIJUMP
K_READ, K_WRITE, K_OFFSET = XREF_KINDS.index("read"), XREF_KINDS.index("write"), XREF_KINDS.index("offset")


def _mode(image: Image, thumb: bool = False) -> tuple[int, int]:
    i = image.identity
    # instructions' byte order: ARM BE8 images keep big-endian data but little-endian code
    big = cs.CS_MODE_BIG_ENDIAN if image.code_endian == "big" else 0
    if i.arch == "aarch64":
        return cs.CS_ARCH_ARM64, cs.CS_MODE_ARM | big
    if i.arch == "arm":
        return cs.CS_ARCH_ARM, (cs.CS_MODE_THUMB if thumb else cs.CS_MODE_ARM) | big
    if i.arch == "mips":
        return cs.CS_ARCH_MIPS, (cs.CS_MODE_MIPS64 if i.bits == 64 else cs.CS_MODE_MIPS32) | big
    if i.arch == "ppc":
        return cs.CS_ARCH_PPC, (cs.CS_MODE_64 if i.bits == 64 else cs.CS_MODE_32) | big
    if i.arch == "riscv":
        return cs.CS_ARCH_RISCV, (cs.CS_MODE_RISCV64 if i.bits == 64 else cs.CS_MODE_RISCV32) | cs.CS_MODE_RISCVC
    raise ValueError(f"no disassembler for {i.arch}")


def supported(image: Image) -> bool:
    """Can this backend decode the image's architecture?"""
    try:
        _mode(image)
    except ValueError:
        return False
    return True


class CapstoneBackend:
    """Decodes chunks for the explorer on non-x86 architectures."""

    def __init__(self, image: Image, codemap: CodeMap) -> None:
        self.image = image
        self.codemap = codemap
        self.arch = image.identity.arch
        self.ptr_size = 8 if image.identity.bits == 64 else 4
        self._md: dict[bool, cs.Cs] = {}
        self.thumb: set[int] = set()
        # ARM32: the state each chunk was decoded in (True: Thumb), by chunk start. A later path
        # may name the other state for an address decoded before; a function's `mode` follows
        # the decoding, so listings show what the analysis decoded.
        self.decoded_thumb: dict[int, bool] = {}
        # ARM32: the addresses pc-relative loads read (literal pools: data between functions)
        self.literals: set[int] = set()
        self.x_src = array("Q")
        self.x_dst = array("Q")
        self.x_kind = bytearray()
        self.delay = 1 if self.arch == "mips" else 0
        self.pairs = PairRefs(self) if self.arch in PairRefs.ARCHES else None

    def md(self, thumb: bool) -> cs.Cs:
        m = self._md.get(thumb)
        if m is None:
            arch, mode = _mode(self.image, thumb)
            m = cs.Cs(arch, mode)
            m.detail = True
            m.skipdata = False
            self._md[thumb] = m
        return m

    # ------------------------------------------------------------------ classification
    def classify(self, ins: cs.CsInsn) -> tuple[int, int]:
        """(flow kind, direct target or -1)."""
        m = ins.mnemonic
        a = self.arch
        tgt = -1
        for op in ins.operands:
            if op.type == cs.CS_OP_IMM:
                tgt = op.imm
        if a == "riscv" and tgt != -1:
            tgt = ins.address + tgt
        m = m.removeprefix("c.")
        if a == "aarch64":
            if m in ("b",):
                return F_JUMP, tgt
            if m.startswith("b.") or m in ("cbz", "cbnz", "tbz", "tbnz"):
                return F_COND, tgt
            if m == "bl":
                return F_CALL, tgt
            if m in ("br", "braa", "brab", "braaz", "brabz"):
                return F_IJUMP, -1
            if m in ("blr", "blraa", "blrab", "blraaz", "blrabz"):
                return F_ICALL, -1
            if m in ("ret", "retaa", "retab", "eret"):
                return F_RET, -1
            if m in ("brk", "udf", "hlt"):
                return F_STOP, -1
            return F_NEXT, -1
        if a == "arm":
            return self._classify_arm(ins, m, tgt)
        if a == "mips":
            if m in ("j", "b"):
                return F_JUMP, tgt
            if m in ("jal", "bal", "jalx"):
                return F_CALL, tgt
            if m in ("jr", "jr.hb", "jrc"):
                return (F_RET if ins.op_str.strip() in ("$ra", "ra") else F_IJUMP), -1
            if m in ("jalr", "jalr.hb", "jalrc"):
                return F_ICALL, -1
            if (m.startswith("b") or m.startswith("j")) and tgt != -1:
                return F_COND, tgt
            if m in ("break", "sdbbp"):
                return F_STOP, -1
            return F_NEXT, -1
        if a == "ppc":
            if m == "b" or m == "ba":
                return F_JUMP, tgt
            if m in ("bl", "bla"):
                # `bl 1f; 1: mflr rP` reads the PC (clang's PIC base): not a call
                return (F_NEXT, -1) if tgt == ins.address + 4 else (F_CALL, tgt)
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
        if a == "riscv":
            if m == "j":
                return F_JUMP, tgt
            if m == "jal":
                return F_CALL, tgt
            if m == "ret" or m in ("jr", "mret", "sret") and ins.op_str.strip() in ("ra", "x1", ""):
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
        return F_NEXT, -1

    def _classify_arm(self, ins: cs.CsInsn, m: str, tgt: int) -> tuple[int, int]:
        cond = ins.cc not in (cs.arm.ARM_CC_AL, 0)
        ops = ins.op_str
        base = m.split(".")[0]
        for suffix in ("eq", "ne", "hs", "cs", "lo", "cc", "mi", "pl", "vs", "vc", "hi", "ls", "ge", "lt", "gt", "le"):
            if base.endswith(suffix) and base[: -len(suffix)] in ("b", "bl", "bx", "blx"):
                base = base[: -len(suffix)]
                cond = True
                break
        writes_pc = "pc" in ops.split(",")[0] if ops else False
        if base == "b":
            return (F_COND if cond else F_JUMP), tgt
        if base in ("cbz", "cbnz"):
            return F_COND, tgt
        if base in ("bl", "blx"):
            if tgt != -1:
                return F_CALL, tgt
            return F_ICALL, -1
        if base == "bx":
            if cond:
                return F_NEXT, -1
            return (F_RET if ops.strip() == "lr" else F_IJUMP), -1
        if base in ("pop", "ldm", "ldmia", "ldmfd") and "pc" in ops:
            return (F_NEXT if cond else F_RET), -1
        if base in ("ldr", "mov") and writes_pc:
            if cond:
                return F_NEXT, -1
            return (F_RET if base == "mov" and ops.endswith("lr") else F_IJUMP), -1
        if base in ("udf", "bkpt", "trap"):
            return F_STOP, -1
        return _arm_table_jump(ins, cond), -1

    # ------------------------------------------------------------------ chunks
    def decode_chunk(self, va: int) -> tuple[int, int, tuple[int, ...], int] | None:
        """Decode straight-line code from `va` (same contract as the x86 backend)."""
        if self.pairs is None:
            return self._decode_chunk(va, None)
        pairs = self.pairs
        carried = pairs.carry.pop(va, None) if pairs.carry else None
        formed: list[cs.CsInsn] = []
        out = self._decode_chunk(va, formed, carried is not None)
        if formed:
            after = pairs.evaluate(formed, carried)
            if after and out is not None and out[1] in (T_CALL, T_ICALL) and out[2]:
                pairs.keep(out[2][-1], after)  # callee-saved registers keep their formed addresses
        return out

    def _decode_chunk(
        self, va: int, formed: list[cs.CsInsn] | None, whole: bool = False
    ) -> tuple[int, int, tuple[int, ...], int] | None:
        """`decode_chunk`; `formed` (when not None) collects the chunk's instructions from the first
        that begins an address pair on (from the first on when `whole`: the pair evaluation looks at them)."""
        thumb = va in self.thumb or (va & 1 and self.arch == "arm")
        va &= ~1 if self.arch == "arm" else ~0
        r = self.codemap.region(va)
        if r is None:
            return None
        state = r.state
        off = va - r.va
        if state[off] == BODY:
            return None
        md = self.md(bool(thumb))
        if self.arch == "arm":
            self.decoded_thumb[va] = bool(thumb)
        state[off] = CHUNK
        cur = last = va
        first = True
        pending: tuple[int, int, tuple[int, ...]] | None = None
        slot_left = 0
        pages: dict[int, int] = {}
        for ins in _stream(md, r.data, off, va):
            o = ins.address - r.va
            if not first:
                s = state[o]
                if s in (CHUNK, INSN) and pending is None:
                    return cur, T_FALL, (cur,), last
                if s == BODY:
                    return cur, T_BAD, (), last
                state[o] = INSN
            first = False
            n = ins.size
            state[o + 1 : o + n] = bytes([BODY]) * (n - 1)
            if formed is not None and (formed or whole or self.pairs.begins(ins)):  # type: ignore[union-attr]
                formed.append(ins)
            last = ins.address if pending is None else last
            nxt = ins.address + n
            if pending is not None:
                slot_left -= 1
                if slot_left <= 0:
                    end, term, targets = pending
                    return nxt, term, tuple(nxt if x == -2 else x for x in targets), last
                continue
            flow, tgt = self.classify(ins)
            if self.arch == "aarch64":
                self._adrp_refs(ins, pages)
            elif self.arch == "arm" and ins.id in _LITERAL_LOADS:
                self._literal(ins, bool(thumb))
            if flow == F_NEXT:
                cur = nxt
                continue
            if thumb:
                if flow == F_CALL and ins.mnemonic.startswith("blx"):
                    pass  # switches to ARM state
                elif tgt != -1:
                    self.thumb.add(tgt)
                elif flow in (F_IJUMP, F_CIJUMP):
                    self.thumb.add(ins.address)  # the jump-table resolver decodes its path in this mode
                if flow in (F_COND, F_CALL, F_ICALL, F_CIJUMP):
                    self.thumb.add(nxt + self.delay * 4)  # execution goes on there, still in Thumb state
            elif flow == F_CALL and tgt != -1 and self.arch == "arm" and ins.mnemonic.startswith("blx"):
                self.thumb.add(tgt)  # ARM state `blx #imm` always switches to Thumb
            term, targets = _TERMS[flow](tgt)
            if self.delay and flow not in (F_RET, F_STOP) or self.delay and flow == F_RET:
                pending = (nxt, term, targets)
                slot_left = self.delay
                last = ins.address
                continue
            return nxt, term, tuple(nxt if x == -2 else x for x in targets), ins.address
        return cur, T_BAD, (), last

    def _adrp_refs(self, ins: cs.CsInsn, pages: dict[int, int]) -> None:
        m = ins.mnemonic
        ops = ins.operands
        if m == "adrp" and len(ops) == 2:
            pages[ops[0].reg] = ops[1].imm
        elif m == "adr" and len(ops) == 2:
            self._ref(ins.address, ops[1].imm, K_OFFSET)
        elif m == "add" and len(ops) == 3 and ops[1].type == cs.CS_OP_REG and ops[2].type == cs.CS_OP_IMM:
            page = pages.get(ops[1].reg)
            if page is not None:
                self._ref(ins.address, page + ops[2].imm, K_OFFSET)
        elif m.startswith(("ldr", "str")) and len(ops) >= 2 and ops[-1].type == cs.CS_OP_MEM:
            page = pages.get(ops[-1].mem.base)
            if page is not None:
                self._ref(ins.address, page + ops[-1].mem.disp, K_READ)

    def _literal(self, ins: cs.CsInsn, thumb: bool) -> None:
        """Note the words an ARM32 pc-relative load reads (`ldr rX, [pc, #imm]`, `ldrd`, `vldr`)."""
        ops = ins.operands
        if not ops or ops[-1].type != _ARM.ARM_OP_MEM:
            return
        mem = ops[-1].mem
        if mem.base != _ARM.ARM_REG_PC or mem.index != 0:
            return
        at = ((ins.address + (4 if thumb else 8)) & ~3) + mem.disp
        n = 8 if ins.id in (_ARM.ARM_INS_LDRD, _ARM.ARM_INS_VLDR) else 4
        self.literals.update(range(at, at + n, 4))

    def _ref(self, src: int, dst: int, kind: int) -> None:
        if self.image.is_mapped(dst):
            self.x_src.append(src)
            self.x_dst.append(dst)
            self.x_kind.append(kind)

    # ------------------------------------------------------------------ listings
    def instructions(self, start: int, end: int) -> list[Instruction]:
        """The instruction model for [start, end)."""
        thumb = start in self.thumb or bool(start & 1 and self.arch == "arm")
        start &= ~1 if self.arch == "arm" else ~0
        data = self.image.read(start, max(0, end - start)) or b""
        out = []
        for ins in self.md(thumb).disasm(data, start):
            flow, tgt = self.classify(ins)
            targets = (tgt,) if tgt != -1 and flow in (F_JUMP, F_COND, F_CALL) else ()
            out.append(
                Instruction(
                    ins.address, ins.size, bytes(ins.bytes), ins.mnemonic, ins.op_str, _FLOW_NAMES[flow], targets
                )
            )
        return out


_LITERAL_LOADS = frozenset(
    (_ARM.ARM_INS_LDR, _ARM.ARM_INS_LDRD, _ARM.ARM_INS_VLDR, _ARM.ARM_INS_LDRH, _ARM.ARM_INS_LDRB, _ARM.ARM_INS_LDRSH)
)


def _arm_table_jump(ins: cs.CsInsn, cond: bool) -> int:
    """F_IJUMP/F_CIJUMP for the ARM and Thumb-2 switch dispatches the mnemonic rules above miss:
    `tbb`/`tbh`, `add pc, rT, rE` and the conditional `addls pc, pc, rI, lsl #2` and
    `ldrls pc, [rT, rI, lsl #2]` (the next instruction is then the default); F_NEXT otherwise."""
    i = ins.id
    if i in (_ARM.ARM_INS_TBB, _ARM.ARM_INS_TBH):
        return F_CIJUMP if cond else F_IJUMP
    ops = ins.operands
    if i not in (_ARM.ARM_INS_ADD, _ARM.ARM_INS_LDR) or len(ops) < 2:
        return F_NEXT
    if ops[0].type != _ARM.ARM_OP_REG or ops[0].reg != _ARM.ARM_REG_PC:
        return F_NEXT
    last = ops[-1]
    if i == _ARM.ARM_INS_ADD:
        if not cond:
            return F_IJUMP  # clang's `add pc, rT, rE` (ldr and mov to pc are handled above)
        indexed = len(ops) == 3 and ops[1].reg == _ARM.ARM_REG_PC and last.type == _ARM.ARM_OP_REG
    else:
        indexed = last.type == _ARM.ARM_OP_MEM and last.mem.index != 0
    return F_CIJUMP if cond and indexed else F_NEXT


_TERMS = {
    F_JUMP: lambda t: (T_JUMP, (t,)) if t != -1 else (T_IJUMP, (-1,)),
    F_COND: lambda t: (T_COND, (t, -2)) if t != -1 else (T_FALL, (-2,)),
    F_CALL: lambda t: (T_CALL, (t, -2)) if t != -1 else (T_ICALL, (-1, -2)),
    F_RET: lambda t: (T_RET, ()),
    F_IJUMP: lambda t: (T_IJUMP, (-1,)),
    F_CIJUMP: lambda t: (T_IJUMP, (-1, -2)),
    F_ICALL: lambda t: (T_ICALL, (-1, -2)),
    F_STOP: lambda t: (T_STOP, ()),
}


def _stream(md: cs.Cs, data: bytes, off: int, va: int):  # noqa: ANN201 - a generator of CsInsn
    """Instructions from `off` on, decoded in small windows (capstone decodes a whole buffer at once)."""
    while off < len(data):
        n = 0
        for ins in md.disasm(data[off : off + 256], va, 24):
            n += ins.size
            yield ins
        if n == 0:
            return
        off += n
        va += n
