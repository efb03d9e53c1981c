"""program_language.*: the program's processor language and compiler spec, as Ghidra names them.

Ghidra identifies a program's instruction set by a language id `processor:endian:size:variant`
(`x86:LE:64:default`, `AARCH64:LE:64:v8A`, `ARM:LE:32:v8T`, `MIPS:BE:32:default`) and the
calling conventions and data model by a compiler spec id (`gcc`, `windows`, `default`, ...). The
choice here follows Ghidra's loader opinions for the image's format, architecture, endianness and
word size, so a client that drives Ghidra (or reads a Ghidra export) gets the same names.
"""

from __future__ import annotations

from pydantic import Field

from binlens.api.common import ProgramIdentity
from binlens.api.models import Params, ProgramRef, Result
from binlens.api.registry import READ_ONLY, method
from binlens.errors import BinlensError
from binlens.loader.image import Identity
from binlens.workspace import Workspace

# binlens arch -> Ghidra processor name
_PROCESSORS = {
    "x86-64": "x86",
    "x86": "x86",
    "aarch64": "AARCH64",
    "arm": "ARM",
    "mips": "MIPS",
    "ppc": "PowerPC",
    "riscv": "RISCV",
}


class ProgramLanguageParams(Params):
    program: ProgramRef | None = None


class ProgramLanguage(Result):
    """The program's language and compiler spec in Ghidra's terms."""

    program: ProgramIdentity
    language_id: str = Field(description="Ghidra's language id, e.g. 'x86:LE:64:default'.")
    processor: str = Field(description="Ghidra's processor name: x86, AARCH64, ARM, MIPS, PowerPC, RISCV.")
    endian: str = Field(description="LE or BE.")
    size: int = Field(description="Address size in bits.")
    variant: str = Field(description="The language variant: default, v8A, v8, v8T, RV64GC, AppleSilicon...")
    compiler_spec_id: str = Field(description="Ghidra's compiler spec id: gcc, windows, default, macosx...")


def _variant(ident: Identity, processor: str) -> str:
    if processor == "AARCH64":
        return "AppleSilicon" if ident.format == "MachO" else "v8A"
    if processor == "ARM":
        # PE on ARM (ARMNT) is Thumb-2 only; elsewhere a Thumb entry point (odd address) says Thumb
        return "v8T" if ident.format == "PE" or ident.entry & 1 else "v8"
    if processor == "RISCV":
        return f"RV{ident.bits}GC"
    return "default"


def _compiler(ident: Identity, processor: str) -> str:
    if ident.format == "PE":
        return "windows"
    if processor == "PowerPC" and ident.format == "MachO":
        return "macosx"
    if processor in ("x86", "RISCV"):
        return "gcc"
    return "default"


def language_of(ident: Identity) -> tuple[str, str, str, int, str, str]:
    """(language id, processor, endian, size, variant, compiler spec id) of an image, or `unsupported`."""
    processor = _PROCESSORS.get(ident.arch)
    if processor is None or ident.bits not in (32, 64):
        raise BinlensError(
            "unsupported", f"no Ghidra language for architecture {ident.arch!r} ({ident.bits}-bit)", target="/params"
        )
    endian = "BE" if ident.endian == "big" else "LE"
    variant = _variant(ident, processor)
    return (
        f"{processor}:{endian}:{ident.bits}:{variant}",
        processor,
        endian,
        ident.bits,
        variant,
        _compiler(ident, processor),
    )


@method("program_language.get", effect=READ_ONLY)
def program_language_get(ws: Workspace, p: ProgramLanguageParams) -> ProgramLanguage:
    """The program's Ghidra language id (e.g. x86:LE:64:default) and compiler spec id (gcc, windows, default)."""
    prog = ws.program(p.program)
    lang, processor, endian, size, variant, compiler = language_of(prog.image.identity)
    return ProgramLanguage(
        program=ProgramIdentity(**prog.identity),
        language_id=lang,
        processor=processor,
        endian=endian,
        size=size,
        variant=variant,
        compiler_spec_id=compiler,
    )
