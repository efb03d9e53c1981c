"""The API: one registry of dotted methods. Importing this package registers every domain."""

import importlib
import pkgutil

from binlens.api.registry import REGISTRY, CallContext, invoke

_SKIP = {"registry", "models", "errors", "cursor", "pages", "common"}


def load_domains() -> None:
    """Import every domain module in this package (each registers its methods)."""
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _SKIP and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


load_domains()

__all__ = ["REGISTRY", "CallContext", "invoke"]
