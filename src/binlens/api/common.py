"""Result shapes shared by several domains: program identity."""

from __future__ import annotations

from pydantic import Field

from binlens.api.models import HexAddress, Result


class ProgramIdentity(Result):
    """Who a program is; carried by every response that concerns one."""

    program: str = Field(description="Handle to pass as 'program'.")
    sha256: str
    size: int
    format: str
    arch: str
    bits: int
    endian: str
    image_base: HexAddress | None = Field(
        description="The preferred load address; null when nothing is loadable (an ELF file without PT_LOAD)."
    )
    entry: HexAddress
    file_name: str
    slice: str | None = None
