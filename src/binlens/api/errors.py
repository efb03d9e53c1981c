"""Errors as the API layer names them (defined at the bottom layer, `binlens.errors`)."""

from binlens.errors import STATUS, BinlensError, invalid, not_found, pointer

__all__ = ["STATUS", "BinlensError", "invalid", "not_found", "pointer"]
