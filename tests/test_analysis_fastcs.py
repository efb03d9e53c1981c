"""`fastcs.FastCs` decodes exactly what capstone's own `Cs.disasm` decodes, on real cross-compiled code.

Every instruction of each build's `.text` (gcc for MIPS BE/LE/n64, PowerPC 32/64le, RISC-V 64, ARM
and Thumb-2, AArch64) is decoded both ways and compared field by field: id, address, size,
mnemonic, operand text, bytes, every field of every operand, and the architecture's own fields
(`cc`, `update_flags`, `writeback`, ...). What the slots do not hold (`regs_access`, `groups`) comes
from capstone's own instruction. Tests skip where a cross compiler is missing (`.ci/run` installs them).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import capstone as cs
import pytest

import crossbuild as xb
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode import fastcs
from binlens.analysis.decode.branchflow import F_CALL, F_COND, F_JUMP, F_NEXT, F_RET, last_number, text_flow
from binlens.analysis.decode.capstone_backend import CapstoneBackend, _may_flow_for, _mode
from binlens.loader.parse_lief import parse_path

# (triple, extra flags, thumb): the architectures the capstone backend decodes with FastCs
TARGETS = [
    ("mips-linux-gnu", (), False),
    ("mipsel-linux-gnu", (), False),
    ("mips64-linux-gnuabi64", (), False),
    ("powerpc-linux-gnu", (), False),
    ("powerpc64le-linux-gnu", (), False),
    ("riscv64-linux-gnu", (), False),
    ("arm-linux-gnueabihf", ("-mthumb",), True),
    ("arm-linux-gnueabihf", ("-marm",), False),
    ("aarch64-linux-gnu", (), False),
]


def _build(out_dir: Path, triple: str, flags: tuple[str, ...], thumb: bool) -> xb.Build:
    cc = xb.toolchain("gcc", triple)
    tag = f"{triple}{''.join(flags)}"
    return xb.cross_build(out_dir, triple, cc, ["-O2", *flags], tag, thumb_bit=thumb)


fastcs_build = xb.build_fixture("fastcs", _build)


def _plain(value: object) -> object:
    """A ctypes structure, union or array as nested tuples of its fields (floats by repr: NaN)."""
    if isinstance(value, ctypes.Structure | ctypes.Union):
        return tuple((name, _plain(getattr(value, name))) for name, *_ in value._fields_)
    if isinstance(value, ctypes.Array):
        return tuple(_plain(x) for x in value)
    return repr(value) if isinstance(value, float) else value


def _arch_fields(md: cs.Cs) -> list[str]:
    """The fields of the architecture's detail structure that `CsInsn` gives as attributes."""
    fields = fastcs._FIELDS[type(getattr(cs._cs_arch(), fastcs._ARCH_FIELD[md.arch]))]
    # (PowerPC's `bh` and `update_cr0` are left unset by capstone for some instructions: two
    # decodes of the same bytes by capstone itself can disagree; binlens reads neither)
    return sorted(fields - {"bh", "update_cr0"})


def _view(ins: object, fields: list[str]) -> tuple:
    return (
        ins.id,
        ins.address,
        ins.size,
        ins.mnemonic,
        ins.op_str,
        bytes(ins.bytes),
        [_plain(op) for op in ins.operands],
        [getattr(ins, name) for name in fields],
    )


@pytest.mark.parametrize("triple,flags,thumb", TARGETS, ids=[f"{t}{''.join(f)}" for t, f, _ in TARGETS])
def test_every_instruction_decodes_as_capstone_decodes_it(fastcs_build, triple, flags, thumb):
    b = fastcs_build(triple, flags, thumb)
    image = parse_path(str(b.exe))
    text = next(s for s in image.sections if s.name == ".text")
    code = bytes(image.read(text.va, text.size))
    arch, mode = _mode(image, thumb)
    md = cs.Cs(arch, mode)
    md.detail = True
    fast = fastcs.FastCs(md)
    fields = _arch_fields(md)
    ours: list[tuple] = []
    off = 0
    while off < len(code):  # (past the words capstone cannot decode: it stops there)
        run = [_view(i, fields) for i in fast.disasm(code[off:], text.va + off)]
        assert run == [_view(i, fields) for i in md.disasm(code[off:], text.va + off)]
        ours += run
        off += sum(v[2] for v in run) + (2 if thumb else 4)
    assert len(ours) > 100, f"only {len(ours)} instructions in {triple} .text"
    # one at a time, as the backend decodes the instructions whose operands it reads
    for k in range(0, min(len(code), 400), 4 if not thumb else 2):
        one = list(fast.disasm(code[k : k + 4], text.va + k, 1))
        ref = list(md.disasm(code[k : k + 4], text.va + k, 1))
        assert [_view(i, fields) for i in one] == [_view(i, fields) for i in ref]


@pytest.mark.parametrize("triple", ["aarch64-linux-gnu", "mips-linux-gnu"])
def test_what_the_slots_do_not_hold_comes_from_capstone(fastcs_build, triple):
    b = fastcs_build(triple, (), False)
    image = parse_path(str(b.exe))
    text = next(s for s in image.sections if s.name == ".text")
    code = bytes(image.read(text.va, text.size))
    md = cs.Cs(*_mode(image, False))
    md.detail = True
    pairs = list(zip(fastcs.FastCs(md).disasm(code, text.va), md.disasm(code, text.va), strict=True))
    for ours, theirs in pairs[:200]:
        assert ours.groups == theirs.groups
        assert ours.insn_name() == theirs.insn_name()
        if triple.startswith("aarch64"):  # (capstone has no register access lists for MIPS)
            assert ours.regs_access() == theirs.regs_access()
        for op in ours.operands:
            if op.type == cs.CS_OP_REG:
                assert ours.reg_name(op.reg) == theirs.reg_name(op.reg)
    with pytest.raises(AttributeError):
        pairs[0][0]._missing  # noqa: B018 - private names are never looked up on capstone's instruction


def test_the_capstone_backend_decodes_operands_with_it(fastcs_build):
    b = fastcs_build("mips-linux-gnu", (), False)
    image = parse_path(str(b.stripped))
    backend = CapstoneBackend(image, CodeMap(image))
    assert isinstance(backend.md(False), fastcs.FastCs)
    assert backend.md(False).reg_name(2)  # the decoder's own methods pass through


def test_a_decoder_without_details_is_refused():
    md = cs.Cs(cs.CS_ARCH_MIPS, cs.CS_MODE_MIPS32 | cs.CS_MODE_BIG_ENDIAN)
    with pytest.raises(ValueError, match="details"):
        fastcs.FastCs(md)
    assert not fastcs.supported(cs.CS_ARCH_X86)  # x86 is iced-x86's


def test_undecodable_bytes_end_the_instructions_as_capstone_ends_them():
    md = cs.Cs(cs.CS_ARCH_ARM64, cs.CS_MODE_ARM)
    md.detail = True
    code = bytes.fromhex("1f2003d5c0035fd6ffffffff1f2003d5")  # nop; ret; (invalid); nop
    ours = [(i.address, i.mnemonic) for i in fastcs.FastCs(md).disasm(code, 0x1000)]
    assert ours == [(i.address, i.mnemonic) for i in md.disasm(code, 0x1000)] == [(0x1000, "nop"), (0x1004, "ret")]
    assert list(fastcs.FastCs(md).disasm(b"", 0x1000)) == []


def test_aarch64_branches_read_from_their_text_are_classified_as_from_their_operands(fastcs_build):
    """The AArch64 chunk decoder reads a branch's flow and target from capstone's operand text
    (`_a64_flow`) instead of decoding it again with details: on every branch, return and trap of
    a real build, both give the same answer, and only unknown text falls back."""
    b = fastcs_build("aarch64-linux-gnu", (), False)
    image = parse_path(str(b.exe))
    backend = CapstoneBackend(image, CodeMap(image))
    text = next(s for s in image.sections if s.name == ".text")
    code = bytes(image.read(text.va, text.size))
    may_flow = _may_flow_for("aarch64")
    a64_flow = text_flow("aarch64", backend._global_entry)
    kinds = set()
    for ins in backend.md(False).disasm(code, text.va):
        if may_flow(ins.mnemonic, ins.op_str):
            assert a64_flow(ins.mnemonic, ins.op_str, ins.address) == backend.classify(ins), hex(ins.address)
            kinds.add(ins.mnemonic.split(".")[0])
    assert {"b", "bl", "ret", "br"} <= kinds, kinds  # (calls, jumps, returns, the switch's table jump)
    assert a64_flow("b", "#0x1000", 0) == (F_JUMP, 0x1000)
    assert a64_flow("tbz", "w0, #3, #0x2000", 0) == (F_COND, 0x2000)
    assert a64_flow("b", "x0", 0) is None  # (no target in the text: decoded with details instead)


TEXT_FLOW = ["mips-linux-gnu", "mipsel-linux-gnu", "mips64-linux-gnuabi64", "powerpc-linux-gnu"]
TEXT_FLOW += ["powerpc64le-linux-gnu", "riscv64-linux-gnu"]


@pytest.mark.parametrize("triple", TEXT_FLOW)
def test_branches_read_from_their_text_are_classified_as_from_their_operands(fastcs_build, triple):
    """MIPS, PowerPC and RISC-V chunk decoders read a branch's flow and target from the text too
    (`branchflow.text_flow`): every jump, call, return, conditional branch and trap of a real build
    gives what `classify` gives from the operands."""
    b = fastcs_build(triple, (), False)
    image = parse_path(str(b.exe))
    backend = CapstoneBackend(image, CodeMap(image))
    arch = backend.arch
    flow_of = text_flow(arch, backend._global_entry)
    text = next(s for s in image.sections if s.name == ".text")
    code = bytes(image.read(text.va, text.size))
    may_flow = _may_flow_for(arch)
    kinds = set()
    off = 0
    while off < len(code):  # (past the words capstone cannot decode)
        n = 0
        for ins in backend.md(False).disasm(code[off:], text.va + off):
            n += ins.size
            if may_flow(ins.mnemonic, ins.op_str):
                got = flow_of(ins.mnemonic, ins.op_str, ins.address)
                if got is not None:
                    assert got == backend.classify(ins), (hex(ins.address), ins.mnemonic, ins.op_str)
                    kinds.add(got[0])
        off += n + 4
    assert {F_JUMP, F_COND, F_RET} <= kinds or {F_COND, F_RET, F_CALL} <= kinds, kinds


def test_text_flow_edge_cases():
    mips = text_flow("mips", lambda t: t)
    assert mips("bal", "0x1008", 0x1000) == (F_NEXT, -1)  # reads the PC: no call
    assert mips("beq", "$v0, $zero, 0x2000", 0x1000) == (F_COND, 0x2000)
    assert mips("beq", "$v0, $zero, 0xzz", 0x1000) is None  # (decoded with details instead)
    assert mips("jr", "$ra", 0x1000) == (F_RET, -1)
    assert text_flow("riscv", lambda t: t)("c.j", "-0x10", 0x1010) == (F_JUMP, 0x1000)  # relative, as the operand
    assert text_flow("ppc", lambda t: t + 8)("bl", "0x2000", 0x1000) == (F_CALL, 0x2008)  # (ELFv2 global entry)
    assert last_number("4*cr4+so, 0xffffffffffffb1fc") == -0x4E04  # signed, as the operand
    assert last_number("$ra") == -1
    assert text_flow("x86", lambda t: t) is None  # (iced-x86 decodes x86)


@pytest.mark.parametrize("flags,thumb", [(("-mthumb",), True), (("-marm",), False)], ids=["thumb", "arm"])
def test_arm32_direct_branches_read_from_their_text_are_classified_as_from_their_operands(fastcs_build, flags, thumb):
    """ARM32 `b`, `b<cond>`, `cbz`/`cbnz`, `bl` and `blx` to an address take their flow from the text
    outside IT blocks (inside one, the condition comes from the `it`: decoded with details)."""
    b = fastcs_build("arm-linux-gnueabihf", flags, thumb)
    image = parse_path(str(b.exe))
    backend = CapstoneBackend(image, CodeMap(image))
    flow_of = text_flow("arm", backend._global_entry)
    text = next(s for s in image.sections if s.name == ".text")
    code = bytes(image.read(text.va, text.size))
    seen = 0
    it_left = 0
    for ins in backend.md(thumb).disasm(code, text.va):
        inside, it_left = it_left > 0, it_left - 1
        if thumb and ins.mnemonic.startswith("it") and len(ins.mnemonic) <= 5:
            it_left = len(ins.mnemonic) - 1
        got = flow_of(ins.mnemonic, ins.op_str, ins.address)
        if got is not None and not inside:
            assert got == backend.classify(ins), (hex(ins.address), ins.mnemonic, ins.op_str)
            seen += 1
    assert seen >= 10
    assert flow_of("beq.w", "#0x1000", 0) == (F_COND, 0x1000)
    assert flow_of("bls", "#0x1000", 0) == (F_COND, 0x1000)  # (b + ls, not bl + s)
    assert flow_of("cbz", "r0, #0x1000", 0) == (F_COND, 0x1000)
    assert flow_of("bx", "lr", 0) is None and flow_of("blx", "r3", 0) is None  # (decoded with details)
    assert flow_of("bl", "#0xff895800", 0) is None  # (the operand is negative there)


@pytest.mark.parametrize("triple,flags,thumb", TARGETS, ids=[f"{t}{''.join(f)}" for t, f, _ in TARGETS])
def test_the_chunk_decoders_window_does_not_change_the_analysis(fastcs_build, monkeypatch, triple, flags, thumb):
    """The chunk decoder asks capstone for a few instructions at a time (`_WINDOW`: fewer decoded and
    printed for nothing); one at a time (every instruction at a window's edge, a Thumb-2 one cut by
    it) and the former 24 give the same analysis of the stripped build without unwind tables."""
    from binlens.analysis.decode import capstone_backend
    from conftest import analysis_summary

    b = fastcs_build(triple, flags, thumb)
    want = analysis_summary(b.no_eh)
    assert want[0], f"no functions in {triple}"
    for window in (1, 24):
        monkeypatch.setattr(capstone_backend, "_WINDOW", window)
        assert analysis_summary(b.no_eh) == want, f"window {window}"
