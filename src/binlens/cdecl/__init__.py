"""C declarations: a program's type system (pycparser), layout per ABI, and value decoding."""

from binlens.cdecl.abi import Abi, abi_for
from binlens.cdecl.ctype import CType, Field
from binlens.cdecl.system import DeclarationError, Definition, TypeSystem

__all__ = ["Abi", "CType", "DeclarationError", "Definition", "Field", "TypeSystem", "abi_for"]
