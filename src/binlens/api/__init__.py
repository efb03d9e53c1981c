"""The API: one registry of dotted methods. Each domain module registers its methods when imported;
the registry imports them as they are first needed (`Registry`), or all at once with `load_domains`.
The modules that hook into opening a program (`workspace.OPEN_HOOKS`: the analysis state; the
annotations, patches and listing comments of `edits`) load with the package, whatever is called."""

import binlens.api.edits  # noqa: F401 - its open hook
import binlens.program_analysis  # noqa: F401 - its open hook
from binlens.api.registry import REGISTRY, CallContext, invoke


def load_domains() -> None:
    """Import every domain module in this package (each registers its methods)."""
    REGISTRY.load_all()


__all__ = ["REGISTRY", "CallContext", "invoke", "load_domains"]
