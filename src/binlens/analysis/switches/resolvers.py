"""The jump-table resolvers: the `Resolver` Protocol and one `RESOLVERS` row per ISA.

A resolver reads the table behind one indirect jump: given the backend, the code map, the
start of the slice (the jump's chunk and the chunks that guard it) and the (chunk start, chunk
end) pairs walked before it, it returns the case targets, the table's address (0 when none was
read) and whether a bound check guards the jump. Each resolver takes the backend of its ISA
(`CapstoneBackend`, `X86Backend`: the row's architecture decides which). State a resolver keeps
between calls (the MIPS `_gp`, the PowerPC function extents and PIC registers) lives in its module,
in a `common.PerBackend` keyed weakly by the backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from binlens.analysis.codemap import CodeMap
    from binlens.analysis.decode.backend import Backend


class Resolver(Protocol):
    """One ISA's jump-table reader."""

    def __call__(
        self, backend: Backend, codemap: CodeMap, slice_start: int, jump_va: int, earlier: list[tuple[int, int]]
    ) -> tuple[list[int], int, bool]:
        """(case targets, table address or 0, guarded) of the indirect jump at `jump_va`."""
        ...


# architecture -> "module:function" of its resolver (imported when an image of that ISA is analysed)
RESOLVERS: dict[str, str] = {
    "x86-64": "binlens.analysis.switches.x86:jump_table_targets",
    "x86": "binlens.analysis.switches.x86:jump_table_targets",
    "aarch64": "binlens.analysis.switches.aarch64:a64_jump_table_targets",
    "arm": "binlens.analysis.switches.arm:arm_jump_table_targets",
    "mips": "binlens.analysis.switches.mips:mips_jump_table_targets",
    "ppc": "binlens.analysis.switches.ppc:ppc_jump_table_targets",
    "riscv": "binlens.analysis.switches.riscv:riscv_jump_table_targets",
}


def resolver_for(arch: str) -> Resolver | None:
    """The jump-table resolver of `arch`, or None where jump tables are not read."""
    where = RESOLVERS.get(arch)
    if where is None:
        return None
    module, _, name = where.partition(":")
    fn: Resolver = getattr(importlib.import_module(module), name)
    return fn
