"""The C extensions (the engine's, the store's row packers) are built by the install (setup.py) and
used, unless turned off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from binlens.analysis.decode import x86
from binlens.analysis.discovery import explorer as discovery
from binlens.analysis.discovery import functions
from binlens.store import analysis_save


@pytest.mark.skipif(bool(os.environ.get("BINLENS_PURE_PYTHON")), reason="BINLENS_PURE_PYTHON turns them off")
def test_c_extensions_are_built_and_used() -> None:
    assert x86._c_scan is not None, "binlens.analysis.native._x86scan was not built (a C compiler and Python headers?)"
    assert discovery._c_traverse is not None and functions._c_merge is not None, "_descent was not built"
    assert analysis_save._c_rows is not None, "binlens.store._rows was not built"


def test_pure_python_switch_turns_them_off() -> None:
    code = (
        "from binlens.analysis.decode import x86\n"
        "from binlens.analysis.discovery import explorer as discovery, functions\n"
        "from binlens.store import analysis_save\n"
        "print(x86._c_scan, discovery._c_traverse, functions._c_merge, analysis_save._c_rows)"
    )
    env = {**os.environ, "BINLENS_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["None", "None", "None", "None"]
