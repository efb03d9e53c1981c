"""`function.list` on a reopened, analysed program: is it instant (target ≤ 0.3 s)?

For each file: analyse it once into a fresh program database (`binlens functions FILE --json`), then
measure, N times each, (a) in this process: open the program from the database and call
`function.list` (and the call alone), and (b) the whole one-shot CLI
`binlens query -b FILE '{"method":"function.list","params":{}}'` including interpreter start-up.
Prints a Markdown table of medians. Run with binlens's own interpreter:

    .venv/bin/python bench/reopen.py                    # corpus sqlite3 -O2 PIE (gcc) and libc.so.6
    .venv/bin/python bench/reopen.py FILE [FILE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import builds
import tools

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def in_process(path: Path, home: Path, repeats: int) -> tuple[float, float, int, float, int]:
    """Medians, in seconds, of (open + first page of function.list), of that call alone, and of listing
    every function (pages of 1000, following cursors); with the first page's and the total's counts."""
    from binlens.api import invoke
    from binlens.workspace import Config, Workspace

    opened, listed, walked, first, total = [], [], [], 0, 0
    for _ in range(repeats):
        ws = Workspace(Config(home=home))
        t0 = time.perf_counter()
        prog = ws.open(path, check_roots=False)
        t1 = time.perf_counter()
        result = invoke(ws, "function.list", {"program": prog.handle})
        t2 = time.perf_counter()
        first = len(result["items"])
        total, cursor = 0, None
        while True:
            page = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            data = invoke(ws, "function.list", {"program": prog.handle, "page": page}, max_response_bytes=1 << 30)
            total += len(data["items"])
            cursor = data.get("next_cursor")
            if not cursor:
                break
        t3 = time.perf_counter()
        opened.append(t2 - t0)
        listed.append(t2 - t1)
        walked.append(t3 - t2)
        ws.close(prog.handle)
    return statistics.median(opened), statistics.median(listed), first, statistics.median(walked), total


def one_shot(path: Path, home: Path, repeats: int) -> float:
    """Median wall seconds of the one-shot JSON CLI (start-up, open, function.list, print)."""
    cmd = [*tools.binlens_command(), "query", "-b", str(path), '{"method":"function.list","params":{}}']
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run([*cmd, "--home", str(home)], capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(f"query failed: {proc.stdout[-500:]} {proc.stderr[-500:]}")
        if not json.loads(proc.stdout)["result"]["items"]:
            raise RuntimeError("function.list returned no functions")
    return statistics.median(times)


def main() -> int:
    """Analyse once, reopen and list many times, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("BINLENS_BENCH_WORK", builds.DEFAULT_WORKDIR)))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    files = list(args.files)
    if not files:
        b = builds.build_all(args.workdir.resolve(), builds.matrix(["sqlite3"], ["gcc"], ["O2"], ["pie"], ["eh"]))[0]
        files = [b.stripped] + ([LIBC.resolve()] if LIBC.is_file() else [])
    rows = [
        "| file | first analysis s | open + function.list s (first page) | function.list s | "
        "all functions (pages of 1000) s | one-shot CLI s |",
        "|---|---|---|---|---|---|",
    ]
    for path in files:
        with tempfile.TemporaryDirectory(prefix="binlens-reopen-") as tmp:
            home = Path(tmp)
            first = tools.measure(
                [*tools.binlens_command(), "functions", str(path), "--json", "--home", str(home)], timeout=3600
            )
            if first.error:
                raise SystemExit(f"analysis of {path} failed: {first.error}")
            opened, listed, first_page, walked, total = in_process(path, home, args.repeats)
            cli = one_shot(path, home, args.repeats)
        label = path.parent.name if path.name == "stripped" else path.name
        rows.append(
            f"| `{label}` | {first.wall:.2f} | {opened:.3f} ({first_page} functions) | {listed:.3f} | "
            f"{walked:.3f} ({total} functions) | {cli:.2f} |"
        )
    print("\n".join(rows))
    print(
        f"\nMedians of {args.repeats} runs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"binlens {tools.binlens_version()}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
