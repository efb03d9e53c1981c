"""capstone's detailed decoding without the Python binding's per-instruction copies.

`capstone.Cs.disasm` wraps each instruction in a `CsInsn` that copies the whole `cs_insn` and
its `cs_detail` (the union of every architecture's details, ~1.7 KiB), and copies the operands
once more on first access: ~13 µs per MIPS instruction with its operands, against ~1.2 µs for
`disasm_lite`. `FastCs.disasm` calls the same `cs_disasm` of the same library and reads what
the analysis uses straight from its output: id, address, size, mnemonic, operand text, bytes,
and one copy of the architecture's own detail structure (`CsMips`, ...), whose `operands` are
the binding's own operand types (`MipsOp`, ...) with the same fields and properties. Anything
else a `CsInsn` has (`regs_access`, `groups`, architecture fields) comes from the `CsInsn` of
the same bytes, decoded on first use (`Insn.__getattr__`).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from typing import Any

import capstone as cs

# the architectures whose detail structure is the `cs_arch` union member of this name
_ARCH_FIELD = {
    cs.CS_ARCH_MIPS: "mips",
    cs.CS_ARCH_PPC: "ppc",
    cs.CS_ARCH_RISCV: "riscv",
    cs.CS_ARCH_ARM: "arm",
    cs.CS_ARCH_ARM64: "arm64",
}

_INSN = cs._cs_insn
_INSN_SIZE = ctypes.sizeof(_INSN)
_HEAD = struct.Struct(f"<I{_INSN.address.offset - 4}xQH")  # id, address, size (as laid out by ctypes)
_MNEMONIC = _INSN.mnemonic.offset
_OP_STR = _INSN.op_str.offset
_DETAIL = struct.Struct("<Q" if ctypes.sizeof(ctypes.c_void_p) == 8 else "<I")
_DETAIL_OFF = _INSN.detail.offset
_ARCH_OFF = cs._cs_detail.arch.offset
# each detail structure's own fields, which `CsInsn` gives as attributes (but its operand list)
_FIELDS = {
    type(getattr(cs._cs_arch(), name)): frozenset(f[0] for f in type(getattr(cs._cs_arch(), name))._fields_)
    - {"operands", "op_count"}
    for name in _ARCH_FIELD.values()
}


def supported(arch: int) -> bool:
    """Does `FastCs` decode this capstone architecture (`CS_ARCH_*`) with this capstone binding?"""
    return arch in _ARCH_FIELD and _LAYOUT_KNOWN


# the binding's structure of an instruction, as this module reads it (capstone 5); another layout
# leaves the decoding to the binding's own `Cs.disasm`
_LAYOUT_KNOWN = [f[0] for f in _INSN._fields_] == ["id", "address", "size", "bytes", "mnemonic", "op_str", "detail"]


class Insn:
    """One decoded instruction: what `capstone.CsInsn` gives, read once from capstone's output."""

    __slots__ = ("id", "address", "size", "mnemonic", "op_str", "operands", "_arch", "_code", "_pos", "_md", "_full")

    id: int
    address: int
    size: int
    mnemonic: str
    op_str: str
    operands: list[Any]
    _arch: Any  # the architecture's detail structure (`CsMips`, ...), or None
    _code: bytes  # the decoded buffer, and where the instruction lies in it
    _pos: int
    _md: cs.Cs
    _full: cs.CsInsn | None  # the binding's own instruction, decoded on first use

    @property
    def bytes(self) -> bytearray:
        """The instruction's bytes."""
        return bytearray(self._code[self._pos : self._pos + self.size])

    def reg_name(self, reg_id: int, default: str | None = None) -> str | None:
        """The name of a register id (`capstone.CsInsn.reg_name`)."""
        return self._md.reg_name(reg_id, default)

    def __getattr__(self, name: str) -> Any:
        # (only for what the slots do not hold: the architecture's fields, as `CsInsn` has them
        # (`cc`, `update_flags`, `writeback`, ...), else the binding's own instruction, decoded once)
        if name.startswith("_"):
            raise AttributeError(name)
        arch = self._arch
        if arch is not None and name in _FIELDS[type(arch)]:
            return getattr(arch, name)
        full = self._full
        if full is None:
            full = self._full = next(self._md.disasm(self._code[self._pos : self._pos + self.size], self.address, 1))
        return getattr(full, name)

    def __repr__(self) -> str:
        return f"<Insn 0x{self.address:x}: {self.mnemonic} {self.op_str}>"


class FastCs:
    """A detailed capstone decoder (`md`, detail on) whose `disasm` yields `Insn`s."""

    def __init__(self, md: cs.Cs) -> None:
        if not md.detail:
            raise ValueError("FastCs needs a decoder with details on")
        self.md = md
        member = getattr(cs._cs_arch, _ARCH_FIELD[md.arch])
        self._arch_type = type(getattr(cs._cs_arch(), _ARCH_FIELD[md.arch]))
        self._arch_off = _ARCH_OFF + member.offset

    def __getattr__(self, name: str) -> Any:
        return getattr(self.md, name)  # reg_name, mode, arch, ...: the decoder's own

    def disasm(self, code: bytes | bytearray | memoryview, offset: int, count: int = 0) -> Iterator[Insn]:
        """The instructions of `code` at address `offset` (at most `count`; 0: all), as `Cs.disasm`."""
        data = code if isinstance(code, bytes) else bytes(code)
        all_insn = ctypes.POINTER(_INSN)()
        res = cs._cs.cs_disasm(self.md.csh, data, len(data), offset, count, ctypes.byref(all_insn))
        if res <= 0:
            status = cs._cs.cs_errno(self.md.csh)
            if status != cs.CS_ERR_OK:
                raise cs.CsError(status)
            return
        try:
            blob = ctypes.string_at(ctypes.addressof(all_insn.contents), res * _INSN_SIZE)  # one copy of all
            head, detail_ptr, find = _HEAD.unpack_from, _DETAIL.unpack_from, blob.find
            arch_type, arch_off = self._arch_type, self._arch_off
            view, copy = arch_type.from_address, arch_type.from_buffer_copy
            new, md = Insn.__new__, self.md
            for at in range(0, res * _INSN_SIZE, _INSN_SIZE):
                ins = new(Insn)
                ins.id, address, size = head(blob, at)
                ins.address, ins.size = address, size
                m = at + _MNEMONIC
                ins.mnemonic = blob[m : find(b"\0", m, m + 32)].decode("ascii")
                o = at + _OP_STR
                ins.op_str = blob[o : find(b"\0", o, o + 160)].decode("ascii")
                (ptr,) = detail_ptr(blob, at + _DETAIL_OFF)
                if ptr and ins.id:
                    arch = copy(view(ptr + arch_off))  # the architecture's details, owned by `arch`
                    ins.operands = arch.operands[: arch.op_count]
                    ins._arch = arch
                else:
                    ins.operands = []
                    ins._arch = None
                ins._code, ins._pos, ins._md, ins._full = data, address - offset, md, None
                yield ins
        finally:
            cs._cs.cs_free(all_insn, res)
