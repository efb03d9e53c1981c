"""Data models (ABIs): sizes and alignments of C's scalar types per target.

LP64 for 64-bit Unix (x86-64/AArch64 Linux, Mach-O), LLP64 for 64-bit Windows PE, and the
32-bit models (i386 System V keeps 8-byte scalars 4-aligned inside structs; Win32 and 32-bit ARM
align them to 8).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# canonical scalar names
SCALARS = (
    "void",
    "_Bool",
    "char",
    "signed char",
    "unsigned char",
    "short",
    "unsigned short",
    "int",
    "unsigned int",
    "long",
    "unsigned long",
    "long long",
    "unsigned long long",
    "__int128",
    "unsigned __int128",
    "float",
    "double",
    "long double",
)


@dataclass(frozen=True)
class Abi:
    """Sizes and alignments of scalars and pointers, plus the bit-field layout rule."""

    name: str
    pointer: int
    sizes: dict[str, tuple[int, int]] = field(hash=False)
    bitfields: str = "sysv"  # "sysv" (gcc/clang) or "msvc"
    wchar: str = "int"  # the type wchar_t stands for
    conventions: tuple[str, ...] = ("default",)

    def scalar(self, name: str) -> tuple[int, int]:
        """(size, alignment) of a canonical scalar name."""
        return self.sizes[name]


def _sizes(long: int, ll_align: int, double_align: int, ldouble: tuple[int, int]) -> dict[str, tuple[int, int]]:
    return {
        "void": (1, 1),
        "_Bool": (1, 1),
        "char": (1, 1),
        "signed char": (1, 1),
        "unsigned char": (1, 1),
        "short": (2, 2),
        "unsigned short": (2, 2),
        "int": (4, 4),
        "unsigned int": (4, 4),
        "long": (long, long),
        "unsigned long": (long, long),
        "long long": (8, ll_align),
        "unsigned long long": (8, ll_align),
        "__int128": (16, 16),
        "unsigned __int128": (16, 16),
        "float": (4, 4),
        "double": (8, double_align),
        "long double": ldouble,
    }


LP64 = Abi("LP64", 8, _sizes(8, 8, 8, (16, 16)), conventions=("default", "sysv", "cdecl"))
LP64_ARM = Abi("LP64", 8, _sizes(8, 8, 8, (16, 16)), conventions=("default", "aapcs64", "cdecl"))
LLP64 = Abi(
    "LLP64",
    8,
    _sizes(4, 8, 8, (8, 8)),
    bitfields="msvc",
    wchar="unsigned short",
    conventions=("default", "ms", "cdecl"),
)
ILP32_I386 = Abi(
    "ILP32",
    4,
    _sizes(4, 4, 4, (12, 4)),
    conventions=("default", "cdecl", "stdcall", "fastcall", "thiscall", "regparm"),
)
ILP32_WIN = Abi(
    "ILP32",
    4,
    _sizes(4, 8, 8, (8, 8)),
    bitfields="msvc",
    wchar="unsigned short",
    conventions=("default", "cdecl", "stdcall", "fastcall", "thiscall", "vectorcall"),
)
ILP32 = Abi("ILP32", 4, _sizes(4, 8, 8, (8, 8)), conventions=("default", "cdecl"))


def abi_for(fmt: str, arch: str, bits: int) -> Abi:
    """The data model of a program from its identity (format, arch, bits)."""
    if bits == 64:
        if fmt == "PE":
            return LLP64
        return LP64_ARM if arch == "aarch64" else LP64
    if fmt == "PE":
        return ILP32_WIN
    return ILP32_I386 if arch == "x86" else ILP32
