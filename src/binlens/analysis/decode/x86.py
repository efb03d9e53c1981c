"""x86 and x86-64 decoding with iced-x86: chunks for the explorer, full instructions for listings.

Hot loop rules: one reused `Instruction`, integer comparisons, and per-instruction work only
where an operand can hold an address.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable

from binlens.analysis.codemap import BODY, CHUNK, INSN, CodeMap, CodeRegion
from binlens.analysis.decode import iced as ix
from binlens.analysis.decode.backend import Chunk
from binlens.analysis.decode.x86_pic import THUNK_REGS, PicState
from binlens.analysis.decode.x86_pic import step as pic_step
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
    XREF_KINDS,
    Instruction,
)
from binlens.analysis.native.kernels import native
from binlens.loader.image import Image

# the C scanner of plain code (`_x86scan.c`); without it every instruction takes the iced path
_x86scan = native("_x86scan", T_COND, T_JUMP, T_CALL, T_RET, T_FALL, T_BAD)
_c_scan = _x86scan.scan if _x86scan is not None else None

FC = ix.FlowControl
OK = ix.OpKind
MN = ix.Mnemonic
REG_NONE = ix.Register.NONE
_MEMORY = OK.MEMORY
_NEAR = {OK.NEAR_BRANCH16, OK.NEAR_BRANCH32, OK.NEAR_BRANCH64}
_IMM_ADDR = {OK.IMMEDIATE32, OK.IMMEDIATE32TO64, OK.IMMEDIATE64}
_NO_WRITE = {MN.CMP, MN.TEST, MN.PUSH, MN.BT, MN.UCOMISS, MN.UCOMISD, MN.COMISS, MN.COMISD, MN.PREFETCHNTA}
_STOP_MNEMONICS = {MN.INT3, MN.UD2, MN.UD0, MN.UD1, MN.HLT}
_HLT = MN.HLT  # (`hlt` has one code: `Code.HLT`)
_BODY = [bytes([BODY]) * n for n in range(16)]
_MARKS = [b""] + [bytes([INSN]) + bytes([BODY]) * (n - 1) for n in range(1, 16)]
_FC_NEXT, _FC_COND, _FC_JUMP, _FC_CALL = FC.NEXT, FC.CONDITIONAL_BRANCH, FC.UNCONDITIONAL_BRANCH, FC.CALL
_FC_RETURN, _FC_IJUMP, _FC_ICALL = FC.RETURN, FC.INDIRECT_BRANCH, FC.INDIRECT_CALL
_FC_EXCEPTION, _FC_INTERRUPT, _FC_XBEGIN = FC.EXCEPTION, FC.INTERRUPT, FC.XBEGIN_XABORT_XEND
_ZERO = [bytes(n) for n in range(16)]
K_READ, K_WRITE, K_OFFSET = XREF_KINDS.index("read"), XREF_KINDS.index("write"), XREF_KINDS.index("offset")
K_CALL, K_JUMP = XREF_KINDS.index("call"), XREF_KINDS.index("jump")
_FLOW_NAME = {
    FC.NEXT: "fallthrough",
    FC.UNCONDITIONAL_BRANCH: "jump",
    FC.CONDITIONAL_BRANCH: "conditional",
    FC.CALL: "call",
    FC.RETURN: "return",
    FC.INDIRECT_BRANCH: "indirect_jump",
    FC.INDIRECT_CALL: "indirect_call",
    FC.INTERRUPT: "fallthrough",
    FC.EXCEPTION: "stop",
    FC.XBEGIN_XABORT_XEND: "conditional",
}


class X86Backend:
    """Decodes chunks of x86/x86-64 code into the code map and collects data references."""

    def __init__(self, image: Image, codemap: CodeMap) -> None:
        self.image = image
        self.codemap = codemap
        self.bits = 64 if image.identity.bits == 64 else 32
        self.ptr_size = self.bits // 8
        self._decoders: dict[int, ix.Decoder] = {}
        self._ins = ix.Instruction()
        regions = image.regions
        self.lo = min((r.va for r in regions), default=0)
        # i386 position-independent ELF code keeps _GLOBAL_OFFSET_TABLE_ in ebx (the PLT ABI)
        secs = {s.name: s.va for s in image.sections}
        got_va = secs.get(".got.plt", secs.get(".got"))
        pic = image.identity.format == "ELF" and self.bits == 32 and image.identity.image_base == 0
        self.got = got_va if pic and got_va else 0
        self.gotreg = ix.Register.EBX if self.got else -1
        self.hi = max((r.va + r.vsize for r in regions), default=0)
        # data references: parallel arrays (src, dst, kind)
        self.x_src = array("Q")
        self.x_dst = array("Q")
        self.x_kind = bytearray()
        self._fmt: ix.Formatter | None = None
        self._last: tuple[CodeRegion, ix.Decoder] | None = None  # the region of the last chunk, and its decoder
        self._min_ref = min_ref = 0 if self.got else 4  # shorter instructions cannot hold an address operand
        # i386 PIC: `__x86.get_pc_thunk.REG` (`mov REG, [esp]; ret`) -> REG, and the return address
        # of each call to one -> REG, which holds that address there (then `add REG, GOT - here`)
        self._pc_thunks: dict[int, int] = _pc_thunks(image) if pic else {}
        self._pc_after: dict[int, PicState] = {}  # chunk start -> what holds a known address there
        self._pc_now: PicState | None = None  # that state in the chunk being decoded
        # Position-independent ELF code forms no address from an immediate or an absolute memory
        # operand (they are numbers: `mov edx, 0x10`, `fs:[0x28]`; at image base 0 they would name
        # the ELF header): only RIP-relative and GOT-relative operands reference data there
        position_independent = image.identity.format == "ELF" and image.identity.image_base == 0
        lo, hi = (0, 0) if position_independent else (self.lo, self.hi)
        self._ctx = (lo, hi, self.got, self.gotreg, min_ref, self.x_src, self.x_dst, self.x_kind, image.is_mapped)
        # the C scanner takes the plain part of every chunk, except in i386 PIC code, where
        # `_pc_chunk` follows the GOT register through calls
        self._scan = _c_scan if not pic else None
        self._scan_args = (self.bits, lo, hi, min_ref)
        # the explorer's first try at a new chunk: decoded whole in C, else False (this class decides)
        self.fast_chunk: Callable[[int], Chunk | bool | None] | None = None
        if self._scan is not None and _x86scan is not None:
            scanned = [(r.va, r.data, r.state) for r in codemap.regions]
            self.fast_chunk = _x86scan.Scanner(scanned, self.bits, lo, hi, min_ref, self._ref_at).chunk

    def _ref_at(self, va: int) -> None:
        """The scanner flagged the instruction at `va`: an operand may hold an address."""
        r = self.codemap.region(va)
        if r is not None:
            dec = self._decoder(r)
            dec.position = va - r.va
            dec.ip = va
            self._data_ref(dec.decode(), va)

    def _decoder(self, r: CodeRegion) -> ix.Decoder:
        d = self._decoders.get(r.va)
        if d is None:
            d = ix.Decoder(self.bits, r.data, ip=r.va)
            self._decoders[r.va] = d
        return d

    def decode_chunk(self, va: int) -> Chunk | None:
        """Decode straight-line code from `va`: (end, terminator, targets, address of last insn).

        The C scanner (`_x86scan.scan`) takes the plain instructions first and often the whole
        chunk; iced-x86 goes on from the first instruction it does not know. There, per
        instruction only the decode, its length and flow kind, and the start
        byte of the state map; operands are looked at only for instructions long enough to hold
        an address (>= 4 bytes; any length for i386 PIC `[ebx + x]`), `hlt` only when the last
        byte is f4. The state bytes under the chunk are checked once at the end with a C-speed
        count; when an instruction overlapped code decoded before, the exact path runs instead.
        """
        held = self._last
        if held is None or not held[0].va <= va < held[0].end:
            found = self.codemap.region(va)
            if found is None:
                return None
            held = self._last = (found, self._decoder(found))
        r, dec = held
        state = r.state
        off0 = off = va - r.va
        if self._pc_after and va in self._pc_after:
            return self._pc_chunk(va)
        if state[off]:
            return self._decode_chunk_exact(va)
        data = r.data
        nx = len(self.x_kind)  # the references recorded before this chunk (kept if it is redone)
        out = None
        if self._scan is not None:  # C decodes the plain instructions; iced goes on where it stops
            out = self._scan(data, state, off, va, *self._scan_args)
            if out is None:  # overlaps code decoded before
                return self._decode_chunk_exact(va)
            n = len(out)
            if n == 4:  # the chunk ended in C and the state map is written
                return out
            for o in out[1] if n == 2 else out[4]:  # an operand may hold an address: iced decodes it
                self._ref_at(r.va + o)
            if n == 2:
                return out[0]
        min_ref, x_src, x_dst, x_kind = self._min_ref, self.x_src, self.x_dst, self.x_kind
        data_ref, ending = self._data_ref, self._ending
        marks: list[bytes] = []
        add_mark = marks.append
        cur = last = va
        res: Chunk | None = None
        if out is not None:
            off, cur, last, span, _ = out
            add_mark(span)
        dec.position = off
        dec.ip = cur
        for ins in dec:  # iterating beats decode_out; stops at the region's end
            s = state[off]
            if s:
                res = (cur, T_BAD, (), last) if s == BODY else (cur, T_FALL, (cur,), last)
                break
            fc = ins.flow_control
            ln = ins.len
            if fc == _FC_EXCEPTION and ins.code == 0:
                res = (cur, T_BAD, (), last)
                break
            add_mark(_MARKS[ln])
            last = cur
            nxt = cur + ln
            if fc == _FC_NEXT:
                if ln >= min_ref:
                    data_ref(ins, cur)
                if data[off + ln - 1] == 0xF4 and ins.mnemonic == _HLT:
                    res = (nxt, T_STOP, (), last)
                    break
            else:
                res = ending(ins, fc, cur, nxt, last)
                if res is not None:
                    break
            cur = nxt
            off += ln
        if res is None:
            res = (cur, T_BAD, (), last)
        if marks:
            span = b"".join(marks)
            k = len(span)
            if state.count(0, off0, off0 + k) != k:
                # an instruction overlaps code decoded before: redo exactly, instruction by instruction
                del x_src[nx:], x_dst[nx:], x_kind[nx:]
                return self._decode_chunk_exact(va)
            state[off0 : off0 + k] = span
        state[off0] = CHUNK
        return res

    def decode_chunk_exact(self, va: int) -> Chunk | None:
        """What `decode_chunk` answers, always by the exact per-instruction path (its test oracle)."""
        return self._pc_chunk(va) if va in self._pc_after else self._decode_chunk_exact(va)

    def _pc_chunk(self, va: int) -> Chunk | None:
        """i386 PIC: decode the chunk at `va`, where registers or stack slots hold a known address
        (`x86_pic`), and pass what still holds one on to the chunks it flows to."""
        state = self._pc_now = self._pc_after[va].copy()
        try:
            res = self._decode_chunk_exact(va, state)
        finally:
            self._pc_now = None
        if res is None or not (state.regs or state.slots):
            return res
        _end, term, targets, _last = res
        if term in (T_COND, T_JUMP, T_FALL):
            for t in targets:
                if t not in self._pc_after:
                    self._pc_after[t] = state.copy()
        elif term == T_CALL and targets[-1] not in self._pc_after:
            self._pc_after[targets[-1]] = state.after_call()
        return res

    def _pc_record(self, cur: int, ins: ix.Instruction) -> Callable[[int], None]:
        def record(t: int) -> None:
            if self.image.is_mapped(t):
                m = ins.mnemonic
                kind = K_READ
                if m == MN.LEA:
                    kind = K_OFFSET
                elif ins.op0_kind == OK.MEMORY and m not in _NO_WRITE:
                    kind = K_WRITE
                self.x_src.append(cur)
                self.x_dst.append(t)
                self.x_kind.append(kind)

        return record

    def _decode_chunk_exact(self, va: int, pic: PicState | None = None) -> Chunk | None:
        """`decode_chunk` checking the state map under every instruction as it goes. `pic` (i386
        PIC) says which registers and slots hold a known address on entry (`x86_pic.step`)."""
        r = self.codemap.region(va)
        if r is None:
            return None
        state = r.state
        base = r.va
        off = va - base
        n = len(r.data)
        if state[off] == BODY:
            return None
        dec = self._decoder(r)
        dec.position = off
        dec.ip = va
        ins = self._ins
        data_ref, ending = self._data_ref, self._ending
        state[off] = CHUNK
        cur = va
        last = va
        first = True
        while True:
            if off >= n:
                return cur, T_BAD, (), last
            if not first:
                s = state[off]
                if s in (CHUNK, INSN):
                    return cur, T_FALL, (cur,), last
                if s == BODY:
                    return cur, T_BAD, (), last
            dec.decode_out(ins)
            ln = ins.len
            if ins.code == 0 or off + ln > n:
                return cur, T_BAD, (), last
            if ln > 1:
                if state[off + 1 : off + ln] != _ZERO[ln - 1]:
                    return cur, T_BAD, (), last
                state[off + 1 : off + ln] = _BODY[ln - 1]
            if not first:
                state[off] = INSN
            first = False
            last = cur
            nxt = cur + ln
            fc = ins.flow_control
            if pic is not None:
                pic_step(ins, pic, self._pc_record(cur, ins))
            if fc == FC.NEXT:
                data_ref(ins, cur)
                if ins.mnemonic == _HLT:
                    return nxt, T_STOP, (), last
            else:
                res = ending(ins, fc, cur, nxt, last)
                if res is not None:
                    return res
            cur = nxt
            off += ln

    def _data_ref(self, ins: ix.Instruction, cur: int) -> None:
        """Record the address a fall-through instruction at `cur` reads, writes or takes, if any."""
        lo, hi, got, gotreg, _min_ref, x_src, x_dst, x_kind, is_mapped = self._ctx
        t = 0
        if ins.is_ip_rel_memory_operand:
            t = ins.ip_rel_memory_address
        else:
            mb = ins.memory_base
            if mb == REG_NONE:
                d = ins.memory_displacement
                if lo <= d < hi and _MEMORY in (ins.op0_kind, ins.op1_kind, ins.op2_kind, ins.op3_kind):
                    t = d  # (iced keeps imm64's high half, or enter's 2nd immediate, there too)
            elif mb == gotreg and ins.memory_index == REG_NONE:
                t = (got + ins.memory_displacement) & 0xFFFFFFFF  # i386 PIC: [ebx + x] is GOT-relative
        if t:
            if is_mapped(t):
                m = ins.mnemonic
                x_src.append(cur)
                x_dst.append(t)
                if m == MN.LEA:
                    x_kind.append(K_OFFSET)
                elif ins.op0_kind == OK.MEMORY and m not in _NO_WRITE:
                    x_kind.append(K_WRITE)
                    if m == MN.MOV and ins.op1_kind in _IMM_ADDR:  # `mov [hook], offset handler`
                        v = ins.immediate(1)
                        if lo <= v < hi and is_mapped(v):
                            x_src.append(cur)
                            x_dst.append(v)
                            x_kind.append(K_OFFSET)
                else:
                    x_kind.append(K_READ)
            return
        k1 = ins.op1_kind
        if k1 in _IMM_ADDR:
            v = ins.immediate(1)
        elif ins.op0_kind in _IMM_ADDR:
            v = ins.immediate(0)
        else:
            return
        if lo <= v < hi and is_mapped(v):
            x_src.append(cur)
            x_dst.append(v)
            x_kind.append(K_OFFSET)

    def _ending(self, ins: ix.Instruction, fc: int, cur: int, nxt: int, last: int) -> Chunk | None:
        """How an instruction that is not plain fall-through ends its chunk; None when it does not."""
        if fc == _FC_COND:
            return nxt, T_COND, (ins.near_branch_target, nxt), last
        if fc == _FC_JUMP:
            if ins.op0_kind in _NEAR:
                return nxt, T_JUMP, (ins.near_branch_target,), last
            return nxt, T_STOP, (), last
        if fc == _FC_CALL:
            if ins.op0_kind not in _NEAR:
                return None
            tgt = ins.near_branch_target
            if self._pc_thunks and tgt in self._pc_thunks:  # the thunk's register holds `nxt` there
                state = self._pc_now.after_call() if self._pc_now is not None else PicState()
                state.regs[self._pc_thunks[tgt]] = nxt
                self._pc_after[nxt] = state
            return nxt, T_CALL, (tgt, nxt), last
        if fc == _FC_RETURN:
            return nxt, T_RET, (), last
        if fc in (_FC_IJUMP, _FC_ICALL):
            slot = self._slot(ins)
            if slot >= 0:
                self.x_src.append(cur)
                self.x_dst.append(slot)
                self.x_kind.append(K_JUMP if fc == _FC_IJUMP else K_CALL)
            return (nxt, T_IJUMP, (slot,), last) if fc == _FC_IJUMP else (nxt, T_ICALL, (slot, nxt), last)
        if fc == _FC_EXCEPTION or fc == _FC_INTERRUPT and ins.mnemonic in _STOP_MNEMONICS:
            return nxt, T_STOP, (), last
        if fc == _FC_XBEGIN and ins.op0_kind in _NEAR:
            return nxt, T_COND, (ins.near_branch_target, nxt), last
        return None

    def takes_address(self, va: int) -> bool:
        """Does the instruction at `va` take a code address the way code does to call it later:
        `lea`, or a `mov`/`push` of the immediate (not in position-independent ELF code, where an
        immediate cannot be an address: `cmp edx, 0x1c4f` there compares with a number)?"""
        found = self.raw_instructions(va, va + 15)
        if not found or found[0].ip != va:
            return False
        m = found[0].mnemonic
        if m == MN.LEA:
            return True
        pic = self.image.identity.format == "ELF" and self.image.identity.image_base == 0
        return not pic and m in (MN.MOV, MN.PUSH)

    def _slot(self, ins: ix.Instruction) -> int:
        """The constant memory address an indirect jump/call reads its target from, else -1."""
        if ins.op0_kind != OK.MEMORY:
            return -1
        if ins.is_ip_rel_memory_operand:
            return ins.ip_rel_memory_address
        if ins.memory_base == REG_NONE and ins.memory_index == REG_NONE:
            return ins.memory_displacement
        return -1

    # ---------------------------------------------------------------- full instructions
    def raw_instructions(self, start: int, end: int) -> list[ix.Instruction]:
        """iced instructions in [start, end) decoded linearly (for jump tables and listings)."""
        r = self.codemap.region(start)
        if r is None:
            data = self.image.read(start, max(0, end - start)) or b""
            base = start
        else:
            data, base = r.data, r.va
        stop = min(end, base + len(data))
        dec = ix.Decoder(self.bits, data[start - base : stop - base], ip=start)
        return list(dec)

    def epilogue_only(self, spans: list[tuple[int, int]]) -> bool:
        """Does the code in `spans` ((start, end) of decoded runs) give back stack it never took
        (`pop`, `leave`, `add rsp, N`) and take none (`push`, `sub rsp, N`, `enter`, `and rsp, N`)?
        Then it is the rest of a function after a call that does not return (`call luaL_error; add
        rsp, 0x20; pop rbx; ret`), not a function: an entry takes its frame before it gives it back."""
        frees = False
        sp = (ix.Register.RSP, ix.Register.ESP)
        for lo, hi in spans:
            for ins in self.raw_instructions(lo, hi):
                m = ins.mnemonic
                if m in _TAKES:
                    return False
                if m in _GIVES:
                    frees = True
                elif m in _SP_WRITES and ins.op0_kind == ix.OpKind.REGISTER and ins.op0_register in sp:
                    if m == ix.Mnemonic.ADD and ins.op1_kind not in _NOT_IMM and ins.immediate(1) > 0:
                        frees = True  # `add rsp, N`
                    elif m in (ix.Mnemonic.MOV, ix.Mnemonic.LEA):
                        frees = True  # `mov rsp, rbp`, `lea rsp, [rbp - N]`: the frame pointer's frame
                    else:
                        return False  # `sub rsp, N`, `and rsp, -16`, anything else: a frame taken
        return frees

    def formatter(self) -> ix.Formatter:
        """The Intel-syntax formatter of listings (`mov eax, [rbp - 0x14]`, lowercase 0x hex), made once."""
        if self._fmt is None:
            self._fmt = ix.Formatter(ix.FormatterSyntax.INTEL)
            self._fmt.rip_relative_addresses = False
            self._fmt.hex_prefix = "0x"
            self._fmt.hex_suffix = ""
            self._fmt.space_after_operand_separator = True
            self._fmt.uppercase_hex = False
            self._fmt.branch_leading_zeros = False
            self._fmt.show_branch_size = False
        return self._fmt

    def instructions(self, start: int, end: int) -> list[Instruction]:
        """The instruction model for [start, end)."""
        fmt = self.formatter()
        out = []
        lo, hi = self._ctx[0], self._ctx[1]  # (none in position-independent ELF code: numbers there)
        for ins in self.raw_instructions(start, end):
            if ins.code == 0:
                break
            fc = ins.flow_control
            flow = _FLOW_NAME.get(fc, "fallthrough")
            targets: tuple[int, ...] = ()
            if fc in (FC.CONDITIONAL_BRANCH, FC.UNCONDITIONAL_BRANCH, FC.CALL) and ins.op0_kind in _NEAR:
                targets = (ins.near_branch_target,)
            elif fc in (FC.UNCONDITIONAL_BRANCH, FC.CALL):
                flow = "indirect_jump" if fc == FC.UNCONDITIONAL_BRANCH else "fallthrough"
            if ins.mnemonic in _STOP_MNEMONICS:
                flow = "stop"
            refs = []
            if ins.is_ip_rel_memory_operand:
                refs.append(ins.ip_rel_memory_address)
            elif (
                fc == FC.NEXT
                and ins.memory_base == REG_NONE
                and OK.MEMORY in (ins.op0_kind, ins.op1_kind)
                and lo <= ins.memory_displacement < hi
            ):
                refs.append(ins.memory_displacement)
            for i in range(ins.op_count):
                if ins.op_kind(i) in _IMM_ADDR:
                    v = ins.immediate(i)
                    if lo <= v < hi and self.image.is_mapped(v):
                        refs.append(v)
            mnem = fmt.format_mnemonic(ins)
            ops = fmt.format_all_operands(ins)
            raw = self.image.read(ins.ip, ins.len) or b""
            out.append(Instruction(ins.ip, ins.len, raw, mnem, ops, flow, targets, tuple(refs)))
        return out


_TAKES = frozenset({ix.Mnemonic.PUSH, ix.Mnemonic.PUSHF, ix.Mnemonic.PUSHFQ, ix.Mnemonic.PUSHFD, ix.Mnemonic.ENTER})
_GIVES = frozenset({ix.Mnemonic.POP, ix.Mnemonic.POPF, ix.Mnemonic.POPFQ, ix.Mnemonic.POPFD, ix.Mnemonic.LEAVE})
# writes to the stack pointer: a frame taken (`sub`, `and` to align) or given back (`add`, `mov`, `lea`)
_NOT_IMM = (ix.OpKind.REGISTER, ix.OpKind.MEMORY)
_SP_WRITES = frozenset({ix.Mnemonic.SUB, ix.Mnemonic.ADD, ix.Mnemonic.AND, ix.Mnemonic.LEA, ix.Mnemonic.MOV})
_PC_THUNK = re.compile(rb"\x8b([\x04\x0c\x14\x1c\x2c\x34\x3c])\x24\xc3", re.S)  # mov REG, [esp]; ret


def _pc_thunks(image: Image) -> dict[int, int]:
    """i386: the `__x86.get_pc_thunk.REG` functions (`mov REG, [esp]; ret`) in code -> REG."""
    out: dict[int, int] = {}
    for s in image.sections:
        if s.kind != "code" or not s.fsize:
            continue
        data = image.data[s.offset : s.offset + s.fsize]
        for m in _PC_THUNK.finditer(data):
            out[s.va + m.start()] = THUNK_REGS[m.group(1)[0]]
    return out
