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
from collections.abc import Callable, Iterator
from typing import Literal

import capstone as cs
from capstone import arm as _ARM

from binlens.analysis.arch.profiles import profile
from binlens.analysis.codemap import BODY, CHUNK, INSN, CodeMap
from binlens.analysis.decode import branchflow, fastcs
from binlens.analysis.decode.addrpairs import PairRefs
from binlens.analysis.decode.backend import Chunk
from binlens.analysis.decode.branchflow import (
    F_CALL,
    F_CIJUMP,
    F_COND,
    F_ICALL,
    F_IJUMP,
    F_JUMP,
    F_NEXT,
    F_RET,
    F_STOP,
)
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
        isa = profile(self.arch)
        self.ptr_size = 8 if image.identity.bits == 64 else 4
        self.addr_mask = (1 << (8 * self.ptr_size)) - 1
        self.import_slots = frozenset(imp.slot for imp in image.imports)
        self._md: dict[bool, cs.Cs] = {}
        self.thumb: set[int] = set()
        # ARM32: the state each chunk was decoded in (True: Thumb), by chunk start. A later path
        # may name the other state for an address decoded before; a function's `mode` follows
        # the decoding, so listings show what the analysis decoded.
        self.decoded_thumb: dict[int, bool] = {}
        # ARM32: the addresses pc-relative loads read (literal pools: data between functions)
        self.literals: set[int] = set()
        # ARM32 code at a fixed address loads addresses from its literal pools; position-independent
        # code loads offsets there (`_literal`)
        self._absolute_literals = not (image.identity.format == "ELF" and image.identity.image_base == 0)
        self.x_src = array("Q")
        self.x_dst = array("Q")
        self.x_kind = bytearray()
        self.delay = isa.delay_slots  # instructions run after a branch before it (MIPS)
        self.thumb_bit = isa.thumb_bit  # bit 0 of a code address names Thumb state (ARM32)
        self.pairs = PairRefs(self) if self.arch in PairRefs.ARCHES else None
        self._may_flow = _may_flow_for(self.arch)
        self._text_flow = branchflow.text_flow(self.arch, self._global_entry)  # (branches without a detailed decode)
        self._lite: dict[bool, cs.Cs] = {}  # decoders without operand details, by ARM32 state

    def md(self, thumb: bool) -> cs.Cs:
        """The detailed decoder (operands on) for ARM32's Thumb state or, `thumb` false, every other code."""
        m = self._md.get(thumb)
        if m is None:
            arch, mode = _mode(self.image, thumb)
            m = cs.Cs(arch, mode)
            m.detail = True
            m.skipdata = False
            if fastcs.supported(arch):
                m = fastcs.FastCs(m)  # (the same decoding, ~40% less time per detailed instruction)
            self._md[thumb] = m
        return m

    def lite_md(self, thumb: bool) -> cs.Cs:
        """A decoder without operand details (for the straight runs of chunks)."""
        m = self._lite.get(thumb)
        if m is None:
            m = self._lite[thumb] = cs.Cs(*_mode(self.image, thumb))
            m.detail = False
        return m

    # ------------------------------------------------------------------ classification
    def classify(self, ins: cs.CsInsn) -> tuple[int, int]:
        """(flow kind, direct target or -1)."""
        flow, tgt = self._classify(ins)
        return flow, self._wrap(tgt)

    def _wrap(self, tgt: int) -> int:
        """A branch target in the address space: pc-relative arithmetic wraps at the address width
        (capstone gives ARM's targets as signed 32-bit numbers, so code at 2**31 and above, or a
        branch below address 0, came out negative; -1 stays: no target)."""
        return tgt & self.addr_mask if tgt < -1 or tgt > self.addr_mask else tgt

    def _classify(self, ins: cs.CsInsn) -> tuple[int, int]:
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
            return branchflow.a64_flow(m, tgt)
        if a == "arm":
            return self._classify_arm(ins, m, tgt)
        if a == "mips":
            return branchflow.mips_flow(m, ins.op_str, ins.address, tgt)
        if a == "ppc":
            return branchflow.ppc_flow(m, ins.address, tgt, self._global_entry)
        if a == "riscv":
            return branchflow.riscv_flow(m, ins.op_str, tgt)
        return F_NEXT, -1

    def _global_entry(self, tgt: int) -> int:
        """PPC64 ELFv2: a call or tail call to a function's local entry (past the global entry's
        `addis r2, r12, hi; addi r2, r2, lo`, which sets the TOC pointer) is one to the function."""
        if self.ptr_size != 8 or tgt < 8:
            return tgt
        words = self.image.read(tgt - 8, 8)
        if words is None or len(words) != 8:
            return tgt
        order: Literal["little", "big"] = "big" if self.image.identity.endian == "big" else "little"
        w1, w2 = int.from_bytes(words[:4], order), int.from_bytes(words[4:], order)
        return tgt - 8 if w1 >> 16 == 0x3C4C and w2 >> 16 == 0x3842 else tgt

    def _classify_arm(self, ins: cs.CsInsn, m: str, tgt: int) -> tuple[int, int]:
        base, suffixed = branchflow.arm_base(m)
        cond = suffixed or ins.cc not in (cs.arm.ARM_CC_AL, 0)
        ops = ins.op_str
        writes_pc = "pc" in ops.split(",")[0] if ops else False
        direct = branchflow.arm_direct_flow(base, cond, tgt)
        if direct is not None:
            return direct
        if base in ("bl", "blx"):
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
    def decode_chunk(self, va: int) -> Chunk | None:
        """Decode straight-line code from `va` (same contract as the x86 backend)."""
        if self.pairs is None:
            return self._decode_chunk(va, None)
        pairs = self.pairs
        carried = pairs.carry.pop(va, None) if pairs.carry else None
        formed: list[tuple[int, int]] = []
        out = self._decode_chunk(va, formed, carried is not None)
        if formed:
            insns = self._detailed(formed)
            after = pairs.evaluate(insns, carried)
            if pairs.gp is not None and out is not None and out[1] in (T_ICALL, T_IJUMP) and out[2][0] == -1:
                slot = pairs.stub_slot(va)
                if slot is not None and out[1] == T_ICALL:
                    # a MIPS import's stub calls the lazy resolver, which goes on to the import: for the
                    # analysis, a jump through the import's slot (it returns when the import does)
                    out = (out[0], T_IJUMP, (slot,), out[3])
                else:
                    out = pairs.got_call(out, insns)  # MIPS PIC `lw $t9, %call16(f)($gp); jalr $t9`
            if after and out is not None and out[1] in (T_CALL, T_ICALL) and out[2]:
                pairs.keep(out[2][-1], after)  # callee-saved registers keep their formed addresses
        return out

    def _detailed(self, insns: list[tuple[int, int]]) -> list[cs.CsInsn]:
        """The instructions (address, size) of one straight run, decoded again with their operands."""
        start = insns[0][0]
        end = insns[-1][0] + insns[-1][1]
        return list(self.md(False).disasm(self.image.read(start, end - start) or b"", start, len(insns)))

    def _decode_chunk(self, va: int, formed: list[tuple[int, int]] | None, whole: bool = False) -> Chunk | None:
        """`decode_chunk`; `formed` (when not None) collects (address, size) of the chunk's instructions
        from the first that begins an address pair on (from the first on when `whole`: the pair
        evaluation looks at them).

        The chunk is decoded without operand details (capstone's detail objects cost ~9x the
        decoding from Python); the instructions whose flow or address references need their
        operands (`_may_flow_for`, AArch64 `adrp` pairs) are decoded again, one by one, with them
        (inside a Thumb IT block, from its `it` instruction on: the condition comes from there)."""
        arm = self.arch == "arm"
        thumb = va in self.thumb or va & self.thumb_bit
        va &= ~self.thumb_bit
        r = self.codemap.region(va)
        if r is None:
            return None
        state = r.state
        off = va - r.va
        if state[off] == BODY:
            return None
        md = self.md(bool(thumb))
        if arm:
            self.decoded_thumb[va] = bool(thumb)
        state[off] = CHUNK
        cur = last = va
        first = True
        pending: tuple[int, int, tuple[int, ...]] | None = None
        slot_left = 0
        pages: dict[int, int] = {}  # AArch64: register -> the page an `adrp` put there
        paged: set[str] = set()  # the names of those registers
        a64 = self.arch == "aarch64"
        begins = self.pairs.begins if formed is not None and self.pairs is not None else None
        may_flow = self._may_flow
        text_flow = self._text_flow
        it_at = it_left = 0  # Thumb: where the last IT block began, and how many instructions it still covers
        lits: dict[str, int] = {}  # ARM32: register -> the literal word an `ldr rX, [pc, #imm]` put there
        data = r.data
        for a, n, m, text in _stream(self.lite_md(bool(thumb)), data, off, va):
            o = a - r.va
            if not first:
                s = state[o]
                if s in (CHUNK, INSN) and pending is None:  # (a delay slot may start another chunk)
                    return cur, T_FALL, (cur,), last
                if s == BODY:
                    return cur, T_BAD, (), last
                if s != CHUNK:  # (a delay slot that starts another chunk keeps that chunk's mark)
                    state[o] = INSN
            first = False
            state[o + 1 : o + n] = _BODY_RUNS[n]
            if begins is not None and formed is not None and (formed or whole or begins(m, text, a)):
                formed.append((a, n))
            last = a if pending is None else last
            nxt = a + n
            if pending is not None:
                slot_left -= 1
                if slot_left <= 0:
                    end, term, targets = pending
                    return nxt, term, tuple(nxt if x == -2 else x for x in targets), last
                continue
            ins = None
            known = None  # (flow, target) read from the text, as `classify` answers (`branchflow.text_flow`)
            if a64 and (m == "adrp" or m == "adr" or paged and _a64_paged(m, text, paged)):
                ins = _one(md, data, o, a)
                self._adrp_refs(ins, pages, paged)
            if ins is None and may_flow(m, text):
                if text_flow is not None and it_left <= 0:
                    known = text_flow(m, text, a)
                if known is None:
                    if it_left > 0:  # inside a Thumb IT block: its condition comes from the `it` before
                        *_, ins = md.disasm(data[it_at : o + n], a - (o - it_at))
                    else:
                        ins = _one(md, data, o, a)
            it_left -= 1
            if thumb and m[:2] == "it" and len(m) <= 5:  # it, itt, ite, ..., itete: 1 to 4 conditional
                it_at, it_left = o, len(m) - 1
            if known is not None:
                flow, tgt = known[0], self._wrap(known[1])
            elif ins is None:
                flow, tgt = F_NEXT, -1
                if arm and (m == "movw" or m == "movt"):
                    self._movw_movt(m, text, a, lits)
                elif lits and (not m.startswith(_NO_DEST) or m.startswith(_WRITES_B)):  # (the first operand is written)
                    lits.pop(text.split(",", 1)[0], None)
            else:
                flow, tgt = self.classify(ins)
                if arm:
                    if ins.id in _LITERAL_LOADS:
                        self._literal(ins, bool(thumb), lits)
                    elif lits:
                        self._pc_relative(ins, bool(thumb), lits)
            if flow == F_NEXT:
                cur = nxt
                continue
            if thumb:
                if flow == F_CALL and m.startswith("blx"):
                    pass  # switches to ARM state
                elif tgt != -1:
                    self.thumb.add(tgt)
                elif flow in (F_IJUMP, F_CIJUMP):
                    self.thumb.add(a)  # the jump-table resolver decodes its path in this mode
                if flow in (F_COND, F_CALL, F_ICALL, F_CIJUMP):
                    self.thumb.add(nxt + self.delay * 4)  # execution goes on there, still in Thumb state
            elif flow == F_CALL and tgt != -1 and arm and m.startswith("blx"):
                self.thumb.add(tgt)  # ARM state `blx #imm` always switches to Thumb
            term, targets = _TERMS[flow](tgt)
            if self.delay and flow not in (F_RET, F_STOP) or self.delay and flow == F_RET:
                pending = (nxt, term, targets)
                slot_left = self.delay
                last = a
                continue
            return nxt, term, tuple(nxt if x == -2 else x for x in targets), a
        return cur, T_BAD, (), last

    def _adrp_refs(self, ins: cs.CsInsn, pages: dict[int, int], paged: set[str]) -> None:
        m = ins.mnemonic
        ops = ins.operands
        if m == "adrp" and len(ops) == 2:
            pages[ops[0].reg] = ops[1].imm
            paged.add(ins.reg_name(ops[0].reg))
        elif m == "adr" and len(ops) == 2:
            self.ref(ins.address, ops[1].imm, K_OFFSET)
        elif m == "add" and len(ops) == 3 and ops[1].type == cs.CS_OP_REG and ops[2].type == cs.CS_OP_IMM:
            page = pages.get(ops[1].reg)
            if page is not None:
                self.ref(ins.address, page + ops[2].imm, K_OFFSET)
        elif m.startswith(("ldr", "str")) and len(ops) >= 2 and ops[-1].type == cs.CS_OP_MEM:
            page = pages.get(ops[-1].mem.base)
            if page is not None:
                self.ref(ins.address, page + ops[-1].mem.disp, K_READ)

    def _literal(self, ins: cs.CsInsn, thumb: bool, lits: dict[str, int]) -> None:
        """Note the words an ARM32 pc-relative load reads (`ldr rX, [pc, #imm]`, `ldrd`, `vldr`);
        for `ldr rX, [pc, #imm]`, keep the word in `lits` under rX's name (an address in code at a
        fixed address, which is referenced; in position-independent code an offset that an `add rX,
        pc` completes, `_pc_relative`)."""
        ops = ins.operands
        if not ops or ops[-1].type != _ARM.ARM_OP_MEM:
            return
        mem = ops[-1].mem
        if mem.base != _ARM.ARM_REG_PC or mem.index != 0:
            if mem.base == _ARM.ARM_REG_PC and lits:
                self._pc_relative(ins, thumb, lits)  # `ldr rY, [pc, rX]`: a GOT slot
            return
        at = ((ins.address + (4 if thumb else 8)) & ~3) + mem.disp
        n = 8 if ins.id in (_ARM.ARM_INS_LDRD, _ARM.ARM_INS_VLDR) else 4
        self.literals.update(range(at, at + n, 4))
        if ins.id != _ARM.ARM_INS_LDR or ops[0].type != _ARM.ARM_OP_REG:
            return
        word = self.image.read(at, 4)
        if word is None or len(word) != 4:
            return
        order: Literal["little", "big"] = "big" if self.image.identity.endian == "big" else "little"
        w = int.from_bytes(word, order)
        lits[ins.reg_name(ops[0].reg)] = w
        if self._absolute_literals and w > 0xFFFF:
            self.ref(ins.address, w & ~1 if self.codemap.contains(w & ~1) else w, K_OFFSET)

    def _movw_movt(self, m: str, text: str, a: int, lits: dict[str, int]) -> None:
        """ARM32 `movw rX, #lo; movt rX, #hi`: an address in code at a fixed address (referenced
        from the `movt`), an offset for `add rX, pc` in position-independent code (kept in `lits`)."""
        reg, _, imm = text.partition(", #")
        try:
            v = int(imm, 0) & 0xFFFF
        except ValueError:
            lits.pop(reg, None)
            return
        if m == "movw":
            lits[reg] = v
            return
        lo = lits.get(reg)
        if lo is None or lo > 0xFFFF:
            lits.pop(reg, None)
            return
        w = lits[reg] = lo | v << 16
        if self._absolute_literals and w > 0xFFFF:
            self.ref(a, w & ~1 if self.codemap.contains(w & ~1) else w, K_OFFSET)

    def _pc_relative(self, ins: cs.CsInsn, thumb: bool, lits: dict[str, int]) -> None:
        """ARM32 position-independent code: `add rX, pc` (Thumb; ARM `add rX, pc, rX`) turns the offset
        a literal put in rX into the address it is relative to (referenced from the `add`), and `ldr
        rY, [pc, rX]` reads the GOT slot at that address. Any other write of a register drops it."""
        ops = ins.operands
        pcv = ins.address + (4 if thumb else 8)
        if ins.id == _ARM.ARM_INS_ADD and all(op.type == _ARM.ARM_OP_REG for op in ops) and len(ops) in (2, 3):
            srcs = [op.reg for op in ops[1:]] if len(ops) == 3 else [ops[0].reg, ops[1].reg]
            if _ARM.ARM_REG_PC in srcs:
                other = next((r for r in srcs if r != _ARM.ARM_REG_PC), None)
                w = lits.get(ins.reg_name(other)) if other is not None else None
                if w is not None:
                    self.ref(ins.address, (w + pcv) & 0xFFFFFFFF, K_OFFSET)
        elif ins.id == _ARM.ARM_INS_LDR and ops and ops[-1].type == _ARM.ARM_OP_MEM:
            mem = ops[-1].mem
            if mem.base == _ARM.ARM_REG_PC and mem.index and not ops[-1].shift.type:
                w = lits.get(ins.reg_name(mem.index))
                if w is not None:
                    self.ref(ins.address, (w + pcv) & 0xFFFFFFFF, K_READ)
        if ops and ops[0].type == _ARM.ARM_OP_REG:
            lits.pop(ins.reg_name(ops[0].reg), None)

    def ref(self, src: int, dst: int, kind: int) -> None:
        """Record a reference of `kind` (a `model.XREF_KINDS` code) from the instruction at `src` to
        `dst`, when `dst` is mapped."""
        if self.image.is_mapped(dst):
            self.x_src.append(src)
            self.x_dst.append(dst)
            self.x_kind.append(kind)

    # ------------------------------------------------------------------ listings
    def instructions(self, start: int, end: int) -> list[Instruction]:
        """The instruction model for [start, end)."""
        thumb = start in self.thumb or bool(start & self.thumb_bit)
        start &= ~self.thumb_bit
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


_BODY_RUNS = [bytes([BODY]) * max(0, n - 1) for n in range(17)]
# ARM32 mnemonics whose first operand is not written (stores, compares, stack and flow)
_NO_DEST = ("str", "stm", "cmp", "cmn", "tst", "teq", "push", "pop", "b", "it", "nop", "vst", "pld", "dmb", "dsb")
_WRITES_B = ("bic", "bfi", "bfc")  # (not branches)
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


_TERMS: dict[int, Callable[[int], tuple[int, tuple[int, ...]]]] = {
    F_JUMP: lambda t: (T_JUMP, (t,)) if t != -1 else (T_IJUMP, (-1,)),
    F_COND: lambda t: (T_COND, (t, -2)) if t != -1 else (T_FALL, (-2,)),
    F_CALL: lambda t: (T_CALL, (t, -2)) if t != -1 else (T_ICALL, (-1, -2)),
    F_RET: lambda t: (T_RET, ()),
    F_IJUMP: lambda t: (T_IJUMP, (-1,)),
    F_CIJUMP: lambda t: (T_IJUMP, (-1, -2)),
    F_ICALL: lambda t: (T_ICALL, (-1, -2)),
    F_STOP: lambda t: (T_STOP, ()),
}


# Instructions per `cs_disasm` call of `_stream`. capstone decodes and prints every instruction of the
# window, used or not, and a chunk is ~5 instructions: on AArch64, windows of 24 cost 6.6 µs per
# instruction used, windows of 8 3.9 µs (4, 6, 12, 16 and windows that double: no better than 8).
_WINDOW = 8


def _stream(md: cs.Cs, data: bytes, off: int, va: int) -> Iterator[tuple[int, int, str, str]]:
    """(address, size, mnemonic, operand text) of the instructions from `off` on, decoded in small
    windows (capstone decodes a whole buffer at once; no instruction here is over 4 bytes)."""
    while off < len(data):
        n = 0
        for t in md.disasm_lite(data[off : off + 4 * _WINDOW], va, _WINDOW):
            n += t[1]
            yield t
        if n == 0:
            return
        off += n
        va += n


def _one(md: cs.Cs, data: bytes, off: int, va: int) -> cs.CsInsn:
    """The instruction at `off`, decoded with its operands."""
    return next(md.disasm(data[off : off + 4], va, 1))


def _a64_paged(m: str, text: str, paged: set[str]) -> bool:
    """Can this `add` or load/store use a register an `adrp` set (`paged`)? From the operand text:
    the second operand of `add`, the base register of a memory operand."""
    if m == "add":
        parts = text.split(", ", 2)
        return len(parts) == 3 and parts[1] in paged
    if not m.startswith(("ldr", "str")):
        return False
    i = text.find("[")
    if i < 0:
        return False
    j = text.find(",", i)
    k = text.find("]", i)
    return text[i + 1 : (j if 0 <= j < k else k)] in paged


def _may_flow_for(arch: str) -> Callable[[str, str], bool]:
    """A test on the mnemonic and operand text alone: may `classify` call this instruction anything
    but F_NEXT (or, on ARM32, is it a pc-relative load of a literal)?"""
    if arch == "aarch64":
        names = frozenset(
            ("b", "bl", "br", "braa", "brab", "braaz", "brabz", "blr", "blraa", "blrab", "blraaz", "blrabz")
            + ("ret", "retaa", "retab", "eret", "brk", "udf", "hlt", "cbz", "cbnz", "tbz", "tbnz")
        )
        return lambda m, _text: m in names or m.startswith("b.")
    if arch == "arm":  # branches, compare-and-branch, table branches, traps, and whatever names pc
        return lambda m, text: m.startswith(("b", "cb", "tb", "udf", "bkpt", "trap")) or "pc" in text
    if arch == "mips":
        return lambda m, _text: m[:1] in ("b", "j") or m == "sdbbp"
    if arch == "ppc":
        return lambda m, _text: m[:1] == "b" or m == "trap"
    if arch == "riscv":
        rv = frozenset(("ret", "mret", "sret", "ebreak", "unimp"))
        return lambda m, _text: m[:1] in ("b", "j") or m.startswith(("c.b", "c.j")) or m.removeprefix("c.") in rv
    return lambda _m, _text: True
