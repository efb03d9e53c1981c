"""address.symbolize and `binlens symbolize`: a real crash stack of a PIE, symbolized offline.

`tests/fixtures/src/crash_stack.c` crashes in `crash_here` (called by `level_two`, `level_one`,
`main`); its SIGSEGV handler prints the image's runtime base (dladdr) and backtrace()'s frames.
The test runs it, then names those runtime addresses through the program's analysis.
"""

from __future__ import annotations

import subprocess

import pytest

from binlens.api import CallContext, invoke
from binlens.errors import BinlensError
from conftest import run_cli

CALLS = ["on_crash", "crash_here", "level_two", "level_one", "main"]  # innermost first


@pytest.fixture(scope="module")
def crash(compile_c):
    """(the PIE, its runtime base, its stack's runtime addresses) from one real crash."""
    exe = compile_c("crash_stack.c", "-O0", True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)
    lines = run.stdout.splitlines()
    base = next(ln.split()[1] for ln in lines if ln.startswith("base "))
    frames = [ln.split()[1] for ln in lines if ln.startswith("frame ")]
    assert int(base, 16) > 0 and len(frames) >= 6
    return exe, base, frames, run.stdout


def _open(workspace, exe):
    workspace.open(str(exe), check_roots=False)
    invoke(workspace, "analysis.start", {"wait": True})


def test_a_real_crash_stack_names_the_functions_of_the_source(workspace, crash):
    exe, base, frames, _out = crash
    _open(workspace, exe)
    data = invoke(workspace, "address.symbolize", {"addresses": frames, "base": base, "return_addresses": True})
    assert data["base"] == hex(int(base, 16)) and data["image_base"] == "0x0"
    items = data["items"]
    assert [x["runtime"] for x in items] == [hex(int(f, 16)) for f in frames]
    named = [x["function"]["name"] for x in items if "function" in x]
    assert named[: len(CALLS)] == CALLS, items
    # the signal trampoline and libc's frames are in another module
    outside = [x for x in items if "function" not in x]
    assert outside and all(x["note"] == "not in the image" and "address" not in x for x in outside)
    for x in items:
        if "function" in x:  # static = runtime - base (a PIE's image base is 0), offset from the entry
            static = int(x["runtime"], 16) - int(base, 16)
            assert x["address"] == hex(static)
            assert x["offset"] == static - int(x["function"]["address"], 16) and x["offset"] >= 0
    # the same stack read against the unstripped symbols: each function's entry is its symbol
    from binlens.loader.parse_lief import parse_path

    syms = {s.name: s.address for s in parse_path(str(exe)).symbols if s.kind == "function"}
    for x in items:
        if "function" in x and x["function"]["name"] in CALLS:
            assert int(x["function"]["address"], 16) == syms[x["function"]["name"]]


def test_static_addresses_and_what_no_function_holds(workspace, crash):
    exe, _base, _frames, _out = crash
    _open(workspace, exe)
    main = invoke(workspace, "address.resolve", {"selector": {"name": "main"}})["address"]
    got = invoke(workspace, "address.symbolize", {"addresses": [int(main, 16), int(main, 16) + 4, "0x0"]})
    first, second, third = got["items"]
    assert first["function"] == {"address": main, "name": "main"} and first["offset"] == 0
    assert second["offset"] == 4 and second["address"] == hex(int(main, 16) + 4)
    assert third["note"] == "not in a function" and third["address"] == "0x0"  # (the ELF header)


@pytest.mark.parametrize(
    ("params", "target"),
    [
        ({"addresses": ["0x1000"] * 1025}, "/params/addresses"),
        ({"addresses": []}, "/params/addresses"),
        ({"addresses": ["0x1000", "12zz"]}, "/params/addresses/1"),
        ({"addresses": [-5]}, "/params/addresses/0"),
        ({"addresses": [1 << 64]}, "/params/addresses/0"),
        ({"addresses": ["0x1000"], "base": "main"}, "/params/base"),
        ({"addresses": [1.5]}, "/params/addresses/0"),
    ],
)
def test_bad_input_is_invalid_argument_with_a_pointer(workspace, crash, params, target):
    exe, _base, _frames, _out = crash
    _open(workspace, exe)
    with pytest.raises(BinlensError) as err:
        invoke(workspace, "address.symbolize", params, CallContext())
    assert err.value.code == "invalid_argument" and err.value.target == target, err.value.to_dict()


def test_the_cli_reads_a_stack_from_stdin(crash, tmp_path):
    exe, base, _frames, out = crash
    run = run_cli("symbolize", str(exe), "--base", base, "--return-addresses", home=tmp_path / "h", stdin=out)
    assert run.returncode == 0, run.stderr
    rows = [ln for ln in run.stdout.splitlines() if "+0x" in ln]
    names = [ln.rsplit("│", 1)[1].strip().split("+")[0] for ln in rows]
    assert names[: len(CALLS)] == CALLS, run.stdout
    assert "not in the image" in run.stdout
    # the same addresses as arguments, as JSON
    frames = [ln.split()[1] for ln in out.splitlines() if ln.startswith("frame ")]
    run = run_cli("symbolize", str(exe), "--base", base, "--json", *frames[:3], home=tmp_path / "h")
    assert run.returncode == 0, run.stderr
    import json

    items = json.loads(run.stdout)["items"]
    assert items[0]["function"]["name"] == "on_crash" and items[2]["function"]["name"] == "crash_here"
