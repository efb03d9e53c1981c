"""Corpus indexing and search (`binlens corpus index`, `corpus.search_function`): throughput with
one and two Ray workers, query latency on SQLite and PostgreSQL, search quality across optimisation
levels, store size, and an estimate for a million binaries (docs/BENCHMARKS.md, "Corpus").

The corpus is real binaries, read where they lie (nothing is copied): the sample corpus
($BINLENS_CORPUS: PE, Mach-O, ELF of many architectures and fuzzer crashers), the system's /usr/bin
and /usr/lib ELF files up to --max-size, the bench builds when present (bench/work, `builds.py`),
and the quality set: real C sources found on this machine (zlib's and libpng's examples, binlens's
own C kernels, the tests' fixture programs) built here with gcc at -O2 and at -O3, with symbols.

1. Throughput: a subset (--subset files spread over the sources, fuzzer crashers left out) indexed
   with 1 and with 2 workers into fresh homes (nothing cached).
2. The whole corpus indexed with 2 workers into SQLite (the subset's analyses reused from step 1),
   then into PostgreSQL (every analysis reused: the store's writes and the fingerprints' reads).
3. Query latency: --queries functions of the corpus (>= 8 instructions, seeded) searched for with
   limit 10 in each store; p50 and p95.
4. Quality: every function of a quality -O2 build with a symbol that the -O3 build also has (the C
   run time's and PLT stubs left out) searched for in the whole corpus; a hit is the -O3 build's
   function of that name among the top 10 results from binaries other than the query's own.

    PYTHONPATH=src nice -n 19 python bench/corpus.py [--work DIR] [--pg-url URL] [--subset 150]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from binlens.corpus.index import IndexOptions, IndexReport, Progress, index  # noqa: E402
from binlens.corpus.store import CorpusStore, open_store, total_bytes  # noqa: E402

CORPUS = Path(os.environ.get("BINLENS_CORPUS", ROOT.parent / "shared" / "corpus"))
CRT = {
    "_start",
    "_init",
    "_fini",
    "frame_dummy",
    "register_tm_clones",
    "deregister_tm_clones",
    "__do_global_dtors_aux",
    "__libc_csu_init",
    "__libc_csu_fini",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- the files
def quality_builds(work: Path) -> list[tuple[str, Path, Path]]:
    """(name, -O2 build, -O3 build) of every real C source that builds here."""
    out_dir = work / "quality"
    out_dir.mkdir(parents=True, exist_ok=True)
    py_inc = sysconfig.get_paths()["include"]
    jobs: list[tuple[str, list[str], list[str]]] = []  # (name, sources, extra flags)
    for src in sorted(glob.glob("/usr/share/doc/zlib1g-dev/examples/*.c")):
        jobs.append((f"zlib-{Path(src).stem}", [src], ["-lz"]))
    for src in sorted(glob.glob("/usr/share/doc/libpng-dev/examples/pngtest.c")):
        jobs.append(("libpng-pngtest", [src], ["-lpng", "-lz"]))
    for src in sorted(glob.glob(str(ROOT / "src/binlens/**/_*.c"), recursive=True)):
        jobs.append((f"binlens{Path(src).stem}.so", [src], ["-shared", "-fPIC", f"-I{py_inc}"]))
    for src in sorted(glob.glob(str(ROOT / "tests/fixtures/src/*.c"))):
        jobs.append((f"fixture-{Path(src).stem}", [src], []))
    got = []
    for name, sources, extra in jobs:
        paths = []
        for opt in ("-O2", "-O3"):
            dest = out_dir / f"{name}{opt}"
            if not dest.exists():
                r = subprocess.run(["gcc", opt, "-g", "-o", str(dest), *sources, *extra], capture_output=True)
                if r.returncode:
                    break
            paths.append(dest)
        if len(paths) == 2:
            got.append((name, paths[0], paths[1]))
    return got


def _elf_files(folder: str, max_size: int, limit: int) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(folder):
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            try:
                if os.path.islink(p) or not os.path.isfile(p) or not 4096 <= os.path.getsize(p) <= max_size:
                    continue
                with open(p, "rb") as fh:
                    if fh.read(4) != b"\x7fELF":
                        continue
            except OSError:
                continue
            out.append(p)
            if len(out) >= limit:
                return out
    return out


def select_files(args: argparse.Namespace, quality: list[tuple[str, Path, Path]]) -> dict[str, list[str]]:
    """The corpus's files by source."""
    sources: dict[str, list[str]] = {}
    if CORPUS.is_dir():
        sources["sample corpus"] = sorted(str(p) for p in CORPUS.rglob("*") if p.is_file())
    sources["/usr/bin"] = _elf_files("/usr/bin", args.max_size, args.per_folder)
    sources["/usr/lib"] = _elf_files("/usr/lib", args.max_size, args.per_folder)
    builds = HERE / "work"
    if builds.is_dir():
        sources["bench builds"] = sorted(str(p) for p in builds.glob("*/stripped") if p.is_file())
    sources["quality builds"] = [str(p) for _n, a, b in quality for p in (a, b)]
    return sources


def spread(files: list[str], n: int) -> list[str]:
    """`n` files spread evenly over `files`."""
    if len(files) <= n:
        return list(files)
    step = len(files) / n
    return [files[int(i * step)] for i in range(n)]


# ------------------------------------------------------------------------------------- indexing
def run_index(corpus: str, files: list[str], home: Path, store: CorpusStore, workers: int) -> IndexReport:
    shown = [0.0]

    def progress(p: Progress) -> None:
        if p.phase == "indexing" and time.monotonic() - shown[0] < 30:
            return
        shown[0] = time.monotonic()
        log(f"  {corpus}: {p.phase} {p.done}/{p.total} ({p.failed} failed)")

    opts = IndexOptions(corpus, files, home, workers=workers, timeout_s=120.0)
    report = index(opts, store, progress)
    log(
        f"  {corpus}: {report.indexed} indexed, {len(report.failed)} failed, {report.seconds:.1f} s, "
        f"{report.files_per_s:.2f} files/s, {report.functions_per_s:.0f} functions/s"
    )
    return report


def stored_fingerprints(home: Path, sha256: str) -> list[Any]:
    """The fingerprints stored in the program database of `sha256` under `home`."""
    return stored_program(home, sha256, tails=False)[0]


def stored_program(home: Path, sha256: str, tails: bool = True) -> tuple[list[Any], dict[int, list[int]]]:
    """The stored fingerprints of `sha256`'s program and (`tails`) its functions' tail jumps: what
    `corpus.search_function` passes as a query's context when the program is served."""
    from binlens.corpus.fingerprints import tail_calls
    from binlens.store import ProgramDatabase
    from binlens.store.analysis import AnalysisView
    from binlens.store.fingerprints import load_fingerprints

    found = sorted(glob.glob(str(home / "db" / f"{sha256}*.sqlite")))
    if not found:
        return [], {}
    db = ProgramDatabase(Path(found[0]))
    try:
        return load_fingerprints(db), tail_calls(db, AnalysisView(db)) if tails else {}
    finally:
        db.close()


# -------------------------------------------------------------------------------------- queries
def pick_queries(home: Path, shas: list[str], n: int) -> list[Any]:
    rng = random.Random(1)
    out: list[Any] = []
    pool = list(shas)
    rng.shuffle(pool)
    for sha in pool:
        fps = [fp for fp in stored_fingerprints(home, sha) if fp.instructions >= 8]
        if fps:
            out.append(rng.choice(fps))
        if len(out) >= n:
            break
    return out


def latency(store: CorpusStore, corpus: str, queries: list[Any]) -> tuple[float, float, float]:
    """(p50, p95, mean) of search_function in milliseconds (one warm-up query first)."""
    store.search_function(corpus, queries[0], limit=10)
    times = []
    for fp in queries:
        t0 = time.perf_counter()
        store.search_function(corpus, fp, limit=10)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.95))], statistics.fmean(times)


def quality(
    store: CorpusStore, corpus: str, home: Path, builds: list[tuple[str, Path, Path]]
) -> tuple[list[list[str]], dict[str, int]]:
    """Per build: functions searched, found in the top 10, and the totals."""
    from binlens.loader.digest import sha256_hex

    rows = []
    totals = {"searched": 0, "top1": 0, "top10": 0, "searched8": 0, "top10_8": 0}
    for name, o2, o3 in builds:
        sha2, sha3 = sha256_hex(o2.read_bytes()), sha256_hex(o3.read_bytes())
        fp2, tails2 = stored_program(home, sha2)
        names3 = {fp.name for fp in stored_fingerprints(home, sha3) if fp.name}
        wanted = [fp for fp in fp2 if fp.name and fp.name in names3 and fp.name not in CRT and "@plt" not in fp.name]
        top1 = top10 = searched8 = top10_8 = 0
        for fp in wanted:
            # searched as corpus.search_function searches a served program's function: with its context
            found_all = store.search_function(corpus, fp, 40, context=fp2, tail_calls=tails2.get(fp.address, ()))
            hits = [h for h in found_all if h.sha256 != sha2][:10]
            found = [i for i, h in enumerate(hits) if h.sha256 == sha3 and h.name == fp.name]
            top10 += bool(found)
            top1 += bool(found and found[0] == 0)
            if fp.instructions >= 8:
                searched8 += 1
                top10_8 += bool(found)
        rows.append([name, str(len(wanted)), str(top1), str(top10), f"{top10 / len(wanted):.2f}" if wanted else "-"])
        for k, v in zip(totals, (len(wanted), top1, top10, searched8, top10_8), strict=True):
            totals[k] += v
    return rows, totals


# ---------------------------------------------------------------------------------------- tables
def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=HERE / "work" / "corpus-bench", help="homes, builds, results")
    ap.add_argument("--pg-url", default=None, help="a PostgreSQL database to use (default: a server started here)")
    ap.add_argument("--subset", type=int, default=150, help="files of the throughput runs")
    ap.add_argument("--queries", type=int, default=200, help="functions searched for in the latency runs")
    ap.add_argument("--max-size", type=int, default=1 << 20, help="largest /usr/bin and /usr/lib file taken")
    ap.add_argument("--per-folder", type=int, default=400, help="most ELF files taken from /usr/bin and /usr/lib each")
    ap.add_argument("--throughput-only", action="store_true", help="only step 1 (1 and 2 workers on the subset)")
    ap.add_argument("--repeat", type=int, default=1, help="throughput runs per worker count, alternating")
    args = ap.parse_args()
    work = args.work.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out["commit"] = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    out["load_before"] = os.getloadavg()

    log("building the quality set")
    builds = quality_builds(work)
    sources = select_files(args, builds)
    files = [f for fs in sources.values() for f in fs]
    log(f"{len(files)} files: " + ", ".join(f"{k} {len(v)}" for k, v in sources.items()))

    # 1. throughput on a subset, 1 and 2 workers, nothing cached
    pool = [f for k, fs in sources.items() for f in fs if "/fuzzed/" not in f]
    subset = spread(pool, args.subset)
    runs: dict[int, IndexReport] = {}
    for r in range(args.repeat):
        for workers in (1, 2):
            home = work / f"home-w{workers}-{r}"
            store = open_store(None, home)
            got = run_index("subset", subset, home, store, workers)
            store.close()
            log(
                f"  load average {os.getloadavg()[0]:.1f}; workers busy {_busy(got):.2f}, "
                f"{got.task_seconds:.1f} s in tasks"
            )
            if workers not in runs or got.files_per_s > runs[workers].files_per_s:
                runs[workers] = got  # (the best of the repeats: the least disturbed by other work)
    if args.throughput_only:
        w1, w2 = runs[1], runs[2]
        print(
            f"subset {len(subset)} files: 1 worker {w1.files_per_s:.2f} files/s {w1.functions_per_s:.0f} fn/s; "
            f"2 workers {w2.files_per_s:.2f} files/s {w2.functions_per_s:.0f} fn/s; "
            f"{w2.files_per_s / w1.files_per_s:.2f}x (best of {args.repeat})"
        )
        return
    # 2. the whole corpus into SQLite (home of the 2-worker run: the subset's analyses are reused)
    home = work / "home-w2-0"
    sqlite = open_store(None, home)
    full = run_index("full", files, home, sqlite, 2)
    server = None
    pg_url = args.pg_url
    if pg_url is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from corpus_support import PostgresServer, postgres_bin

        bindir = postgres_bin()
        if bindir is not None:
            server = PostgresServer(bindir)
            server.start()
            pg_url = server.database("bench")
    try:
        pg = open_store(pg_url, home) if pg_url else None
        full_pg = run_index("full", files, home, pg, 2) if pg is not None else None
        # 3. latency
        shas = sorted(sqlite.indexed("full"))
        queries = pick_queries(home, shas, args.queries)
        lat = {"SQLite": latency(sqlite, "full", queries)}
        if pg is not None:
            lat["PostgreSQL"] = latency(pg, "full", queries)
        # 4. quality
        qrows, qtot = quality(sqlite, "full", home, builds)
        info = sqlite.info("full")
        sizes = {"SQLite": total_bytes(sqlite)}
        if pg is not None:
            sizes["PostgreSQL"] = total_bytes(pg)
            pg.close()
    finally:
        if server is not None:
            server.stop()
    sqlite.close()
    out["load_after"] = os.getloadavg()
    report(out, sources, subset, runs, full, full_pg, lat, len(queries), qrows, qtot, info, sizes, home)


def report(
    out: dict[str, Any],
    sources: dict[str, list[str]],
    subset: list[str],
    runs: dict[int, IndexReport],
    full: IndexReport,
    full_pg: IndexReport | None,
    lat: dict[str, tuple[float, float, float]],
    nq: int,
    qrows: list[list[str]],
    qtot: dict[str, int],
    info: Any,
    sizes: dict[str, int],
    home: Path,
) -> None:
    w1, w2 = runs[1], runs[2]
    speedup = w2.files_per_s / w1.files_per_s if w1.files_per_s else 0.0
    db_bytes = sum(p.stat().st_size for p in (home / "db").glob("*"))
    parts = [
        f"Commit {out['commit']}, {out['date']}; load average before {out['load_before'][0]:.1f}, "
        f"after {out['load_after'][0]:.1f} (2 cores shared with other work; run under nice -n 19).",
        "",
        table(
            ["source", "files given"],
            [[k, str(len(v))] for k, v in sources.items()]
            + [["**total**", str(sum(len(v) for v in sources.values()))]],
        ),
        "",
        f"Whole corpus: {full.found} distinct executables ({full.duplicates} duplicate copies), "
        f"**{full.indexed + full.skipped} indexed**, {len(full.failed)} failed "
        f"({_codes(full)}); {info.functions:,} functions, {info.strings:,} distinct strings, "
        f"{info.imports:,} distinct imports. 2 workers: {full.seconds:.0f} s, {full.files_per_s:.2f} files/s, "
        f"{full.functions_per_s:,.0f} functions/s (the subset's {len(subset)} analyses reused).",
        "",
        f"Throughput on a subset of {len(subset)} files (spread over the sources, fuzzer crashers left out), "
        "fresh homes:",
        "",
        table(
            ["workers", "indexed", "failed", "seconds", "files/s", "functions/s", "vs 1 worker"],
            [
                [
                    str(w),
                    str(r.indexed),
                    str(len(r.failed)),
                    f"{r.seconds:.1f}",
                    f"{r.files_per_s:.2f}",
                    f"{r.functions_per_s:,.0f}",
                    "1.00x" if w == 1 else f"**{speedup:.2f}x**",
                ]
                for w, r in runs.items()
            ],
        ),
        "",
    ]
    if full_pg is not None:
        parts += [
            f"Into PostgreSQL (every analysis and fingerprint reused from the program databases: the store's "
            f"writes): {full_pg.indexed} binaries in {full_pg.seconds:.0f} s, {full_pg.files_per_s:.1f} files/s.",
            "",
        ]
    parts += [
        f"Query latency, `search_function` limit 10, {nq} functions (>= 8 instructions) of the corpus "
        f"({info.binaries:,} binaries, {info.functions:,} functions):",
        "",
        table(
            ["store", "p50 ms", "p95 ms", "mean ms"],
            [[k, f"**{p50:.1f}**", f"{p95:.1f}", f"{mean:.1f}"] for k, (p50, p95, mean) in lat.items()],
        ),
        "",
        "Search quality, -O2 function -> its -O3 build in the top 10 (results from other binaries than the "
        "query's own), whole corpus:",
        "",
        table(["build", "functions", "top 1", "top 10", "recall@10"], qrows),
        "",
        f"**Total: {qtot['top10']}/{qtot['searched']} = {qtot['top10'] / max(1, qtot['searched']):.3f} recall@10** "
        f"(top 1: {qtot['top1'] / max(1, qtot['searched']):.3f}); functions of >= 8 instructions: "
        f"{qtot['top10_8']}/{qtot['searched8']} = {qtot['top10_8'] / max(1, qtot['searched8']):.3f}.",
        "",
        table(
            ["store", "bytes", "bytes per function"],
            [[k, f"{v:,}", f"{v / max(1, info.functions):,.0f}"] for k, v in sizes.items()],
        )
        + f"\n\nProgram databases beside it (the per-binary analyses): {db_bytes / 2**20:,.0f} MiB, "
        f"{db_bytes / max(1, info.binaries) / 2**20:.2f} MiB per binary.",
    ]
    est = {
        "functions_per_binary": info.functions / max(1, info.binaries),
        "store_bytes_per_function": {k: v / max(1, info.functions) for k, v in sizes.items()},
        "seconds_per_file_per_worker": 1 / w1.files_per_s if w1.files_per_s else None,
        "program_db_bytes_per_binary": db_bytes / max(1, info.binaries),
    }
    parts += ["", "Figures for the estimate: " + json.dumps(est)]
    print("\n".join(parts))


def _busy(r: IndexReport) -> float:
    """The share of the run its workers spent in files (1.0: never waiting for the driver)."""
    return r.task_seconds / (r.seconds * r.workers) if r.seconds and r.workers else 0.0


def _codes(r: IndexReport) -> str:
    counts: dict[str, int] = {}
    for f in r.failed:
        counts[f.code] = counts.get(f.code, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


if __name__ == "__main__":
    main()
