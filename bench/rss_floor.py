"""Peak RSS floors: what each process of `binlens functions FILE --json` costs before it does any work.

Issue 3's target is a peak RSS (of the largest process, as `/usr/bin/time -v` reports it) of at most
10x the file's size. This script shows which part of that budget the interpreter and the libraries
take on this machine, each step its own fresh process under `/usr/bin/time -v`, beside the whole
command on the same file (a fresh program database). It prints one Markdown table:

    .venv/bin/python bench/rss_floor.py                 # the system's libc.so.6
    .venv/bin/python bench/rss_floor.py FILE [FILE ...] --repeat 3

Steps (the median of `--repeat` runs of each):
- the interpreter alone (the venv's python, site packages on the path);
- the iced-x86 decoder as the analysis process loads it (`binlens.analysis.decode.iced`);
- the analysis process's imports (`binlens.jobs.child` and the engine), then with the file read
  and its image decoded (the loader's forked parser, as the analysis process does it);
- pydantic with one strict model: any process that serves the typed API (SPEC, DESIGN: `Params` are
  pydantic models) pays this, whatever binlens does;
- the CLI's imports for `functions` (the API and the `function.list` domain);
- the whole `binlens functions FILE --json`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import tools

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")

_IMAGE = """
import os, pickle, sys
from binlens.loader.image import decode_image
from binlens.loader.worker import parse_isolated
import binlens.analysis.engine  # noqa: F401
data = open(sys.argv[1], "rb").read()
answer = parse_isolated(data, os.path.basename(sys.argv[1]), None, 120.0)
image = decode_image(pickle.loads(memoryview(answer)[1:]), data)
"""

_PYDANTIC = """
from pydantic import BaseModel, ConfigDict
class P(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    program: str
P(program="p1")
"""

_CLI_IMPORTS = "import binlens.api; from binlens.api.registry import lookup; lookup('function.list')"


def steps(py: str, path: Path, home: str) -> list[tuple[str, list[str]]]:
    """(label, command) of every step, in the table's order."""
    whole = [*tools.binlens_command(), "functions", str(path), "--json", "--home", home]
    return [
        ("interpreter (`python -c pass`)", [py, "-c", "pass"]),
        ("+ iced-x86 (`binlens.analysis.decode.iced`)", [py, "-c", "import binlens.analysis.decode.iced"]),
        ("analysis process: imports", [py, "-c", "import binlens.jobs.child, binlens.analysis.engine"]),
        ("analysis process: imports + file + image", [py, "-c", _IMAGE, str(path)]),
        ("pydantic + one strict model", [py, "-c", _PYDANTIC]),
        ("CLI: imports for `functions` (API + function.list)", [py, "-c", _CLI_IMPORTS]),
        ("whole `binlens functions FILE --json`", whole),
    ]


def peak_kib(cmd: list[str], repeat: int, fresh_home: Path | None) -> int:
    """Median peak RSS (KiB) of `repeat` runs of cmd; a fresh program database each run when asked."""
    peaks = []
    for _ in range(repeat):
        if fresh_home is not None:
            for f in sorted(fresh_home.rglob("*"), reverse=True):
                f.unlink() if f.is_file() else f.rmdir()
        run = tools.measure(cmd, timeout=3600)
        if run.error or run.rss_kb is None:
            raise SystemExit(f"{cmd[:3]}: {run.error or 'no RSS reported'}")
        peaks.append(run.rss_kb)
    return int(statistics.median(peaks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="files to measure (default: the system's libc.so.6)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each step (median kept)")
    args = ap.parse_args()
    files = args.files or [LIBC]
    py = str(Path(tools.binlens_command()[0]).with_name("python"))
    for path in files:
        size = path.stat().st_size
        budget = 10 * size / 2**20
        print(f"\n{path} ({size / 2**20:.2f} MiB; 10x = {budget:.1f} MiB)\n")
        print("| step (own process) | peak RSS MiB | x file | of the 10x budget |")
        print("|---|---:|---:|---:|")
        with tempfile.TemporaryDirectory(prefix="binlens-floor-") as home:
            for label, cmd in steps(py, path, home):
                fresh = Path(home) if label.startswith("whole") else None
                kib = peak_kib(cmd, args.repeat, fresh)
                mib = kib / 1024
                print(f"| {label} | {mib:.1f} | {kib * 1024 / size:.1f} | {100 * mib / budget:.0f}% |")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
