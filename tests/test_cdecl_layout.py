"""C type layout checked against real compilers: static asserts per target ABI, bit-fields at run time."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from binlens.cdecl import TypeSystem
from binlens.cdecl.abi import ILP32, ILP32_I386, ILP32_WIN, LLP64, LP64, LP64_ARM, Abi
from binlens.cdecl.ctype import CType
from binlens.cdecl.decode import decode

DECLS = """
struct a { char c; int i; short s; };
struct b { char c; double d; char e; };
struct c { char c; long long ll; long l; };
union u { char c[5]; int i; double d; };
struct bits { unsigned char k; unsigned int len : 12, flags : 4; unsigned int z : 20; struct a *next; char tail[]; };
struct mixed { char a; int b : 3; char c; unsigned long long big : 40; short s : 5; };
struct nested { struct a x; union u y; char z[3]; long double ld; };
enum e { E0, E1 = 100, E2 };
struct withenum { char c; enum e e; short t[3]; };
typedef struct { int x; short y; } anon_t;
struct holder { anon_t p[3]; void (*fn)(int); unsigned short w; };
struct node { struct node *next; int (*cmp)(const struct node *, const struct node *); };
"""
NAMES = [
    "struct a",
    "struct b",
    "struct c",
    "union u",
    "struct bits",
    "struct mixed",
    "struct nested",
    "struct withenum",
    "anon_t",
    "struct holder",
    "struct node",
]

TARGETS: list[tuple[str, Abi, list[str]]] = [
    ("gcc x86-64 (LP64)", LP64, ["cc"]),
    ("gcc -m32 (i386 System V)", ILP32_I386, ["cc", "-m32"]),
    ("clang x86_64 Windows (LLP64)", LLP64, ["clang", "-target", "x86_64-pc-windows-msvc"]),
    ("clang i686 Windows", ILP32_WIN, ["clang", "-target", "i686-pc-windows-msvc"]),
    ("clang aarch64 Linux", LP64_ARM, ["clang", "-target", "aarch64-linux-gnu"]),
    ("clang armv7 Linux", ILP32, ["clang", "-target", "armv7-linux-gnueabihf"]),
]


def system(abi: Abi) -> TypeSystem:
    ts = TypeSystem(abi)
    defs = ts.parse(DECLS)
    return TypeSystem(abi, [(d.name, d.kind, "/test", d.declaration) for d in defs])


def assertions(ts: TypeSystem) -> str:
    lines = [DECLS]
    for name in NAMES:
        t = ts.resolve(name)
        s = t.strip()
        lines.append(f'_Static_assert(sizeof({name}) == {t.size}, "sizeof {name}");')
        lines.append(f'_Static_assert(_Alignof({name}) == {t.align}, "alignof {name}");')
        for f in s.fields or []:
            if f.bit_size is None and f.name:
                lines.append(
                    f'_Static_assert(__builtin_offsetof({name}, {f.name}) == {f.offset}, "offsetof {name}.{f.name}");'
                )
    lines.append(f'_Static_assert(sizeof(enum e) == {ts.resolve("enum e").size}, "enum");')
    lines.append(f'_Static_assert(sizeof(long) == {ts.resolve("long").size}, "long");')
    lines.append(f'_Static_assert(sizeof(long double) == {ts.resolve("long double").size}, "long double");')
    lines.append(f'_Static_assert(_Alignof(long long) == {ts.resolve("long long").align}, "ll align");')
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("label,abi,cmd", TARGETS, ids=[t[0] for t in TARGETS])
def test_layout_matches_the_compiler(tmp_path: Path, label: str, abi: Abi, cmd: list[str]) -> None:
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} is not installed")
    src = tmp_path / "layout.c"
    src.write_text(assertions(system(abi)))
    probe = subprocess.run([*cmd, "-fsyntax-only", "-x", "c", "-"], input="int x;", capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"{label} cannot compile here: {probe.stderr.strip()[:200]}")
    proc = subprocess.run([*cmd, "-std=c11", "-fsyntax-only", str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_bitfield_positions_match_gcc_at_run_time(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    ts = system(LP64)
    probes = []
    for name in ("struct bits", "struct mixed"):
        for f in ts.resolve(name).strip().fields or []:
            if f.bit_size is not None:
                probes.append((name, f.name, f.offset * 8 + (f.bit_offset or 0), f.bit_size))
    body = []
    for name, fld, _, _ in probes:
        body.append(
            f"{{ {name} v; memset(&v, 0, sizeof v); v.{fld} = -1; unsigned char *b = (unsigned char *)&v; "
            f"int lo = -1, n = 0; for (unsigned i = 0; i < sizeof v * 8; i++) if (b[i / 8] >> (i % 8) & 1) "
            f'{{ if (lo < 0) lo = i; n++; }} printf("[\\"{name}\\", \\"{fld}\\", %d, %d],", lo, n); }}'
        )
    src = tmp_path / "bits.c"
    src.write_text(
        "#include <stdio.h>\n#include <string.h>\n"
        + DECLS
        + 'int main(void) { printf("[");'
        + "\n".join(body)
        + 'printf("null]\\n"); return 0; }\n'
    )
    exe = tmp_path / "bits"
    subprocess.run([cc, "-o", str(exe), str(src)], check=True, capture_output=True)
    got = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)[:-1]
    assert [tuple(x) for x in got] == probes


def test_decode_through_types() -> None:
    ts = system(LP64)
    t: CType = ts.resolve("struct a")
    data = bytes([0x41, 0, 0, 0]) + (-5).to_bytes(4, "little", signed=True) + (300).to_bytes(2, "little") + b"\0\0"
    assert decode(t, data, "little") == {"c": 0x41, "i": -5, "s": 300}
    bits = ts.resolve("struct bits")
    raw = bytearray(bits.size or 0)
    value = (0xABC << 8) | (0x5 << 20)
    raw[0:4] = value.to_bytes(4, "little")
    out = decode(bits, bytes(raw), "little")
    assert out["len"] == 0xABC and out["flags"] == 5
    e = ts.resolve("struct withenum")
    assert decode(e, bytes([1, 0, 0, 0, 100, 0, 0, 0, 1, 0, 2, 0, 3, 0, 0, 0]), "little")["e"] == "E1"
    assert decode(ts.parse_type_name("char [8]"), b"hi\0junk!", "little") == "hi"
    assert decode(ts.parse_type_name("double"), struct.pack("<d", 1.5), "little") == 1.5
    assert decode(ts.parse_type_name("unsigned short"), b"\x01\x02", "big") == 0x102
