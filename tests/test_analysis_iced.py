"""`binlens.analysis.decode.iced`: iced-x86's extension and six constant modules, without the package's rest."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

CHECK = r"""
import json, sys
from binlens.analysis.decode import iced as ix
from binlens.analysis.decode.x86 import X86Backend
lean = "iced_x86" not in sys.modules
import iced_x86
same = all(getattr(ix, c) is getattr(iced_x86, c) for c in ix.CLASSES)
values = all(
    {k: v for k, v in vars(getattr(ix, c)).items() if k.isupper()}
    == {k: v for k, v in vars(getattr(iced_x86, c)).items() if k.isupper()}
    for c in ix.CONSTANTS
)
dec = ix.Decoder(64, bytes.fromhex("4889e5c3"), ip=0x1000)
text = [str(i) for i in dec]
print(json.dumps({"lean": lean, "same": same, "values": values, "text": text, "rsp": ix.Register.RSP}))
"""


def _run(code: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PYTHONPATH": str(ROOT / "src")},
    )
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_engine_loads_iced_without_its_package_and_the_package_still_imports_after():
    got = _run(CHECK)
    assert got["lean"] is True  # the decoder came without `iced_x86/__init__.py` and its 40 modules
    assert got["same"] is True  # one extension: the package's later import took the one loaded
    assert got["values"] is True  # every constant of the six modules is the installed package's
    assert got["text"] == ["mov rbp,rsp", "ret"] and got["rsp"] > 0


def test_an_imported_package_is_used_as_it_is():
    got = _run("import iced_x86\n" + CHECK)
    assert got["lean"] is False and got["same"] is True and got["values"] is True


def test_an_x86_analysis_does_not_load_capstone(compile_c) -> None:  # noqa: ANN001
    """x86 decodes with iced-x86 and the C scanner: capstone (~10 MiB resident) stays unloaded, so
    the analysis of an x86 file peaks no higher than it must."""
    binary = compile_c("sample.c", "-O2")
    code = (
        "import json, sys\n"
        "from binlens.analysis import analyze\n"
        "from binlens.loader.parse_lief import parse_path\n"
        f"r = analyze(parse_path({str(binary)!r}))\n"
        "print(json.dumps({'functions': len(r.functions), 'capstone': 'capstone' in sys.modules}))\n"
    )
    got = _run(code)
    assert got["functions"] > 0 and got["capstone"] is False
