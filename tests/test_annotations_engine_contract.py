"""function.create / function.delete against the engine's interface, before the engine is merged.

The analysis engine is being built on another branch. It will attach itself as
`prog.extensions["analysis"]` with `function_at(va)`, `define_function(va)` and
`undefine_function(va)`. This test attaches a minimal implementation of that interface over the
image's real function symbols, to check the annotation side of the contract: the journal entry,
the conflict and not_found rules, and that undo/redo call the engine back. Replace it with the
real engine once both branches are merged.
"""

from __future__ import annotations

from typing import Any

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError


class SymbolTableEngine:
    """The engine interface the annotation layer calls, over the image's function symbols."""

    def __init__(self, prog: Any) -> None:
        self.starts = {s.address for s in prog.image.symbols if s.kind == "function"}
        self.calls: list[tuple[str, int]] = []

    def function_at(self, va: int) -> int | None:
        return va if va in self.starts else None

    def define_function(self, va: int) -> None:
        self.starts.add(va)
        self.calls.append(("define", va))

    def undefine_function(self, va: int) -> None:
        self.starts.discard(va)
        self.calls.append(("undefine", va))


def test_function_create_delete_and_undo_drive_the_engine(workspace, compile_c):
    prog = workspace.open(compile_c("sample.c", "-O0"), check_roots=False)
    engine = SymbolTableEngine(prog)
    prog.extensions["analysis"] = engine
    main = prog.resolve("main", "/")
    fib = prog.resolve("fib", "/")

    out = invoke(workspace, "function.create", {"selector": {"address": hex(main + 8)}, "name": "inner_part"})
    assert out["name"] == "inner_part" and engine.calls == [("define", main + 8)]
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "function.create", {"selector": {"address": hex(main + 8)}})
    assert err.value.code == "conflict"
    invoke(workspace, "function.patch", {"selector": {"name": "inner_part"}, "prototype": "void inner_part(void)"})

    invoke(workspace, "function.delete", {"selector": {"name": "fib"}})
    assert engine.calls[-1] == ("undefine", fib)
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "function.patch", {"selector": {"name": "fib"}, "name": "gone"})
    assert err.value.code == "not_found"

    invoke(workspace, "journal.undo", {})  # the delete
    assert engine.calls[-1] == ("define", fib)
    invoke(workspace, "journal.redo", {})
    assert engine.calls[-1] == ("undefine", fib)
    invoke(workspace, "journal.undo", {"count": 3})  # delete, patch, create
    assert engine.calls[-2:] == [("define", fib), ("undefine", main + 8)]
    assert main + 8 not in prog.user_names
