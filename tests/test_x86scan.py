"""The C scanner of plain x86 code (`binlens/analysis/native/_x86scan.c`) against iced-x86.

The scanner may decline any instruction (iced-x86 then decodes it), but every one it accepts must
be exactly what iced-x86 says: the same length, flow and branch target, not `hlt`, and flagged
whenever the engine's `_data_ref` would take an address from it. Checked at every byte offset of
real code (gcc builds, the system's libc with its AVX/EVEX routines) and on random encodings; the
analysis with the scanner is the analysis without it.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import iced_x86 as ix
import pytest

import crossbuild as xb
from binlens.analysis import analyze
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode import x86 as X
from binlens.loader.parse_lief import parse_path
from conftest import assert_same_analysis_without, corpus_dir

S = pytest.importorskip("binlens.analysis.native._x86scan", reason="the C scanner is not built (no C compiler?)")
FC = ix.FlowControl
FLOW = {
    FC.NEXT: S.FLOW_NEXT,
    FC.CONDITIONAL_BRANCH: S.FLOW_JCC,
    FC.UNCONDITIONAL_BRANCH: S.FLOW_JMP,
    FC.CALL: S.FLOW_CALL,
    FC.RETURN: S.FLOW_RET,
}
LO, HI = 1, 2**64 - 1  # every nonzero number is an address: all address operands must be flagged
LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
SRC = Path(__file__).resolve().parent / "fixtures" / "src"


def _flow(ins: ix.Instruction) -> int | None:
    """The scanner's flow for what iced-x86 says: a call without a target (`syscall`) goes on."""
    if ins.flow_control == FC.CALL and ins.op0_kind not in X._NEAR:
        return S.FLOW_NEXT
    return FLOW.get(ins.flow_control)


def _takes_address(ins: ix.Instruction) -> bool:
    """Would the engine's `_data_ref` record a reference for `ins` if every address were mapped?"""
    backend = X.X86Backend.__new__(X.X86Backend)
    got: list[int] = []
    backend._ctx = (LO, HI, 0, -1, 4, got, [], [], lambda t: True)
    X.X86Backend._data_ref(backend, ins, ins.ip)
    return bool(got)


def _mismatches(data: bytes, va: int, bits: int, step: int = 1) -> tuple[int, list[str]]:
    """(instructions the scanner accepted, what it got wrong) at every `step`-th offset of `data`."""
    dec = ix.Decoder(bits, data, ip=va)
    accepted, wrong = 0, []
    for off in range(0, len(data), step):
        got = S.decode_one(data, off, va + off, bits, LO, HI)
        if got is None:
            continue
        accepted += 1
        length, flow, target, flagged = got
        dec.position, dec.ip = off, va + off
        ins = dec.decode()
        err = ""
        if ins.code == 0:
            err = "iced-x86 finds no instruction"
        elif ins.len != length:
            err = f"length {length}, iced-x86 {ins.len}"
        elif _flow(ins) != flow:
            err = f"flow {flow}, iced-x86 {ins.flow_control}"
        elif flow in (S.FLOW_JCC, S.FLOW_JMP, S.FLOW_CALL) and ins.near_branch_target != target:
            err = f"target {target:#x}, iced-x86 {ins.near_branch_target:#x}"
        elif ins.code == ix.Code.HLT:
            err = "hlt ends a chunk"
        elif flow == S.FLOW_NEXT and not flagged and _takes_address(ins):
            err = "an address operand is not flagged"
        if err:
            wrong.append(f"{va + off:#x} {data[off : off + 15].hex()} ({ins}): {err}")
    return accepted, wrong


def _check_file(path: Path) -> int:
    image = parse_path(str(path))
    bits = 64 if image.identity.bits == 64 else 32
    accepted, wrong = 0, []
    for region in CodeMap(image).regions:
        n, bad = _mismatches(region.data, region.va, bits)
        accepted, wrong = accepted + n, wrong + bad
    assert not wrong, wrong[:10]
    return accepted


@pytest.mark.parametrize("opt,pie", [("-O2", True), ("-O0", False), ("-O3", True)])
def test_every_offset_of_gcc_code_matches_iced(compile_c, opt: str, pie: bool) -> None:
    assert _check_file(compile_c("sample.c", opt, pie)) > 500


def test_every_offset_of_i386_code_matches_iced(tmp_path: Path) -> None:
    flags = ["-O2", "-fno-pie", "-no-pie"]
    exe, _stripped = xb.gcc_linked(tmp_path, "i686-linux-gnu", SRC / "i386_pic.c", "nopic", flags, ())
    assert _check_file(exe) > 300


def test_every_offset_of_libc_matches_iced() -> None:
    if not LIBC.exists():
        pytest.skip(f"{LIBC} is absent")
    assert _check_file(LIBC) > 1_000_000  # of ~1.4M offsets in its code


@pytest.mark.parametrize("bits", [64, 32])
def test_random_encodings_match_iced(bits: int) -> None:
    rnd = random.Random(bits)
    prefixes = [b"", b"", b"", b"\x66", b"\xf2", b"\xf3", b"\x2e", b"\x64", b"\x66\xf3", b"\xf3\x66", b"\xf0", b"\x67"]
    rex = [b""] + ([bytes([0x40 + i]) for i in range(16)] if bits == 64 else [])
    maps = [b"", b"\x0f", b"\x0f\x38", b"\x0f\x3a"]
    accepted, wrong = 0, []
    for _ in range(100_000):
        data = rnd.choice(prefixes) + rnd.choice(rex) + rnd.choice(maps) + rnd.randbytes(15)
        n, bad = _mismatches(data[:15], 0x401000, bits, step=16)
        accepted, wrong = accepted + n, wrong + bad
    assert not wrong, wrong[:10]
    assert accepted > 20_000


def test_random_vex_encodings_match_iced() -> None:
    """VEX (C4/C5) forms of the opcodes the scanner knows and their neighbours, with every
    VEX.pp/L/W/vvvv and prefixes that make them invalid (66, F3, REX, lock before VEX)."""
    rnd = random.Random(11)
    ops = {
        1: [0x10, 0x11, 0x12, 0x28, 0x29, 0x2E, 0x54, 0x57, 0x60, 0x6B, 0x6C, 0x6E, 0x6F, 0x70, 0x74, 0x76, 0x77,
            0x7E, 0x7F, 0xD6, 0xD7, 0xD8, 0xDA, 0xE0, 0xE6, 0xE7, 0xEF, 0xF0, 0xF7, 0xF8, 0xFE, 0xFF],
        2: [0x00, 0x17, 0x18, 0x38, 0x3F, 0x40, 0x58, 0x78, 0x79, 0xF5, 0xF7],
        3: [0x00, 0x0F, 0x38, 0x39, 0x3F, 0x46, 0x63],
    }  # fmt: skip
    accepted, wrong = 0, []
    for _ in range(60_000):
        pre = rnd.choice([b"", b"", b"", b"", b"\x66", b"\xf3", b"\x48", b"\xf0", b"\x2e"])
        if rnd.random() < 0.4:
            data = pre + bytes([0xC5, rnd.randrange(256), rnd.choice(ops[1])])
        else:
            mm = rnd.choice([1, 1, 2, 3, 0, 4])
            data = pre + bytes([0xC4, rnd.randrange(8) << 5 | mm, rnd.randrange(256), rnd.choice(ops.get(mm, ops[1]))])
        n, bad = _mismatches((data + rnd.randbytes(12))[:15], 0x401000, 64, step=16)
        accepted, wrong = accepted + n, wrong + bad
    assert not wrong, wrong[:10]
    assert accepted > 2_000


BUILDS = [
    ("sample.c", "-O2", True),
    ("sample.c", "-O0", False),
    ("callbacks.c", "-O2", False),
    ("dispatch_x86.c", "-O2", True),
]


@pytest.mark.parametrize("name,opt,pie", BUILDS)
def test_analysis_is_the_same_without_the_scanner(compile_c, monkeypatch, name: str, opt: str, pie: bool) -> None:
    summary = assert_same_analysis_without(monkeypatch, X, "_c_scan", compile_c(name, opt, pie, strip=True))
    assert summary[1]  # references were found (some through the scanner's flags)


CORPUS_FILES = ["pe/lfanew_relocXP.exe", "mach0/swift/movabs", "pe/winmain.exe", "jmptbl/test_msvc_1900_32.exe"]


@pytest.mark.parametrize("name", CORPUS_FILES)
def test_analysis_of_corpus_files_is_the_same_without_the_scanner(monkeypatch, name: str) -> None:
    """32-bit code running past 4 GiB (`lfanew_relocXP.exe`: addresses go on, only branch targets
    wrap), `movabs` immediates in a Mach-O, PE code with absolute addresses."""
    path = corpus_dir() / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert_same_analysis_without(monkeypatch, X, "_c_scan", path)


def test_scan_refuses_an_offset_outside_the_region() -> None:
    data = bytes.fromhex("4889c3c3")
    for off in (4, 9, -1):  # (4: just past the end, where a chunk start would be written out of bounds)
        with pytest.raises(ValueError, match="outside"):
            S.scan(data, bytearray(len(data)), off, 0x1000, 64, 0, 0, 4)
    state = bytearray(len(data))
    assert S.scan(data, state, 0, 0x1000, 64, 0, 0, 4) == (0x1004, X.T_RET, (), 0x1003)
    assert state == bytes([3, 2, 2, 1])  # chunk start, body, instruction start


def test_no_reference_from_the_high_half_of_a_64_bit_immediate(tmp_path: Path, monkeypatch) -> None:
    """`movabs rax, 0x40100000000000`: iced-x86 keeps the immediate's high half (0x401000, an
    address in a non-PIE build) where a displacement would be; it is no memory operand."""
    src = tmp_path / "movabs.c"
    src.write_text(
        "volatile unsigned long long sink;\n"
        "int main(void) { sink = 0x0040100000000000ULL; sink = 0x0040100000000001ULL; return 0; }\n"
    )
    exe = tmp_path / "movabs"
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on this machine")
    subprocess.run([cc, "-O2", "-fno-pie", "-no-pie", "-o", str(exe), str(src)], check=True)
    image = parse_path(str(exe))
    main = next(s.address for s in image.symbols if s.name == "main")
    assert any(r.va <= 0x401000 < r.end for r in CodeMap(image).regions)  # the high half is an address
    for scanner in (S.scan, None):
        monkeypatch.setattr(X, "_c_scan", scanner)
        result = analyze(parse_path(str(exe)))
        assert not [x for x in result.xrefs if x.dst == 0x401000 and main <= x.src < main + 32]


def _sweep_with_scanner(path: Path, limit: int | None = None) -> int:
    """Chunk by chunk through the code: `Scanner.chunk` (or, where it declines, `decode_chunk`)
    against the exact iced path on a second code map; same chunks, state maps and references."""
    image = parse_path(str(path))
    fast_map, exact_map = CodeMap(image), CodeMap(image)
    fast, exact = X.X86Backend(image, fast_map), X.X86Backend(image, exact_map)
    assert fast.fast_chunk is not None
    whole = 0
    for rf in fast_map.regions:
        va, end = rf.va, rf.end if limit is None else min(rf.end, rf.va + limit)
        for odd in range(rf.va + 1, min(end, rf.va + 4096), 97):  # some code decoded misaligned first
            got = fast.fast_chunk(odd)
            assert (got if got else fast.decode_chunk(odd)) == exact.decode_chunk_exact(odd), hex(odd)
        while va < end:
            got = fast.fast_chunk(va)
            whole += bool(got)
            got = got if got else fast.decode_chunk(va)
            assert got == exact.decode_chunk_exact(va), hex(va)
            va = got[0] if got is not None and got[0] > va else va + 1
    for rf, rx in zip(fast_map.regions, exact_map.regions, strict=True):
        assert rf.state == rx.state
    assert (fast.x_src, fast.x_dst, fast.x_kind) == (exact.x_src, exact.x_dst, exact.x_kind)
    return whole


@pytest.mark.parametrize("opt,pie", [("-O2", True), ("-O0", False)])
def test_scanner_chunks_match_the_exact_decoder(compile_c, opt: str, pie: bool) -> None:
    assert _sweep_with_scanner(compile_c("callbacks.c", opt, pie)) > 10


def test_scanner_chunks_match_the_exact_decoder_on_libc() -> None:
    if not LIBC.exists():
        pytest.skip(f"{LIBC} is absent")
    assert _sweep_with_scanner(LIBC, limit=300_000) > 10_000


def test_scanner_answers_none_outside_the_regions_and_false_on_decoded_code(compile_c) -> None:
    image = parse_path(str(compile_c("sample.c", "-O2", True)))
    backend = X.X86Backend(image, CodeMap(image))
    first = backend.codemap.regions[0]
    assert backend.fast_chunk(0) is None and backend.fast_chunk(1 << 70) is None
    got = backend.fast_chunk(first.va)
    assert got and got[0] > first.va
    assert backend.fast_chunk(first.va) is False  # decoded now: the Python path decides (chunk split)


def test_an_analysis_leaves_nothing_behind_once_collected(compile_c, monkeypatch) -> None:  # noqa: ANN001
    """The scanner holds the backend's callback and the backend holds the scanner: a cycle the
    collector must be able to free (it held each analysis's code map, ~2.9 MiB for libc, for the
    life of a server that analyses in-process)."""
    import gc
    import weakref

    from binlens.analysis import analyze, engine
    from binlens.analysis.codemap import CodeMap
    from binlens.loader.parse_lief import parse_path

    made: list[weakref.ref] = []

    def tracked(image: object) -> CodeMap:
        codemap = CodeMap(image)  # type: ignore[arg-type]
        made.append(weakref.ref(codemap))
        return codemap

    monkeypatch.setattr(engine, "CodeMap", tracked)
    image = parse_path(str(compile_c("sample.c", "-O2", True, strip=True)))
    for _ in range(2):
        analyze(image)
    gc.collect()
    assert len(made) == 2 and all(ref() is None for ref in made)
