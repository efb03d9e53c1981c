"""Demangling of C++, Rust (legacy and v0), Swift and MSVC names; raw names are kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from binlens.api import invoke
from binlens.loader.demangle import demangle
from conftest import ROOT


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("_ZNSt6vectorIiSaIiEE9push_backERKi", "std::vector<int, std::allocator<int>>::push_back(int const&)"),
        ("_ZN4core3fmt9Formatter3pad17h1234567890abcdefE", "core::fmt::Formatter::pad"),
        ("_RNvCs1234_7mycrate3foo", "mycrate::foo"),
        ("$s4main3FooV3baryyF", "main.Foo.bar() -> ()"),
        ("?foo@@YAHH@Z", "int __cdecl foo(int)"),
        ("main", "main"),
        ("_Znot_really", "_Znot_really"),
    ],
)
def test_demangle(raw, want):
    assert demangle(raw) == want


def test_cpp_symbols_keep_raw_names(workspace, compile_c, build_dir):
    src = build_dir / "cpp.cpp"
    src.write_text("namespace ns { int twice(int v) { return 2 * v; } }\nint main() { return ns::twice(3); }\n")
    import shutil
    import subprocess

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    out = build_dir / "cpp.out"
    subprocess.run([cxx, "-O1", "-o", str(out), str(src)], check=True)
    workspace.open(out, check_roots=False)
    item = invoke(workspace, "symbol.get", {"selector": {"name": "ns::twice(int)"}})
    assert item["raw_name"] == "_ZN2ns5twiceEi"
    assert invoke(workspace, "address.resolve", {"address": "_ZN2ns5twiceEi"})["address"] == item["address"]


def test_demanglers_load_only_when_a_name_needs_one(compile_c):
    """Reading a C program loads no demangler (cxxfilt runs `ldconfig -p` twice to find libc and
    libstdc++, ~45 ms a process with the pure-Python one); the first mangled name loads it."""
    path = compile_c("sample.c", "-O2", True)
    code = (
        "import sys\n"
        "from binlens.loader.isolate import load_image\n"
        "from binlens.loader.demangle import demangle\n"
        f"load_image({str(path)!r})\n"
        "before = sorted(m for m in ('cxxfilt', 'demangle') if m in sys.modules)\n"
        "print(before, demangle('_ZN3foo3barEv'), 'cxxfilt' in sys.modules or 'demangle' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["[]", "foo::bar()", "True"]
