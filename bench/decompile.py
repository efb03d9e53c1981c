"""Decompilation: binlens's angr provider (seeded by binlens's analysis) beside stock angr, same run.

For each program, two sides run in processes of their own, one after the other:

- **binlens**: open the program with a fresh database, run binlens's analysis, then
  `decompilation.get` on the first function (time to the first decompiled function, cold: the
  analysis, angr's import and load, the seeded CFG of that function and its decompilation), the
  same call again (cached), then the other sample functions (warm provider, not cached).
- **stock angr**: `angr.Project` on the file, `CFGFast(normalize=True)` over the whole binary,
  then `Decompiler` on the same functions (what angr's own docs do).

Each side has `--timeout` seconds; a side that runs out or dies is reported as such. Per side: time
to the first function, success rate on the sample (code returned), median and p95 per function,
the cached call, and two quality proxies: `goto` count, and whether `gcc -fsyntax-only` accepts
the code after a prelude of the standard headers angr's types need. Prints a Markdown table.

    .venv/bin/python bench/decompile.py                     # the test fixture and libc
    .venv/bin/python bench/decompile.py --program /usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0:PyObject_Repr
    .venv/bin/python bench/decompile.py --sample 20 --timeout 900

A program is `PATH[:FIRST_FUNCTION]`; the sample adds functions of 32..2048 bytes spread evenly
(by address) over the symbol table, up to `--sample` (`.cold` parts of other functions left out).
The bench corpus's builds (bench/corpus.py) go by their unstripped file:

    .venv/bin/python bench/decompile.py --sample 30 --program bench/work/bin/zlib-gcc-O2-pie-eh/unstripped
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6:getenv"
FIXTURE = ROOT / "tests" / "fixtures" / "src" / "decompile.c"
GOTO = re.compile(r"\bgoto\b")
# What angr's output uses without declaring it: the standard headers of its C types, and the types
# angr's type classes print by a name of their own (SimTypeFd as fd_t, SimTypeInt128 as int128_t,
# SimTypeString as string_t, ...; the wider integers as opaque byte arrays). gcc then checks the
# rest (-w: implicit declarations of callees are warnings in gnu17, the default).
PRELUDE = (
    "#include <stdbool.h>\n#include <stddef.h>\n#include <stdint.h>\n"
    "typedef int fd_t;\ntypedef char *string_t;\ntypedef wchar_t *wstring_t;\n"
    "typedef __int128 int128_t;\ntypedef unsigned __int128 uint128_t;\n"
    "typedef struct { unsigned char b[32]; } int256_t, uint256_t;\n"
    "typedef struct { unsigned char b[64]; } int512_t, uint512_t;\n"
)


def syntax_ok(code: str) -> bool:
    """gcc -fsyntax-only accepts the code after PRELUDE (a quality proxy)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return False
    done = subprocess.run(
        [cc, "-fsyntax-only", "-w", "-x", "c", "-"], input=PRELUDE + code, capture_output=True, text=True
    )
    return done.returncode == 0


# --- the sides (each runs in a process of its own: `decompile.py --side NAME PATH FUNCS...`) ---------
def side_binlens(path: str, names: list[str], per_function_s: float) -> dict[str, Any]:
    """binlens: fresh database, analysis, then decompilation.get per function."""
    home = tempfile.mkdtemp(prefix="binlens-bench-")
    os.environ["BINLENS_HOME"] = home
    t0 = time.monotonic()
    from binlens.api import invoke
    from binlens.workspace import Config, Workspace

    ws = Workspace(Config(home=Path(home)))
    prog = ws.open(path, check_roots=False)
    invoke(ws, "analysis.start", {"wait": True, "timeout_ms": 600000})
    analysed = time.monotonic() - t0
    out: dict[str, Any] = {"analysis_s": analysed, "functions": []}
    for i, name in enumerate(names):
        t = time.monotonic()
        row: dict[str, Any] = {"name": name}
        try:
            r = invoke(ws, "decompilation.get", {"selector": {"name": name}, "timeout_ms": int(per_function_s * 1000)})
            seconds = time.monotonic() - t
            code = r["code"]
            row.update(ok=True, seconds=seconds, gotos=len(GOTO.findall(code)), syntax=syntax_ok(code), bytes=len(code))
        except Exception as err:  # noqa: BLE001 - a failure is a result here
            row.update(ok=False, seconds=time.monotonic() - t, error=f"{type(err).__name__}: {str(err)[:120]}")
        out["functions"].append(row)
        if i == 0:
            out["first_s"] = time.monotonic() - t0
            t = time.monotonic()
            try:
                invoke(ws, "decompilation.get", {"selector": {"name": name}})
                out["cached_s"] = time.monotonic() - t
            except Exception:  # noqa: BLE001
                out["cached_s"] = None
    ws.close(prog.handle)
    shutil.rmtree(home, ignore_errors=True)
    return out


def side_stock(path: str, names: list[str], per_function_s: float) -> dict[str, Any]:
    """Stock angr: CFGFast over the whole binary, then the Decompiler per function."""
    import logging

    logging.disable(logging.CRITICAL)
    t0 = time.monotonic()
    import angr

    proj = angr.Project(path, auto_load_libs=False, load_debug_info=False)
    cfg = proj.analyses.CFGFast(normalize=True)
    out: dict[str, Any] = {"analysis_s": time.monotonic() - t0, "functions": []}
    base = proj.loader.main_object.mapped_base - proj.loader.main_object.linked_base
    for i, name in enumerate(names):
        t = time.monotonic()
        row: dict[str, Any] = {"name": name}
        sym = proj.loader.main_object.get_symbol(name)
        func = proj.kb.functions.get(sym.rebased_addr if sym else None) if sym else None
        if func is None and sym is not None:
            func = proj.kb.functions.function(addr=sym.linked_addr + base)
        try:
            if func is None:
                raise LookupError("angr's CFG has no such function")
            dec = proj.analyses.Decompiler(func, cfg=cfg.model)
            if dec.codegen is None:
                raise RuntimeError("no code")
            text = dec.codegen.text
            seconds = time.monotonic() - t
            row.update(ok=True, seconds=seconds, gotos=len(GOTO.findall(text)), syntax=syntax_ok(text), bytes=len(text))
        except Exception as err:  # noqa: BLE001 - a failure is a result here
            row.update(ok=False, seconds=time.monotonic() - t, error=f"{type(err).__name__}: {str(err)[:120]}")
        out["functions"].append(row)
        if i == 0:
            out["first_s"] = time.monotonic() - t0
    return out


# --- the orchestrator ---------------------------------------------------------------------------
def sample_names(path: str, first: str | None, count: int) -> list[str]:
    """The first function, then functions of 32..2048 bytes from the dynamic/static symbol table."""
    done = subprocess.run(["nm", "-S", "--defined-only", path], capture_output=True, text=True)
    if not done.stdout.strip():
        done = subprocess.run(["nm", "-D", "-S", "--defined-only", path], capture_output=True, text=True)
    seen: set[str] = set()
    names: list[tuple[int, str]] = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[2] not in "Tt":
            continue
        name = parts[3].split("@")[0]
        size = int(parts[1], 16)
        # (a `.cold` symbol is a split-off part of another function, not a function of its own)
        if 32 <= size <= 2048 and name not in seen and not name.startswith(("_", ".")) and ".cold" not in name:
            seen.add(name)
            names.append((int(parts[0], 16), name))
    names.sort()
    step = max(1, len(names) // max(1, count))
    picked = [n for _a, n in names[::step]][: max(0, count - 1)]
    return ([first] if first else []) + [n for n in picked if n != first]


def run_side(side: str, path: str, names: list[str], timeout: float, per_function_s: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--side", side, "--per-function", str(per_function_s), path, *names]
    t = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"failed": f"no answer within {timeout:g} s", "wall_s": time.monotonic() - t}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:160]
        return {"failed": f"exit {done.returncode}: {tail}", "wall_s": time.monotonic() - t}
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_s"] = time.monotonic() - t
    return result


def summary(r: dict[str, Any]) -> dict[str, str]:
    if "failed" in r:
        return {
            "first": f"failed ({r['failed']})",
            **dict.fromkeys(("rate", "median", "p95", "cached", "gotos", "syntax"), "-"),
        }
    fns = r["functions"]
    ok = [f for f in fns if f["ok"]]
    rest = [f["seconds"] for f in ok[1:]] or [f["seconds"] for f in ok]
    p95 = sorted(rest)[max(0, int(round(0.95 * len(rest))) - 1)] if rest else None
    return {
        "first": f"{r['first_s']:.1f} s (analysis {r['analysis_s']:.1f} s)",
        "rate": f"{len(ok)}/{len(fns)}",
        "median": f"{statistics.median(rest):.2f} s" if rest else "-",
        "p95": f"{p95:.2f} s" if p95 is not None else "-",
        "cached": f"{r['cached_s'] * 1000:.0f} ms" if r.get("cached_s") is not None else "-",
        "gotos": str(sum(f.get("gotos", 0) for f in ok)),
        "syntax": f"{sum(1 for f in ok if f.get('syntax'))}/{len(ok)}",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", choices=["binlens", "stock"], help=argparse.SUPPRESS)
    ap.add_argument("--per-function", type=float, default=30.0, help="seconds each function may take (binlens)")
    ap.add_argument("--program", action="append", help="PATH[:FIRST_FUNCTION] (default: the test fixture and libc)")
    ap.add_argument("--sample", type=int, default=10, help="functions per program, the first included")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds each side may take per program")
    ap.add_argument("--sides", default="binlens,stock", help="which sides to run (binlens, stock)")
    ap.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        run = side_binlens if a.side == "binlens" else side_stock
        print(json.dumps(run(a.args[0], a.args[1:], a.per_function)))
        return 0
    programs = a.program
    if not programs:
        build = Path(tempfile.mkdtemp(prefix="binlens-bench-fixture-")) / "decompile"
        subprocess.run(["cc", "-O2", "-g", "-o", str(build), str(FIXTURE)], check=True)
        programs = [f"{build}:score_items", LIBC]
    print("| program | side | first function (cold) | decompiled | median | p95 | cached | gotos | gcc accepts |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in programs:
        path, _, first = spec.partition(":")
        names = sample_names(path, first or None, a.sample)
        for side in [x for x in ("binlens", "stock") if x in a.sides.split(",")]:
            r = run_side(side, path, names, a.timeout, a.per_function)
            s = summary(r)
            file = Path(path)
            # (bench/corpus.py names its builds by their folder: VARIANT/stripped, VARIANT/unstripped)
            shown = file.parent.name if file.name in ("stripped", "unstripped") else file.name
            label = f"{shown} ({names[0]})"
            print(
                f"| {label} | {'binlens + angr' if side == 'binlens' else 'stock angr'} | {s['first']} | {s['rate']} "
                f"| {s['median']} | {s['p95']} | {s['cached']} | {s['gotos']} | {s['syntax']} |",
                flush=True,
            )
            for f in r.get("functions", []):
                if not f["ok"]:
                    print(f"<!-- {side} {f['name']}: {f['error']} -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
