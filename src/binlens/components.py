"""The components that plug into lower layers, listed in one place, in the order they run.

- `MIGRATIONS`: the program database's schema components (`store/database.py` applies their
  ordered steps on open, component by component in this order).
- `LEDGER_MIGRATIONS`: the schema components of the evidence ledgers' database
  (`$BINLENS_HOME/evidence.sqlite`, `store/evidence.py`), applied the same way.
- `OPEN_HOOKS`: what attaches per-program state when a program opens (`Workspace.open` runs
  them in this order).
- `DOMAINS`: the API's domain modules, each registering its methods when imported
  (`api/registry.py` imports one when a method of its namespace is first looked up, all of them
  when the methods are listed).
- `PROVIDERS`: the deep engines (disassemblers, decompilers, debuggers) a method may require
  (`providers/registry.py` loads them on first use; `auto` picks the first available one of a
  kind in this order).

Entries name their module instead of importing it: the layer that uses a table loads the entries
when it first needs them (`load`), so nothing depends on which module happened to be imported
first, a lower layer imports no module above it (the import contracts in pyproject.toml), and a
command loads only what it uses.
"""

from __future__ import annotations

import sys
from typing import Any

# component name -> "module:attribute" of its ordered list of migration steps
MIGRATIONS: tuple[tuple[str, str], ...] = (
    ("core", "binlens.store.database:CORE_MIGRATIONS"),
    ("annotations", "binlens.store.annotations:MIGRATIONS"),
    ("analysis", "binlens.store.analysis:ANALYSIS_MIGRATIONS"),
    ("fingerprints", "binlens.store.fingerprints:MIGRATIONS"),
    ("decompilation", "binlens.store.decompilation:MIGRATIONS"),
)

# the evidence ledgers live in one database per home, not in a program's: their components
LEDGER_MIGRATIONS: tuple[tuple[str, str], ...] = (("evidence", "binlens.store.evidence:MIGRATIONS"),)

# "module:function" of each open hook, called as hook(workspace, program)
OPEN_HOOKS: tuple[str, ...] = (
    "binlens.api.calls:on_open",  # the calls running on the program (closing it cancels and drains them)
    "binlens.api.edits:on_open",  # the annotation store, user names, the patch overlay
    "binlens.jobs.state:on_open",  # the analysis state (stored analysis or a background run)
)

# the modules of `binlens.api` that register methods (a method's namespace names its module
# where they agree: `function.list` -> `binlens.api.function`)
DOMAINS: tuple[str, ...] = (
    "address",
    "analysis",
    "annotations",
    "batch",
    "bookmark",
    "breakpoint",
    "comment",
    "compare",
    "corpus",
    "data_type",
    "debug",
    "debug_process",
    "decompilation",
    "disassembly",
    "evidence",
    "function",
    "function_call",
    "function_edit",
    "global_variable",
    "instruction",
    "interface",
    "journal",
    "live",
    "live_gdb",
    "memory",
    "patch",
    "program",
    "provider",
    "reference",
    "register",
    "session",
    "signature",
    "string",
    "symbol",
    "symbol_edit",
)

# "module:attribute" of each provider object (`binlens.providers.base.Provider`)
PROVIDERS: tuple[str, ...] = (
    "binlens.providers.objdump:PROVIDER",
    "binlens.providers.gdb:PROVIDER",
    "binlens.providers.angr:PROVIDER",
)


def load(ref: str) -> Any:
    """The object a "module:attribute" entry names, importing its module."""
    module, _, attr = ref.partition(":")
    __import__(module)  # (the import statement's path: `python -X importtime` reports it, not importlib's)
    return getattr(sys.modules[module], attr)
