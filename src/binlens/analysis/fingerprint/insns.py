"""Instruction features (`InsnFeature`) of a run of code: x86 from iced-x86's decoder with the
exact offsets of displacements and immediates, every other ISA from the engine's instruction model."""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

import iced_x86 as ix

from binlens.analysis.fingerprint.model import CLASS_INDEX, InsnFeature

IsAddress = Callable[[int], bool]

_FC = ix.FlowControl
_OK = ix.OpKind
_FLOW_CLASS: dict[int, int] = {
    _FC.CALL: CLASS_INDEX["call"],
    _FC.INDIRECT_CALL: CLASS_INDEX["call"],
    _FC.RETURN: CLASS_INDEX["return"],
    _FC.UNCONDITIONAL_BRANCH: CLASS_INDEX["jump"],
    _FC.INDIRECT_BRANCH: CLASS_INDEX["jump"],
    _FC.CONDITIONAL_BRANCH: CLASS_INDEX["conditional"],
}
_IMMEDIATE = frozenset(
    {
        _OK.IMMEDIATE8,
        _OK.IMMEDIATE8_2ND,
        _OK.IMMEDIATE16,
        _OK.IMMEDIATE32,
        _OK.IMMEDIATE64,
        _OK.IMMEDIATE8TO16,
        _OK.IMMEDIATE8TO32,
        _OK.IMMEDIATE8TO64,
        _OK.IMMEDIATE32TO64,
    }
)
_NEAR = frozenset({_OK.NEAR_BRANCH16, _OK.NEAR_BRANCH32, _OK.NEAR_BRANCH64})
_BRANCH = _NEAR | {_OK.FAR_BRANCH16, _OK.FAR_BRANCH32}
_MNEMONIC_NAMES: dict[int, str] = {
    value: name.lower() for name, value in vars(ix.Mnemonic).items() if name.isupper() and isinstance(value, int)
}

# mnemonic prefixes of each class, longest first where they overlap (every ISA's spellings)
_PREFIX_CLASSES: tuple[tuple[str, str], ...] = (
    ("cmov", "move"),
    ("movs", "move"),
    ("set", "setcc"),
    ("rep", "string"),
    ("stos", "string"),
    ("scas", "string"),
    ("cmps", "string"),
    ("lods", "string"),
    ("cmp", "compare"),
    ("test", "logic"),
    ("tst", "logic"),
    ("push", "stack"),
    ("pop", "stack"),
    ("leave", "stack"),
    ("enter", "stack"),
    ("stp", "stack"),
    ("ldp", "stack"),
    ("mov", "move"),
    ("lea", "move"),
    ("ld", "move"),
    ("st", "move"),
    ("lw", "move"),
    ("sw", "move"),
    ("lb", "move"),
    ("sb", "move"),
    ("lh", "move"),
    ("sh", "shift"),
    ("sa", "shift"),
    ("ro", "shift"),
    ("ls", "shift"),
    ("as", "shift"),
    ("sr", "shift"),
    ("sl", "shift"),
    ("add", "arith"),
    ("sub", "arith"),
    ("inc", "arith"),
    ("dec", "arith"),
    ("neg", "arith"),
    ("mul", "arith"),
    ("imul", "arith"),
    ("div", "arith"),
    ("idiv", "arith"),
    ("adc", "arith"),
    ("sbb", "arith"),
    ("madd", "arith"),
    ("and", "logic"),
    ("or", "logic"),
    ("xor", "logic"),
    ("eor", "logic"),
    ("not", "logic"),
    ("bic", "logic"),
    ("v", "vector"),
    ("p", "vector"),
    ("f", "vector"),
)
_CLASS_CACHE: dict[str, int] = {}


def mnemonic_class(mnemonic: str) -> int:
    """The `CLASSES` index of a mnemonic that is not a branch, by its spelling."""
    cls = _CLASS_CACHE.get(mnemonic)
    if cls is None:
        cls = CLASS_INDEX["other"]
        for prefix, name in _PREFIX_CLASSES:
            if mnemonic.startswith(prefix):
                cls = CLASS_INDEX[name]
                break
        if mnemonic.endswith(("ss", "sd", "ps", "pd")) and cls == CLASS_INDEX["move"]:
            cls = CLASS_INDEX["vector"]
        _CLASS_CACHE[mnemonic] = cls
    return cls


class X86Features:
    """Features of x86 and x86-64 code: the instruction bytes with RIP-relative displacements and
    address-valued displacements and immediates zeroed; a relative branch or call is its mnemonic
    alone (a short `jmp`/`jcc` and the near form are the same instruction placed elsewhere), and
    loading a register with an address is one token whether PIC code spells it `lea r, [rip+X]` or
    non-PIC code `mov r32, X`."""

    def __init__(self, bits: int, read: Callable[[int, int], bytes | None], is_address: IsAddress) -> None:
        self.bits = bits
        self.read = read
        self.is_address = is_address
        self._mnemonic: dict[int, tuple[int, int]] = {}  # iced mnemonic -> (hash, class)

    def _describe(self, m: int, flow: int) -> tuple[int, int]:
        name = _MNEMONIC_NAMES.get(m, "?")
        cls = _FLOW_CLASS.get(flow)
        out = (zlib.crc32(name.encode()), mnemonic_class(name) if cls is None else cls)
        self._mnemonic[m] = out
        return out

    def _address_load(self, ins: ix.Instruction) -> int | None:
        """The full register an instruction loads with an address and nothing else, or None."""
        m = ins.mnemonic
        if m == ix.Mnemonic.LEA:
            if ins.is_ip_rel_memory_operand or (
                ins.memory_base == ix.Register.NONE
                and ins.memory_index == ix.Register.NONE
                and self.is_address(ins.memory_displacement)
            ):
                return int(ix.RegisterInfo(ins.op0_register).full_register)
            return None
        if (
            m == ix.Mnemonic.MOV
            and ins.op_count == 2
            and ins.op0_kind == ix.OpKind.REGISTER
            and ins.op1_kind in _IMMEDIATE
            and self.is_address(ins.immediate(1))
        ):
            return int(ix.RegisterInfo(ins.op0_register).full_register)
        return None

    def __call__(self, start: int, end: int) -> list[InsnFeature]:
        """The features of the instructions in [start, end)."""
        data = self.read(start, end - start)
        if not data:
            return []
        dec = ix.Decoder(self.bits, data, ip=start)
        out: list[InsnFeature] = []
        is_address = self.is_address
        described = self._mnemonic
        off = 0
        for ins in dec:
            if ins.is_invalid:
                break
            n = ins.len
            raw = data[off : off + n]
            off += n
            m = ins.mnemonic
            desc = described.get(m)
            if desc is None:
                desc = self._describe(m, ins.flow_control)
            reg = self._address_load(ins)
            if reg is not None:  # `lea r, [rip+X]` (PIC) and `mov r32, X` (non-PIC): r = an address
                mov = described.get(ix.Mnemonic.MOV) or self._describe(ix.Mnemonic.MOV, ix.FlowControl.NEXT)
                out.append((b"\x8d\xff" + reg.to_bytes(2, "little"), mov[0], mov[1], ()))
                continue
            offsets = dec.get_constant_offsets(ins)
            has_disp, has_imm = offsets.has_displacement, offsets.has_immediate
            if not has_disp and not has_imm:
                out.append((raw, desc[0], desc[1], ()))
                continue
            mask: list[tuple[int, int]] = []
            if has_disp and (ins.is_ip_rel_memory_operand or is_address(ins.memory_displacement)):
                mask.append((offsets.displacement_offset, offsets.displacement_size))
            consts: list[int] = []
            relative = False
            if has_imm:
                branch = False
                for i in range(ins.op_count):
                    kind = ins.op_kind(i)
                    if kind in _BRANCH:
                        branch = True
                        if kind in _NEAR:  # short and near forms alike: the distance picks the encoding
                            raw, relative = b"\xe9" + m.to_bytes(2, "little"), True
                            mask.clear()
                            break
                    elif kind in _IMMEDIATE:
                        value = ins.immediate(i)
                        if is_address(value):
                            branch = True
                        elif value not in _TRIVIAL:
                            consts.append(value)
                if branch and not relative:
                    mask.append((offsets.immediate_offset, offsets.immediate_size))
                    if offsets.has_immediate2:
                        mask.append((offsets.immediate_offset2, offsets.immediate_size2))
            if mask:
                buf = bytearray(raw)
                for o, k in mask:
                    buf[o : o + k] = bytes(k)
                raw = bytes(buf)
            out.append((raw, desc[0], desc[1], tuple(consts)))
        return out


_TRIVIAL = frozenset({0, 1, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})


class ModelInstruction(Protocol):
    """What the engine's `model.Instruction` offers (every backend's `instructions`)."""

    @property
    def address(self) -> int: ...
    @property
    def mnemonic(self) -> str: ...
    @property
    def operands(self) -> str: ...
    @property
    def flow(self) -> str: ...
    @property
    def targets(self) -> tuple[int, ...]: ...
    @property
    def refs(self) -> tuple[int, ...]: ...


_NUMBER = re.compile(r"(?<![\w.])(-?0x[0-9a-fA-F]+|-?\d+)(?![\w.])")
_MEMORY = re.compile(r"\[[^\]]*\]|\([^)]*\)")
_FLOW_NAMES = {
    "call": "call",
    "indirect_call": "call",
    "return": "return",
    "jump": "jump",
    "indirect_jump": "jump",
    "conditional": "conditional",
}


# Instructions whose numbers are parts of an address (a page, an upper half) whatever their value.
_ADDRESS_PART_MNEMONICS = frozenset({"adrp", "adr", "auipc", "lui", "movw", "movt", "addis", "lis"})
_REGISTER = re.compile(r"\$?[a-z][a-z0-9]*")


class ModelFeatures:
    """Features from the engine's instruction model (every ISA but x86): the mnemonic and operand
    text, each number that is an address, a branch target or a reference replaced by `A`. Every
    number of an instruction that references an address, forms one (`adrp`, `auipc`, `lui`,
    `movw`/`movt`) or reads a register such an instruction set earlier in the block (the `add` or
    `ldr` of an `adrp` pair holds only the page offset) is replaced."""

    def __init__(self, decode: Callable[[int, int], Sequence[ModelInstruction]], is_address: IsAddress) -> None:
        self.decode = decode
        self.is_address = is_address

    def __call__(self, start: int, end: int) -> list[InsnFeature]:
        """The features of the instructions in [start, end)."""
        out: list[InsnFeature] = []
        pages: set[str] = set()  # registers an address-forming instruction set in this block
        for ins in self.decode(start, end):
            if ins.mnemonic == ".byte":
                break
            known = set(ins.targets) | set(ins.refs)
            consts: list[int] = []
            mnemonic = ins.mnemonic.lower()
            regs = _REGISTER.findall(ins.operands.lower())
            if mnemonic in _ADDRESS_PART_MNEMONICS and regs:
                pages.add(regs[0])
            if known or mnemonic in _ADDRESS_PART_MNEMONICS or pages.intersection(regs[1:]):
                text = _NUMBER.sub("A", ins.operands)
            else:

                def mask(m: re.Match[str]) -> str:
                    value = int(m.group(1), 0) & 0xFFFFFFFFFFFFFFFF
                    return "A" if self.is_address(value) else m.group(1)

                text = _NUMBER.sub(mask, ins.operands)
            for m in _NUMBER.finditer(_MEMORY.sub("", text)):
                value = int(m.group(1), 0)
                if value not in (0, 1, -1):
                    consts.append(value & 0xFFFFFFFFFFFFFFFF)
            flow = _FLOW_NAMES.get(ins.flow)
            cls = CLASS_INDEX[flow] if flow is not None else mnemonic_class(ins.mnemonic)
            token = f"{ins.mnemonic} {text}".encode()
            out.append((token, zlib.crc32(ins.mnemonic.encode()), cls, tuple(consts)))
        return out
