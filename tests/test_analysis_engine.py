"""Ground truth for the engine: binaries the tests compile, stripped vs unstripped, and objdump."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from binlens.analysis import ProgramAnalysis, analyze
from binlens.loader.parse_lief import parse_path

VARIANTS = [("-O0", True), ("-O0", False), ("-O2", True), ("-O2", False)]


def _truth(path: Path) -> dict[int, str]:
    """FUNC symbols of an unstripped build (gcc's `.cold` parts are pieces of functions, not functions)."""
    img = parse_path(str(path))
    return {s.address: s.name for s in img.symbols if s.kind == "function" and ".cold" not in s.name}


def _analyse(path: Path) -> ProgramAnalysis:
    return analyze(parse_path(str(path)))


def _starts(a: ProgramAnalysis) -> set[int]:
    return {f.address for f in a.functions if not f.thunk_name}


@pytest.mark.parametrize("opt,pie", VARIANTS)
def test_every_function_of_the_unstripped_build_is_found_in_the_stripped_one(compile_c, opt, pie):
    truth = _truth(compile_c("sample.c", opt, pie))
    found = _starts(_analyse(compile_c("sample.c", opt, pie, strip=True)))
    missing = {hex(a): n for a, n in truth.items() if a not in found}
    assert not missing, f"functions not found: {missing}"
    extra = sorted(hex(a) for a in found - set(truth))
    assert not extra, f"function starts that are not functions: {extra}"


@pytest.mark.parametrize("opt,pie", [("-O0", False), ("-O2", True), ("-O2", False)])
def test_discovery_without_unwind_tables(compile_c, opt, pie):
    extra = ("-fno-asynchronous-unwind-tables", "-fno-unwind-tables")
    truth = _truth(compile_c("nounwind.c", opt, pie, extra=extra))
    found = _starts(_analyse(compile_c("nounwind.c", opt, pie, strip=True, extra=extra)))
    missing = {hex(a): n for a, n in truth.items() if a not in found}
    assert not missing, f"functions not found: {missing}"
    assert found <= set(truth), sorted(hex(a) for a in found - set(truth))


def _objdump(path: Path) -> str:
    if shutil.which("objdump") is None:
        pytest.skip("objdump is not installed")
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True).stdout


@pytest.mark.parametrize("opt,pie", [("-O0", True), ("-O2", False)])
def test_switch_of_twelve_cases_has_all_case_targets_in_its_cfg(compile_c, opt, pie):
    truth = {n: a for a, n in _truth(compile_c("sample.c", opt, pie)).items()}
    a = _analyse(compile_c("sample.c", opt, pie, strip=True))
    f = next(f for f in a.functions if f.address == truth["classify"])
    targets = {e.dst for e in f.edges if e.kind == "jump_table"}
    block_starts = {b.start for b in f.blocks}
    # cases 0..11 return distinct values, so the table has 12 distinct targets, all blocks of classify
    assert len(targets) == 12, sorted(map(hex, targets))
    assert targets <= block_starts
    assert all(f.address <= t < f.address + f.size for t in targets)
    # and every instruction objdump shows inside classify belongs to one of its blocks
    text = _objdump(compile_c("sample.c", opt, pie))
    body = text.split("<classify>:\n", 1)[1].split("\n\n", 1)[0]
    for line in body.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)", line)
        if m and not m.group(2).startswith("nop") and m.group(2) not in ("xchg", "cs", "data16"):
            va = int(m.group(1), 16)
            assert any(b.start <= va < b.end for b in f.blocks), f"{hex(va)} of classify is in no block: {line}"


def test_a_bound_check_with_a_store_between_compare_and_branch_guards_its_table(compile_c):
    """`cmp $11, %eax; mov %r14, 0x38(%rsp); ja default; jmp *table(,%rax,8)` (clang -O2's
    scheduling): the compare is still the bound, so the table is read for its 12 entries and not
    past them, and its absolute entries in .rodata are case labels, not function pointers."""
    truth = {n: a for a, n in _truth(compile_c("switch_sched.S", "-O2", False)).items()}
    a = _analyse(compile_c("switch_sched.S", "-O2", False, strip=True))
    f = next(f for f in a.functions if f.address == truth["dispatch"])
    targets = {e.dst for e in f.edges if e.kind == "jump_table"}
    assert len(targets) == 12, sorted(map(hex, targets))
    assert targets <= {b.start for b in f.blocks}
    assert {g.address for g in a.functions} & targets == set(), "case labels taken as functions"


@pytest.mark.parametrize("opt,pie", [("-O0", True), ("-O2", True), ("-O2", False)])
def test_references_to_a_known_string_are_found(compile_c, opt, pie):
    truth = {n: a for a, n in _truth(compile_c("sample.c", opt, pie)).items()}
    a = _analyse(compile_c("sample.c", opt, pie, strip=True))
    s = next(s for s in a.strings if s.text == "unique marker string for xrefs")
    refs = [x for x in a.xrefs if x.dst == s.address]
    assert len(refs) == 1 and refs[0].kind == "string"
    assert a.function_at(refs[0].src).address == truth["main"]
    greeting = next(s for s in a.strings if s.text == "binlens sample greeting")
    assert any(x.kind == "string" for x in a.xrefs if x.dst == greeting.address)  # the pointer in .data


def _objdump_calls(text: str) -> set[tuple[int, int]]:
    """(caller function, callee) of every direct call objdump shows in an unstripped build."""
    out = set()
    current = None
    for line in text.splitlines():
        m = re.match(r"^([0-9a-f]+) <([^>]+)>:$", line)
        if m:
            current = int(m.group(1), 16)
            continue
        m = re.match(r"\s*[0-9a-f]+:\s+call\s+([0-9a-f]+) <", line)
        if m and current is not None:
            out.add((current, int(m.group(1), 16)))
    return out


@pytest.mark.parametrize("opt,pie", [("-O0", True), ("-O0", False), ("-O2", True)])
def test_callers_of_known_functions_are_exact(compile_c, opt, pie):
    names = _truth(compile_c("sample.c", opt, pie))
    by_name = {n: a for a, n in names.items()}
    calls = _objdump_calls(_objdump(compile_c("sample.c", opt, pie)))
    a = _analyse(compile_c("sample.c", opt, pie, strip=True))
    ours = {(f.address, callee) for f in a.functions for _site, callee in f.call_pairs()}
    for name in ("classify", "fib", "checksum", "die", "add_numbers"):
        callee = by_name[name]
        expected = {caller for caller, c in calls if c == callee}
        got = {caller for caller, c in ours if c == callee}
        assert got == expected, f"callers of {name}: {sorted(map(hex, got))} != {sorted(map(hex, expected))}"


def test_plt_thunks_carry_import_names(compile_c):
    unstripped = compile_c("sample.c", "-O2", True)
    text = _objdump(unstripped)
    plt = {int(m.group(1), 16): m.group(2) for m in re.finditer(r"^([0-9a-f]+) <(\w+)@plt>:$", text, re.M)}
    assert plt, "objdump shows no PLT entries"
    a = _analyse(compile_c("sample.c", "-O2", True, strip=True))
    thunks = {f.address: f.thunk_name for f in a.functions if f.thunk_name}
    for va, name in plt.items():
        assert thunks.get(va) == name, f"{hex(va)} should be the thunk of {name}"
    exit_thunk = next(f for f in a.functions if f.thunk_name == "exit")
    assert exit_thunk.noreturn
    die = next(f for f in a.functions if f.address == {n: v for v, n in _truth(unstripped).items()}["die"])
    assert die.noreturn


@pytest.mark.parametrize("pie", [True, False])
def test_a_chain_of_non_returning_callers_deeper_than_the_rounds(compile_c, pie):
    """die0 calls exit; die1..die12 each return only if the one they call does (an unreachable
    `leave; ret` after each call at -O0). All thirteen are found not to return, main is not."""
    names = {n: v for v, n in _truth(compile_c("noret_chain.c", "-O0", pie)).items()}
    a = _analyse(compile_c("noret_chain.c", "-O0", pie, strip=True))
    noret = {f.address: f.noreturn for f in a.functions}
    for level in range(13):
        assert noret.get(names[f"die{level}"]) is True, f"die{level} should not return"
    assert noret[names["main"]] is False
    assert _edges_after_call(a, names["main"], names["die12"]) == [], "the call to die12 ends its block"


def test_bodies_agree_with_the_non_returning_set_when_the_rounds_run_out(compile_c, monkeypatch):
    """With one round only, the functions found not to return in it still cut the edges after the
    calls to them: the bodies are walked again with what the round learnt."""
    from binlens.analysis import engine

    monkeypatch.setattr(engine, "ROUNDS", 1)
    names = {n: v for v, n in _truth(compile_c("noret_chain.c", "-O0", True)).items()}
    a = _analyse(compile_c("noret_chain.c", "-O0", True, strip=True))
    assert next(f for f in a.functions if f.address == names["die12"]).noreturn
    assert _edges_after_call(a, names["main"], names["die12"]) == [], "an edge after a call that does not return"


def _edges_after_call(a: ProgramAnalysis, caller: int, callee: int) -> list:
    """The CFG edges out of the block of `caller` that ends with its call to `callee`."""
    f = next(f for f in a.functions if f.address == caller)
    site = next(s for s, c in f.call_pairs() if c == callee)
    block = next(b for b in f.blocks if b.start <= site < b.end)
    assert block.terminator == "call"
    return [e for e in f.edges if e.src == block.start]


def test_analysis_is_deterministic(compile_c):
    path = compile_c("sample.c", "-O2", True, strip=True)
    one, two = _analyse(path), _analyse(path)
    assert [(f.address, f.size, f.sources) for f in one.functions] == [
        (f.address, f.size, f.sources) for f in two.functions
    ]
    assert one.xrefs == two.xrefs


def test_instruction_model(compile_c):
    from binlens.analysis import make_backend
    from binlens.analysis.codemap import CodeMap

    path = compile_c("sample.c", "-O0", False)
    img = parse_path(str(path))
    truth = {n: a for a, n in _truth(path).items()}
    insns = make_backend(img, CodeMap(img)).instructions(truth["main"], truth["main"] + 200)
    calls = [i for i in insns if i.flow == "call"]
    assert any(truth["classify"] in i.targets for i in calls)
    assert all(i.size == len(i.bytes) for i in insns)
    assert any(i.flow == "conditional" for i in insns)


def test_dead_epilogue_after_a_non_returning_call_is_no_function(compile_c):
    """`add rsp; pop rbx; ret` after `call fatal` (which calls exit) is at a 16-byte boundary in a gap,
    like an unreferenced function; it gives back a frame it never took, so it is none. The
    unreferenced `spare` (a push first) and `leaf` (no stack use) after it still are."""
    unstripped = compile_c("noret_epilogue.S", "-O2", False)
    names = {s.name: s.address for s in parse_path(str(unstripped)).symbols}
    found = {f.address: f for f in _analyse(compile_c("noret_epilogue.S", "-O2", False, strip=True)).functions}
    assert names["after_fatal"] % 16 == 0 and names["after_fatal"] not in found
    assert found[names["fatal"]].noreturn
    assert found[names["spare"]].sources == ("prologue",) and found[names["leaf"]].sources == ("prologue",)
    # the dead epilogue is main's code (reached by nothing, so in no block), not a new function
    main = found[names["main"]]
    assert main.address + main.size > names["after_fatal"]
