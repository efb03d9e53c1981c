"""The API: one registry of dotted methods. Each domain module (`components.DOMAINS`) registers its
methods when imported; the registry imports them as they are first needed (`Registry`), or all at
once with `load_domains`."""

from binlens.api.registry import REGISTRY, CallContext, invoke


def load_domains() -> None:
    """Import every domain module in this package (each registers its methods)."""
    REGISTRY.load_all()


__all__ = ["REGISTRY", "CallContext", "invoke", "load_domains"]
