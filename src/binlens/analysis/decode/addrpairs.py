"""Addresses formed by instruction pairs on RISC-V, PowerPC and MIPS (`PairRefs`), for the capstone
backend: `auipc`/`lui` + `addi`, `lis`/`addis` + `addi`, `lui` or a `$gp` GOT load + `addiu`, and
loads and stores based on such a high part, found with the jump-table resolvers' forward evaluation
and recorded as references of the instruction that completes them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol

import capstone as cs

from binlens.analysis.model import T_CALL, T_ICALL, T_JUMP, XREF_KINDS

if TYPE_CHECKING:
    from binlens.analysis.decode.backend import Chunk
    from binlens.analysis.decode.capstone_backend import CapstoneBackend
    from binlens.analysis.switches.symbolic import RelocMap

K_READ, K_WRITE, K_OFFSET = XREF_KINDS.index("read"), XREF_KINDS.index("write"), XREF_KINDS.index("offset")
K_CALL, K_JUMP = XREF_KINDS.index("call"), XREF_KINDS.index("jump")


# what an instruction does with an address pair: begins it, adds the low part, loads or stores through it
_HI, _ADD, _LOAD, _STORE = range(4)
Shape = tuple[int, str, str, int]  # (what, destination register, base register, immediate or displacement)
Value = tuple  # a symbolic value of the resolvers' states: ("c", k) is the constant k
Regs = dict[str, Value]  # register -> value


class PairState(Protocol):
    """What `PairRefs` asks of a jump-table resolver's symbolic state (`RvState`, `PpcState`, `MipsState`)."""

    regs: Regs
    mask: int

    def step(self, ins: cs.CsInsn, next_va: int) -> None:
        """Evaluate `ins`; `next_va` is the address executed after it on this path."""
        ...


class PairRefs:
    """Addresses formed by instruction pairs within one chunk on RISC-V, PowerPC and MIPS.

    The chunk's instructions from the first high part on are evaluated with the jump-table
    resolver's symbolic state of the architecture (`switches.riscv.RvState`,
    `switches.ppc.PpcState`, `switches.mips.MipsState`: register moves, constant loads from the
    GOT, calls that clobber registers, MIPS delay slots). A constant counts as a formed high part when an `auipc`/
    `lui`/`lis`/`addis` produced it, when it was loaded through a formed address (a GOT slot: MIPS
    PIC `lw $t, %got(page)($gp)`, RISC-V `auipc; ld`), or it is MIPS `_gp` or the PPC64 TOC pointer.
    An add of an immediate to a formed high part records the sum as an `offset` reference of that
    instruction (the `code_offsets` heuristic takes it when it lands in code; an address at a
    string's start becomes a `string` reference); a load or store based on one records a `read` or
    `write` of the address it accesses."""

    ARCHES = ("riscv", "ppc", "mips")

    def __init__(self, backend: CapstoneBackend) -> None:
        self.backend = backend
        image = backend.image
        self.seeds: set[int] = set()  # constants that are formed addresses before any instruction
        self.relocs: RelocMap | None = None  # the eval states' relocation map, built once
        # return address -> callee-saved registers holding formed addresses there (gcc keeps a section
        # anchor in `s0` across calls and adds each object's offset to it later)
        self.carry: dict[int, Regs] = {}
        # `lui`/`lis` make an address only in code at a fixed address: in position-independent ELF
        # code `lui a5, 0x10; addi a5, a5, -256` is the number 0xff00 (the image's own code is there)
        self.fixed = not (image.identity.format == "ELF" and image.identity.image_base == 0)
        # words a relative relocation fills (GOT slots of local symbols): a pointer-sized load from
        # one through a formed address takes the address it holds (not on MIPS, whose local GOT
        # entries hold 64 KiB pages, completed by an `addiu`)
        self.slots: set[int] | None = None
        # MIPS: the chunks whose only pair parts are `$gp`-relative GOT loads (the calls through `$t9`)
        # skip the evaluation: their reads are recorded directly
        self.gp_reads: Callable[[list[cs.CsInsn]], Regs] | None = None
        self.gp: int | None = None  # MIPS: `_gp`, what `$gp` holds in PIC code
        self._stub_of: dict[int, int] | None = None
        self._slot_of: dict[int, int] | None = None
        # the sum of a low part: MIPS64 32-bit adds (`addiu`) sign-extend their result
        self.word32: Callable[[int], int] | None = None
        arch = backend.arch
        if arch != "mips":
            self.slots = {r.address for r in image.relocations if "RELATIVE" in r.type.upper()}
        self.new_state: Callable[[], PairState]
        self.shape: Callable[[cs.CsInsn], Shape | None]
        self.loads: dict[str, tuple[int, bool]] = {}
        self.stores: dict[str, int]
        if arch == "riscv":
            from binlens.analysis.switches import riscv as rv

            self.new_state = lambda: rv.RvState(image, self._relocs())
            self.shape = self._riscv
            self.loads, self.stores = rv.RV_LOADS, rv.RV_STORES
            self.rv_reg, self.rv_mem = rv.reg_name, rv.mem_operand
            self.saved = tuple(f"s{k}" for k in range(12))
        elif arch == "ppc":
            from binlens.analysis.switches import ppc as pp

            toc = _ppc64_toc(backend) if backend.ptr_size == 8 else None
            if toc is not None:
                self.seeds.add(toc)

            def new_ppc() -> PairState:
                state = pp.PpcState(image, self._relocs())
                if toc is not None:  # ELFv2: r2 holds the TOC pointer throughout the module's code
                    state.regs["r2"] = state.const(toc)
                    state.fixed.add("r2")
                return state

            self.new_state = new_ppc
            self.shape = self._ppc
            self.is_load, self.base_of = pp.PpcState.is_load, pp.ppc_base
            self.stores = pp.PPC_STORES
            self.saved = tuple(f"r{k}" for k in range(14, 32))
        else:
            from binlens.analysis.switches import mips as mp

            self.gp = gp = mp.gp_value(backend, image)
            if gp is not None:
                self.seeds.add(gp)
            bits = image.identity.bits
            self.new_state = lambda: mp.MipsState(backend.md(False), image, gp, bits)
            self.shape = self._mips
            self.mips_reg: Callable[[int], str] = functools.partial(mp.reg_name, backend.md(False))
            self.word32 = lambda v: mp.word(v, False, bits)
            self.loads = {**mp.LOADS, **(mp.LOADS_64 if bits == 64 else {})}
            self.stores = mp.STORES
            self.saved = (*(f"s{k}" for k in range(8)), "fp", "s8")
            # what makes a chunk need the evaluation: a low part, a load or store that is not a `$gp`
            # GOT load into a scratch register (whose address alone is recorded), a `lui`
            completes = frozenset({"addiu", "daddiu", "addi", "daddi", "lui", *self.loads, *self.stores})
            kept = tuple(f"${r}," for r in self.saved)
            # (loads and stores through the stack or frame pointer never complete a pair: -O0 code
            # reaches its locals that way, and such chunks skip the evaluation too)
            frame = ("($sp)", "($fp)")
            self.completes = lambda ins: (
                ins.mnemonic in completes
                and not (
                    ins.mnemonic in self.loads and ins.op_str.endswith("($gp)") and not ins.op_str.startswith(kept)
                )
                and not ins.op_str.endswith(frame)
            )
            if gp is not None:
                self.gp_reads = lambda insns: self._gp_reads(insns, gp)
        self.begins = self._begins_for(arch, backend.ptr_size == 8)

    @staticmethod
    def _begins_for(arch: str, wide: bool) -> Callable[[str, str, int], bool]:
        """A cheap test (mnemonic, operand text and address) for an instruction that may begin a pair."""
        if arch == "riscv":
            return lambda m, _text, _a: m in ("auipc", "lui", "c.lui")
        if arch == "ppc":
            if wide:  # TOC-relative: `addis rN, r2, hi`, or a TOC slot load `ld rN, off(r2)`
                return lambda m, text, _a: m in ("lis", "addis") or text.endswith("(r2)")
            # or a PIC base: `bcl 20,31,1f; 1: mflr r30` (capstone: `bdnzl` to the next instruction)
            return lambda m, text, a: m in ("lis", "addis") or (m.endswith("l") and text.endswith(f"0x{a + 4:x}"))
        return lambda m, text, _a: m == "lui" or text.endswith("($gp)")

    def _relocs(self) -> RelocMap:
        """The image's relocation map (`symbolic.reloc_map`), built once for every state."""
        if self.relocs is None:
            from binlens.analysis.switches.symbolic import reloc_map

            self.relocs = reloc_map(self.backend.image)
        return self.relocs

    def evaluate(self, insns: list[cs.CsInsn], carried: Regs | None = None) -> Regs:
        """Record the references of the pairs completed in `insns` (one chunk, from its first high
        part; from its start when `carried` gives registers holding formed addresses on entry).
        Returns the callee-saved registers holding formed addresses at its end."""
        if self.gp_reads is not None and not carried and not any(map(self.completes, insns)):
            return self.gp_reads(insns)  # MIPS PIC `lw $t9, %call16(f)($gp); jalr $t9`: no pair to follow
        state = self.new_state()
        regs = state.regs
        mask = state.mask
        formed = set(self.seeds)
        if carried:
            regs.update(carried)
            formed.update(v[1] for v in carried.values())
        ref = self.backend.ref
        last = len(insns) - 1
        for k, ins in enumerate(insns):
            nxt = insns[k + 1].address if k < last else ins.address + ins.size
            shape = self.shape(ins)
            if shape is None:
                state.step(ins, nxt)
                continue
            what, dst, base, imm = shape
            b = regs.get(base) if base else None
            through = b is not None and b[0] == "c" and b[1] in formed
            state.step(ins, nxt)
            if what == _HI and (through or not base):
                v = regs.get(dst)
                if v is not None and v[0] == "c":
                    formed.add(v[1])
            elif through and what != _HI and b is not None:
                addr = (self._sum(ins, b[1], imm) if what == _ADD else b[1] + imm) & mask
                if what == _ADD:
                    ref(ins.address, addr, K_OFFSET)
                    formed.add(addr)
                elif what == _LOAD:
                    ref(ins.address, addr, K_READ)
                    v = regs.get(dst)
                    if v is not None and v[0] == "c":
                        formed.add(v[1])  # a GOT slot's address: a base for the next low part
                        if self.slots is not None and addr in self.slots:
                            ref(ins.address, v[1], K_OFFSET)  # the address a relocated slot holds
                else:
                    ref(ins.address, addr, K_WRITE)
        kept = {}
        for r in self.saved:
            v = regs.get(r)
            if v is not None and v[0] == "c" and v[1] in formed:
                kept[r] = v
        return kept

    def keep(self, va: int, kept: Regs) -> None:
        """Registers holding formed addresses where execution goes on at `va` (after a call)."""
        self.carry[va] = kept

    def _gp_reads(self, insns: list[cs.CsInsn], gp: int) -> Regs:
        """Record the `read` of each `$gp`-relative load of `insns` ($gp is `_gp` in PIC code)."""
        mask = (1 << self.backend.image.identity.bits) - 1
        for ins in insns:
            if ins.mnemonic in self.loads and ins.op_str.endswith("($gp)"):
                self.backend.ref(ins.address, (gp + ins.operands[1].mem.disp) & mask, K_READ)
        return {}

    def got_call(self, out: Chunk, insns: list[cs.CsInsn]) -> Chunk:
        """MIPS: the chunk `out` ending in `jalr`/`jr` through a register that `insns` (the chunk's
        instructions from its first pair part on) loaded from a GOT entry (`lw $t9, %call16(f)($gp)`,
        then maybe `move`s and an `addiu` of a low part) made a call or jump: through the entry of
        an import, to its stub where that is a thunk, else through its slot (as x86 `call [slot]`);
        through any other entry, to the code address it holds (a global defined here, or a local
        entry's page plus the low part). Anything else leaves `out` as it is."""
        gp = self.gp
        at = out[3]
        k = next((i for i, ins in enumerate(insns) if ins.address == at), -1)
        if gp is None or k < 0 or not insns[k].operands or insns[k].operands[-1].type != cs.CS_OP_REG:
            return out
        reg = insns[k].operands[-1].reg
        low = 0
        slot = None
        for ins in reversed(insns[:k]):
            m, ops = ins.mnemonic, ins.operands
            # (capstone has no register access lists for MIPS: the destination is the first operand
            # but for stores, branches, traps and moves to other register files)
            if not ops or ops[0].type != cs.CS_OP_REG or ops[0].reg != reg or m in self.stores:
                continue
            if m.startswith(("b", "j", "t", "mt", "ct")):
                continue
            if m == "move" and len(ops) == 2:
                reg = ops[1].reg
            elif m in ("addiu", "daddiu") and len(ops) == 3 and ops[2].type == cs.CS_OP_IMM and not low:
                reg, low = ops[1].reg, ops[2].imm
            elif m in ("lw", "ld") and len(ops) == 2 and ins.reg_name(ops[1].mem.base) == "gp":
                slot = (gp + ops[1].mem.disp) & ((1 << self.backend.image.identity.bits) - 1)
                self.backend.ref(ins.address, slot, K_READ)  # (also where the chunk sets $gp itself)
                break
            else:
                return out
        if slot is None:
            return out
        backend = self.backend
        end, term, targets, last = out
        if not low and slot in backend.import_slots:
            stub = self._stubs().get(slot)
            if stub is None:
                backend.ref(at, slot, K_CALL if term == T_ICALL else K_JUMP)
                return (end, term, (slot, *targets[1:]), last)
            target = stub  # the import's thunk (its lazy-binding stub): callers of `exit` are found there
        else:
            image = backend.image
            word = image.read(slot, backend.ptr_size)
            if word is None or len(word) != backend.ptr_size:
                return out
            order: Literal["little", "big"] = "big" if image.identity.endian == "big" else "little"
            target = int.from_bytes(word, order) + low
            target &= (1 << image.identity.bits) - 1
            if not backend.codemap.contains(target):
                return out
        return (end, T_CALL, (target, *targets[1:]), last) if term == T_ICALL else (end, T_JUMP, (target,), last)

    def stub_slot(self, va: int) -> int | None:
        """MIPS: the import slot whose stub (a thunk) starts at `va`, if one does."""
        if self._slot_of is None:
            self._slot_of = {stub: slot for slot, stub in self._stubs().items()}
        return self._slot_of.get(va)

    def _stubs(self) -> dict[int, int]:
        """MIPS: import slot -> the import's stub, where that stub is a thunk (`thunks.mips_stubs`)."""
        if self._stub_of is None:
            from binlens.analysis.metadata.thunks import mips_stubs

            image = self.backend.image
            named = mips_stubs(image, self.backend.codemap)
            self._stub_of = {imp.slot: imp.stub for imp in image.imports if imp.stub in named}
        return self._stub_of

    def _sum(self, ins: cs.CsInsn, base: int, imm: int) -> int:
        """base + imm as the instruction computes it (MIPS64 32-bit adds sign-extend their result)."""
        if self.word32 is not None and not ins.mnemonic.startswith("d"):
            return self.word32(base + imm)
        return base + imm

    # ------------------------------------------------------------------ shapes per architecture
    def _riscv(self, ins: cs.CsInsn) -> Shape | None:
        m = ins.mnemonic.removeprefix("c.")
        ops = ins.operands
        if not ops or ops[0].type != cs.CS_OP_REG:
            return None
        if m == "auipc" or m == "lui" and self.fixed:
            return _HI, self.rv_reg(ins, ops[0]), "", 0
        if m in ("addi", "addiw") and len(ops) == 3 and ops[1].type == cs.CS_OP_REG and ops[2].type == cs.CS_OP_IMM:
            if m == "addiw" and self.backend.ptr_size == 8:
                return None  # a 32-bit add: not an address on RV64
            return _ADD, self.rv_reg(ins, ops[0]), self.rv_reg(ins, ops[1]), ops[2].imm
        what = _LOAD if m in self.loads else _STORE if m in self.stores else -1
        if what < 0:
            return None
        where = self.rv_mem(ins, ops)
        if where is None:
            return None
        return what, self.rv_reg(ins, ops[0]), where[0], where[1]

    def _ppc(self, ins: cs.CsInsn) -> Shape | None:
        m = ins.mnemonic.rstrip("+-").removesuffix(".")
        ops = ins.operands
        if not ops or ops[0].type != cs.CS_OP_REG:
            return None
        dst = ins.reg_name(ops[0].reg)
        if m == "lis" and self.fixed or m == "mflr":  # (the link register: constant after `bcl 20,31,1f`)
            return _HI, dst, "", 0
        if m == "addis" and len(ops) == 3 and ops[1].type == cs.CS_OP_REG:  # PPC64 `addis rN, r2, hi`
            return _HI, dst, ins.reg_name(ops[1].reg), 0  # a high part when its base is a formed address
        if m in ("addi", "la") and len(ops) == 3 and ops[1].type == cs.CS_OP_REG and ops[2].type == cs.CS_OP_IMM:
            src = ins.reg_name(ops[1].reg)
            return (_ADD, dst, src, ops[2].imm) if src != "r0" else None
        if len(ops) != 2 or ops[1].type != cs.CS_OP_MEM or not ops[1].mem.base:
            return None
        if self.is_load(ins) and not self.base_of(m)[2]:
            what = _LOAD
        elif m.startswith("st") and self.base_of(m)[0] in self.stores:
            what = _STORE
        else:
            return None
        return what, dst, ins.reg_name(ops[1].mem.base), ops[1].mem.disp

    def _mips(self, ins: cs.CsInsn) -> Shape | None:
        m = ins.mnemonic
        ops = ins.operands
        if not ops or ops[0].type != cs.CS_OP_REG:
            return None
        name = self.mips_reg
        if m == "lui" and self.fixed:  # (PIC code forms addresses from GOT loads)
            return _HI, name(ops[0].reg), "", 0
        if m in ("addiu", "daddiu", "addi", "daddi") and len(ops) == 3 and ops[1].type == cs.CS_OP_REG:
            if ops[2].type == cs.CS_OP_IMM:
                return _ADD, name(ops[0].reg), name(ops[1].reg), ops[2].imm
            return None
        what = _LOAD if m in self.loads else _STORE if m in self.stores else -1
        if what < 0 or len(ops) != 2 or ops[1].type != cs.CS_OP_MEM:
            return None
        return what, name(ops[0].reg), name(ops[1].mem.base), ops[1].mem.disp


def _ppc64_toc(backend: CapstoneBackend) -> int | None:
    """The PPC64 ELFv2 TOC pointer (`.TOC.`): set by the first global entry point's `addis r2, r12;
    addi r2, r2` in the code (the jump-table resolver's search), else `.got` + 0x8000."""
    from binlens.analysis.switches.ppc import toc_before

    image = backend.image
    for r in backend.codemap.regions:
        toc = toc_before(image, min(r.end, r.va + 0x10000), r.va)
        if toc is not None:
            return toc
    got = next((s for s in image.sections if s.name == ".got"), None)
    return got.va + 0x8000 if got is not None else None
