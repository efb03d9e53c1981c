"""Corpus function-search quality across optimisation levels (docs/CORPUS.md, "Figures").

Builds C libraries with gcc at -O2 and -O3 (with symbols: the ground truth is the function name),
indexes the -O2 builds with distractor ELF files from /usr/bin in one SQLite corpus store, then
searches every function of the -O3 builds (8 instructions or more, also in the -O2 build, the C
runtime's copies and PLT thunks left out) with `limit` 10, and prints a table: top-1 and top-10
recall, how often the true match was among the band candidates, p50/p95 latency, store bytes per
function.

Programs: zlib (the sources pypcode ships), and, when unpacked under `bench/work/src` (`apt-get
source bzip2 lua5.4`), bzip2's library and Lua 5.4's core. Corpus records are cached in
`bench/work/corpus_quality/` (by file sha256 and fingerprint format), so reruns only search.

    PYTHONPATH=src python bench/corpus_quality.py [--programs zlib,bzip2,lua] [--misses] [--reverse]
        [--store postgresql://...] [--copies N]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from binlens.corpus.ranking import query_view  # noqa: E402
from binlens.corpus.records import BinaryRecord  # noqa: E402
from binlens.corpus.store import open_store, total_bytes  # noqa: E402
from binlens.store.fingerprints import FINGERPRINT_VERSION  # noqa: E402

WORK = HERE / "work" / "corpus_quality"
SRC = HERE / "work" / "src"
DISTRACTORS = ("ls", "cp", "tar", "grep", "sed", "find", "diff", "gzip", "make", "ssh", "curl")
CRT = {"deregister_tm_clones", "register_tm_clones", "__do_global_dtors_aux", "frame_dummy", "_init", "_fini"}


def _sources(program: str) -> tuple[list[Path], list[str]] | None:
    """The C files of a program's library and the extra compiler flags; None when absent."""
    if program == "zlib":
        import pypcode

        d = Path(pypcode.__file__).parent / "zlib"
        return sorted(d.glob("*.c")), [f"-I{d}"]
    if program == "bzip2":
        found = sorted(glob.glob(str(SRC / "bzip2-*")))
        if not found:
            return None
        d = Path(found[-1])
        names = ("blocksort", "huffman", "crctable", "randtable", "compress", "decompress", "bzlib")
        return [d / f"{n}.c" for n in names], [f"-I{d}", "-D_FILE_OFFSET_BITS=64"]
    if program == "lua":
        found = sorted(glob.glob(str(SRC / "lua5.4-*")))
        if not found:
            return None
        d = Path(found[-1]) / "src"
        header = d / "lua5.4-deb-multiarch.h"  # Debian's path patch includes what debian/rules writes
        if not header.is_file():
            header.write_text('#define DEB_HOST_MULTIARCH "x86_64-linux-gnu"\n')
        files = [p for p in sorted(d.glob("*.c")) if p.stem not in ("lua", "luac", "onelua")]
        return files, [f"-I{d}", "-DLUA_USE_LINUX"]
    raise SystemExit(f"unknown program {program}")


def build(program: str, opt: str, cc: str = "gcc") -> Path | None:
    """The program's library built with `cc` at `opt` as a shared object with symbols (cached)."""
    found = _sources(program)
    if found is None:
        return None
    files, flags = found
    out = WORK / f"lib{program}-{cc}-{opt}.so"
    if not out.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        cmd = [cc, f"-{opt}", "-g", "-fPIC", "-shared", "-o", str(out), *flags, *map(str, files), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True)
    return out


def record(ws: object, path: Path) -> BinaryRecord:
    """The corpus record of `path`, cached by its sha256 and the fingerprint format."""
    from binlens.api.corpus import binary_record
    from binlens.jobs.state import analysis_of

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    cache = WORK / "records" / f"{digest[:16]}-{FINGERPRINT_VERSION}-t.pickle"  # t: with tail calls
    if cache.exists():
        rec: BinaryRecord = pickle.loads(cache.read_bytes())
        return rec
    t0 = time.monotonic()
    prog = ws.open(path)  # type: ignore[attr-defined]
    view = analysis_of(prog).require(None, timeout_s=900)
    rec = binary_record(prog, view, time.monotonic() - t0)
    rec = BinaryRecord(**{**{k: getattr(rec, k) for k in rec.__slots__}, "functions": list(rec.functions)})
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_bytes(pickle.dumps(rec))
    return rec


def _wanted(name: str | None, o2_names: set[str]) -> bool:
    return bool(name) and name in o2_names and name not in CRT and not name.endswith("@plt")  # type: ignore[operator]


def main() -> None:
    """Build, index, search, print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", default="zlib,bzip2,lua")
    ap.add_argument("--misses", action="store_true", help="list the functions not in the top 10")
    ap.add_argument("--reverse", action="store_true", help="index the -O3 builds, search the -O2 ones")
    ap.add_argument("--clang", action="store_true", help="search clang -O2 builds (not gcc -O3) among the gcc -O2")
    ap.add_argument("--store", help="a postgresql:// URL (default: SQLite in a temporary folder)")
    ap.add_argument(
        "--copies",
        type=int,
        default=1,
        help="add each distractor this many times (under made-up sha256s): a larger store for latency",
    )
    args = ap.parse_args()

    from binlens.api import REGISTRY  # noqa: F401 - registers the domains
    from binlens.workspace import Config, Workspace

    tmp = Path(tempfile.mkdtemp(prefix="binlens-cq-"))
    ws = Workspace(Config(home=tmp / "home"))
    pairs: list[tuple[str, BinaryRecord, BinaryRecord]] = []
    for program in args.programs.split(","):
        o2, o3 = build(program, "O2"), (build(program, "O2", "clang") if args.clang else build(program, "O3"))
        if o2 is None or o3 is None:
            print(f"{program}: sources absent, skipped", file=sys.stderr)
            continue
        low, high = record(ws, o2), record(ws, o3)
        pairs.append((program, high, low) if args.reverse else (program, low, high))
    distractors = [record(ws, Path("/usr/bin") / b) for b in DISTRACTORS if (Path("/usr/bin") / b).exists()]

    store = open_store(args.store, tmp / "store")
    t0 = time.monotonic()
    for rec in distractors:
        store.add_binary("q", rec)
        for copy in range(1, args.copies):
            fake = hashlib.sha256(f"{rec.sha256}/{copy}".encode()).hexdigest()
            store.add_binary("q", replace(rec, sha256=fake, path=f"{rec.path}#{copy}"))
    for _p, o2rec, _o3 in pairs:
        store.add_binary("q", o2rec)
    add_s = time.monotonic() - t0
    info = store.info("q")
    cid = store._id("q")

    rows = []
    all_lat: list[float] = []
    totals = [0, 0, 0, 0]
    for program, o2rec, o3rec in pairs:
        o2_names = {f.name for f in o2rec.functions if f.name}
        n = top1 = top10 = cand = 0
        lat: list[float] = []
        for f in o3rec.functions:
            if f.instructions < 8 or not _wanted(f.name, o2_names):
                continue
            n += 1
            t = time.perf_counter()
            tails = o3rec.tail_calls.get(f.address, ())
            hits = store.search_function("q", f, limit=10, context=o3rec.functions, tail_calls=tails)
            lat.append((time.perf_counter() - t) * 1000)
            ok = [h.name == f.name and h.sha256 == o2rec.sha256 for h in hits]
            top1 += bool(ok[:1] and ok[0])
            top10 += any(ok)
            proposed = _proposed(store, cid, f, o2rec, f.name or "", o3rec)
            cand += proposed
            if args.misses and not any(ok):
                print(
                    f"  miss {program} {f.name} ({f.instructions} insns) candidate={proposed} "
                    f"top={[(h.name, h.similarity) for h in hits[:3]]}"
                )
        all_lat += lat
        for i, v in enumerate((n, top1, top10, cand)):
            totals[i] += v
        rows.append((program, n, top1, top10, cand, lat))

    print(f"corpus: {info.binaries} binaries, {info.functions} functions; added in {add_s:.1f} s")
    print(f"{'program':8} {'queries':>7} {'top-1':>6} {'top-10':>6} {'proposed':>8} {'p50 ms':>7} {'p95 ms':>7}")
    for program, n, top1, top10, cand, lat in [*rows, ("all", *totals, all_lat)]:
        if not n:
            continue
        q = statistics.quantiles(lat, n=20) if len(lat) > 1 else [lat[0]] * 19
        print(
            f"{program:8} {n:7} {top1 / n:6.2f} {top10 / n:6.2f} {cand / n:8.2f} "
            f"{statistics.median(lat):7.1f} {q[18]:7.1f}"
        )
    store.close()
    store = open_store(args.store, tmp / "store")  # reopened: SQLite's WAL checkpointed into the file
    size = total_bytes(store)
    bands = int(store.db.read("SELECT COUNT(*) FROM corpus_band")[0][0])
    store.close()
    kind = "PostgreSQL database" if args.store else "SQLite, whole file"
    print(
        f"store: {size / info.functions:.0f} bytes/function ({kind}); {bands / info.functions:.1f} band rows/function"
    )


def _proposed(store: object, cid: int, f: object, o2rec: BinaryRecord, name: str, qrec: BinaryRecord) -> bool:
    """Whether the search's candidates (or its exact lookup) include the true match."""
    target = next((g for g in o2rec.functions if g.name == name), None)
    if target is None:
        return False
    if target.exact == f.exact:  # type: ignore[attr-defined]
        return True
    ids = store.candidate_ids(cid, f, 10, query_view(f, qrec.functions, qrec.tail_calls.get(f.address, ())))  # type: ignore[attr-defined,arg-type]
    rows = store.db.read(  # type: ignore[attr-defined]
        "SELECT f.id FROM corpus_function f JOIN corpus_binary b ON b.id = f.binary_id "
        "WHERE b.sha256 = ? AND f.address = ?",
        (o2rec.sha256, target.address),
    )
    return bool(rows) and int(rows[0][0]) in ids


if __name__ == "__main__":
    main()
