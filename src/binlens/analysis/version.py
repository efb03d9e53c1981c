"""The engine's version, apart from the engine: the stored analysis records it, and a process that
only reads stored analyses (the CLI, a server) checks it without importing the engine."""

ENGINE_VERSION = "11"  # 2: AArch64 jump tables; 3: ARM32, MIPS, PowerPC, RISC-V and more x86 jump-table
# shapes, ARM Thumb starts and BE8, code offsets looked at again after later stages; 4: gaps on every
# architecture, `.ARM.exidx`, address pairs, relocated words only in position-independent data;
# 5: computed-goto tables, ARM32 leaf trials and shrink-wrapped pushes, gaps peeled in one round,
# RISC-V and ARM PLT thunks; 6: MIPS imports, stubs and calls through the GOT, PowerPC and PPC64
# call stubs, PPC64 ELFv2 local entries and ELFv1 descriptors, ARM Thumb computed gotos and veneers,
# MIPS `bal` PC reads, sizes across literal pools, unwind ranges end at the next start; 7: callers
# of non-returning functions found in the same round (no chain cut short by the round limit), a
# function that calls itself judged without the edges back from those calls; 8: ARM32 Mach-O
# functions are `LC_FUNCTION_STARTS` where it covers, no x86 data reference from an instruction
# without a memory operand (iced keeps imm64's high half and `enter`'s level where a displacement is);
# 9: branch targets wrap at the address width (ARM code at 2**31 and above, branches below 0), a MIPS
# delay slot that starts another chunk keeps its mark (no chunk split at an address it does not hold);
# 10 (loader): each slice of a universal Mach-O read at its own file offset; Mach-O imports from
# `LC_DYLD_INFO` bind opcodes, and stubs named from the indirect symbol table; 11: data inside a PE's
# code sections (`Image.data_ranges`: directories, unwind records, relocated words, strings) is
# neither decoded nor a function start, and its strings are listed
