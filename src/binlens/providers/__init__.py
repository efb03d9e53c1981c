"""Deep engines discovered at run time (a decompiler, a debugger, a second disassembler), each
session in its own process. The package's modules are imported where used: this file imports
nothing, so a command that needs no provider pays nothing for them."""
