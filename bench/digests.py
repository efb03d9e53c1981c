"""Whole-analysis digests: one sha256 per file over everything the engine finds.

Each file of the given folders (recursively) is loaded and analysed in a child process; the digest
covers the functions (extent, sources, names, noreturn, mode), blocks, edges, calls, references and
strings, so two checkouts whose digests agree on a set of files analyse them identically. It is how
a restructure shows that behaviour did not change:

    PYTHONPATH=/path/to/old/src python bench/digests.py DIR... --json old.json
    PYTHONPATH=src python bench/digests.py DIR... --json new.json
    python bench/digests.py --compare old.json new.json

Prints a table (file, functions, xrefs, strings, digest prefix); `--compare` prints the files
whose digests differ and exits 1 when any does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

DEFAULT_TIMEOUT = 300.0


def digest_file(path: str) -> dict:
    """The analysis digest of one file (run in a child process)."""
    from binlens.analysis import analyze
    from binlens.errors import BinlensError
    from binlens.loader.parse_lief import parse_path

    try:
        result = analyze(parse_path(path))
    except BinlensError as e:
        return {"file": path, "error": e.code}
    h = hashlib.sha256()

    def put(*values: object) -> None:
        h.update(repr(values).encode())

    put(result.arch)
    for f in result.functions:
        put("f", f.address, f.size, f.sources, f.symbol_name, f.thunk_name, f.noreturn, f.mode)
        for b in f.blocks:
            put("b", b.start, b.end, b.instruction_count, b.terminator)
        for e in f.edges:
            put("e", e.src, e.dst, e.kind)
        put("c", tuple(f.calls))
    for x in result.xrefs:
        put("x", x.src, x.dst, x.kind)
    for s in result.strings:
        put("s", s.address, s.size, s.encoding, s.text, s.section)
    return {
        "file": path,
        "functions": len(result.functions),
        "xrefs": len(result.xrefs),
        "strings": len(result.strings),
        "digest": h.hexdigest(),
    }


def files_under(roots: list[str]) -> list[str]:
    """Every regular file under `roots`, sorted."""
    out: list[str] = []
    for root in roots:
        p = Path(root)
        out.extend(str(f) for f in sorted(p.rglob("*")) if f.is_file()) if p.is_dir() else out.append(str(p))
    return out


def run(files: list[str], jobs: int, timeout: float) -> list[dict]:
    """Digest `files` in `jobs` child processes, one fresh child per file (a crash stays one row)."""
    ctx = mp.get_context("spawn")
    rows: list[dict] = []
    with ctx.Pool(jobs, maxtasksperchild=1) as pool:
        pending = [(f, pool.apply_async(digest_file, (f,))) for f in files]
        for f, res in pending:
            try:
                rows.append(res.get(timeout))
            except mp.TimeoutError:
                rows.append({"file": f, "error": "timeout"})
            except Exception as e:  # a child that died: the row says how
                rows.append({"file": f, "error": type(e).__name__})
    return rows


def compare(old_path: str, new_path: str) -> int:
    """Print the files whose digests differ between two `--json` outputs; 1 when any does."""
    old = {r["file"]: r for r in json.loads(Path(old_path).read_text())["files"]}
    new = {r["file"]: r for r in json.loads(Path(new_path).read_text())["files"]}
    differ = [f for f in sorted(old.keys() | new.keys()) if old.get(f) != new.get(f)]
    print(f"{len(old)} files in {old_path}, {len(new)} in {new_path}, {len(differ)} differ")
    for f in differ:
        print(f"  {f}: {old.get(f)} != {new.get(f)}")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="files or folders (recursively)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per file")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two --json outputs")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.paths:
        ap.error("give files or folders to digest, or --compare OLD NEW")
    files = files_under(args.paths)
    started = time.monotonic()
    rows = run(files, args.jobs, args.timeout)
    whole = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
    print(f"{'file':<60} {'functions':>9} {'xrefs':>8} {'strings':>8}  digest")
    for r in rows:
        name = r["file"][-60:]
        if "error" in r:
            print(f"{name:<60} {'error: ' + r['error']:>27}")
        else:
            print(f"{name:<60} {r['functions']:>9} {r['xrefs']:>8} {r['strings']:>8}  {r['digest'][:16]}")
    errors = sum("error" in r for r in rows)
    print(f"{len(rows)} files, {errors} refused, {time.monotonic() - started:.0f} s; all rows: {whole[:16]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"all": whole, "files": rows}, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
