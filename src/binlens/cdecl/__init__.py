"""C declarations: a program's type system (pycparser), layout per ABI, and value decoding."""

from binlens.cdecl.abi import Abi, abi_for
from binlens.cdecl.ctype import CType, Field
from binlens.cdecl.parse import DeclarationError, Definition
from binlens.cdecl.system import TypeSystem

__all__ = ["Abi", "CType", "DeclarationError", "Definition", "Field", "TypeSystem", "abi_for"]
