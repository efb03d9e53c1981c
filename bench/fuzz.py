"""Mutation fuzzing of binlens's loader and analysis with corpus files (issue 30's acceptance run).

Mutant i of seed s comes from one source file of the corpus (ELF, PE, Mach-O or fat Mach-O; the
formats taken in turn, the file drawn by (s, i)) with header-field, load-command, truncation and
byte-flip mutations (`fuzz_mutate.py`). Each goes through `program.open`, `program.get` and a full
analysis in its own forked child under a memory limit (RLIMIT_AS) and a wall-clock limit
(`fuzz_runner.py`). The table (stdout) gives, per format: mutants, ok, clean errors by code,
crashes, hangs, out-of-memory ends, peak RSS median/p99/max and seconds per mutant; the JSON
summary (`--out`) also has one record per mutant (its source, mutations, outcome, peak RSS).
Failing mutants are kept in `bench/results/fuzz/` (git-ignored) as `s<seed>-i<index>-<format>.bin`
with their record and stderr; every other mutant is deleted. Exit status 1 on any crash or hang.

    .venv/bin/python bench/fuzz.py --count 200 --jobs 2
    .venv/bin/python bench/fuzz.py --count 10000 --seed 1 --jobs 2 --timeout 60 --mem 2048
    .venv/bin/python bench/fuzz.py --seed 1 --start 4711 --count 1      # one mutant again

Sources: `$BINLENS_CORPUS` (default `/work/shared/corpus`, or `--corpus`), without its `fuzzed/`
folder unless `--include-fuzzed`. The files are only read, never executed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fuzz_mutate
from fuzz_runner import HOOKS, Job, Limits, Record, Runner, Tally

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = "/work/shared/corpus"
RESULTS = ROOT / "bench" / "results" / "fuzz"


def commit() -> str:
    """The repository's commit (short hash, '+dirty' when src/ or bench/ has changes)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=10", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src", "bench"],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def collect_sources(corpus: Path, formats: list[str], include_fuzzed: bool, max_bytes: int) -> dict[str, list[Path]]:
    """The corpus files of each wanted format (by content, not name), sorted by path."""
    out: dict[str, list[Path]] = {f: [] for f in formats}
    for path in sorted(corpus.rglob("*")):
        rel = path.relative_to(corpus)
        if not include_fuzzed and rel.parts[0] == "fuzzed":
            continue
        try:
            if not path.is_file() or path.is_symlink() or path.stat().st_size > max_bytes:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        fmt = fuzz_mutate.detect_format(data)
        if fmt in out:
            out[fmt].append(path)
    return {f: v for f, v in out.items() if v}


def make_jobs(sources: dict[str, list[Path]], corpus: Path, seed: int, start: int, count: int):  # noqa: ANN201
    """Mutant `start`..`start+count-1` of `seed`: formats in turn, the source drawn by (seed, index)."""
    formats = sorted(sources)
    cache: dict[Path, bytes] = {}
    for index in range(start, start + count):
        fmt = formats[index % len(formats)]
        files = sources[fmt]
        path = files[random.Random(f"{seed}:{index}:source").randrange(len(files))]
        if path not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[path] = path.read_bytes()
        mutant = fuzz_mutate.mutate(cache[path], seed, index)
        yield Job(index, fmt, str(path.relative_to(corpus)), mutant.ops, mutant.data)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summarise(records: list[Record]) -> dict[str, Tally]:
    """One tally per format and one for all ('all')."""
    out: dict[str, Tally] = {}
    for rec in sorted(records, key=lambda r: r.index):
        out.setdefault(rec.fmt, Tally()).add(rec)
        out.setdefault("all", Tally()).add(rec)
    return out


def _figures(t: Tally) -> dict:
    """A tally as JSON data: counts, peak RSS (KiB) and seconds per mutant as median, p99, max."""
    return {
        "mutants": t.mutants, "ok": t.ok, "errors": t.errors, "crashes": t.crashes, "hangs": t.hangs, "oom": t.oom,
        "rss_kib": {"median": statistics.median(t.rss_kib), "p99": _pct(t.rss_kib, 0.99), "max": max(t.rss_kib)},
        "seconds": {"median": statistics.median(t.seconds), "p99": _pct(t.seconds, 0.99), "max": max(t.seconds)},
        "cpu_s": {"mean": statistics.fmean(t.cpu_s), "max": max(t.cpu_s)},
    }  # fmt: skip


def render(tallies: dict[str, Tally], meta: dict) -> str:
    """The Markdown table of a run, with its commit, date and settings."""
    lines = [
        f"Commit `{meta['commit']}`, {meta['date']}; seed {meta['seed']}, mutants {meta['start']}.."
        f"{meta['start'] + meta['count'] - 1}, {meta['jobs']} at a time, limits {meta['timeout_s']:g} s and "
        f"{meta['mem_mib']} MiB (RLIMIT_AS) per mutant; {meta['wall_s']:.0f} s in all "
        f"({meta['wall_s'] / max(1, meta['count']):.2f} s per mutant).",
        "",
        "| format | mutants | ok | clean errors (by code) | crashes | hangs | oom | peak RSS MiB median / p99 / max "
        "| s per mutant median / max | CPU s per mutant |",
        "|---|---:|---:|---|---:|---:|---:|---|---|---:|",
    ]
    for name in [*sorted(k for k in tallies if k != "all"), "all"]:
        t = tallies.get(name)
        if t is None:
            continue
        errors = ", ".join(f"{code} {n}" for code, n in sorted(t.errors.items(), key=lambda x: (-x[1], x[0])))
        rss = [r / 1024 for r in t.rss_kib]
        label = f"**{name}**" if name == "all" else name
        lines.append(
            f"| {label} | {t.mutants} | {t.ok} | {errors or '-'} | {t.crashes} | {t.hangs} | {t.oom} "
            f"| {statistics.median(rss):.0f} / {_pct(rss, 0.99):.0f} / {max(rss):.0f} "
            f"| {statistics.median(t.seconds):.2f} / {max(t.seconds):.1f} | {statistics.fmean(t.cpu_s):.2f} |"
        )
    return "\n".join(lines)


def render_failures(records: list[Record]) -> str:
    """One line per crash, hang, out-of-memory end or clean error hiding a parser failure: what to look at."""
    bad = [r for r in sorted(records, key=lambda r: r.index) if r.outcome in ("crash", "hang", "oom") or r.flag]
    if not bad:
        return ""
    lines = ["", "| index | format | source | outcome | stage | code | where / message |"]
    lines.append("|---:|---|---|---|---|---|---|")
    for r in bad:
        what = (r.where or r.message or "").replace("|", "\\|")[:160]
        outcome = f"{r.outcome} ({r.flag})" if r.flag else r.outcome
        lines.append(f"| {r.index} | {r.fmt} | {r.source} | {outcome} | {r.stage} | {r.code} | {what} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=200, help="number of mutants (default 200)")
    ap.add_argument("--seed", type=int, default=1, help="seed: mutant i of seed s is always the same bytes")
    ap.add_argument("--start", type=int, default=0, help="index of the first mutant (to re-run one: --count 1)")
    ap.add_argument("--jobs", type=int, default=2, help="children at a time (default 2)")
    ap.add_argument("--timeout", type=float, default=60.0, help="wall-clock limit per mutant, seconds (default 60)")
    ap.add_argument("--mem", type=int, default=2048, help="RLIMIT_AS per process, MiB (default 2048)")
    ap.add_argument("--formats", default=",".join(fuzz_mutate.FORMATS), help="elf,pe,macho,fat (default all)")
    ap.add_argument("--corpus", type=Path, default=Path(os.environ.get("BINLENS_CORPUS", DEFAULT_CORPUS)))
    ap.add_argument("--include-fuzzed", action="store_true", help="also mutate the corpus's fuzzed/ folder")
    ap.add_argument("--max-source-bytes", type=int, default=4 << 20, help="skip larger sources (default 4 MiB)")
    ap.add_argument("--out", type=Path, help="JSON summary (default bench/results/fuzz/summary-s<seed>.json)")
    ap.add_argument("--keep-dir", type=Path, default=RESULTS, help="where failing mutants are kept")
    ap.add_argument("--test-hook", choices=HOOKS, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer; 0 when no mutant crashed or hung."""
    args = parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(formats) - set(fuzz_mutate.FORMATS))
    if unknown:
        sys.exit(f"unknown format(s): {', '.join(unknown)}")
    if not args.corpus.is_dir():
        sys.exit(f"no corpus at {args.corpus} (set BINLENS_CORPUS or --corpus)")
    sources = collect_sources(args.corpus, formats, args.include_fuzzed, args.max_source_bytes)
    if not sources:
        sys.exit(f"no {'/'.join(formats)} files in {args.corpus}")
    meta = {
        "commit": commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "seed": args.seed,
        "start": args.start,
        "count": args.count,
        "jobs": args.jobs,
        "timeout_s": args.timeout,
        "mem_mib": args.mem,
        "corpus": str(args.corpus),
        "sources": {f: len(v) for f, v in sources.items()},
    }
    print(f"fuzz: {meta['sources']} source files; commit {meta['commit']}", file=sys.stderr)
    limits = Limits(timeout_s=args.timeout, mem_bytes=args.mem << 20, hook=args.test_hook)
    records: list[Record] = []
    t0 = time.monotonic()

    def progress(rec: Record) -> None:
        if rec.outcome in ("crash", "hang", "oom") or rec.flag:
            print(f"fuzz: #{rec.index} {rec.fmt} {rec.source}: {rec.outcome} ({rec.stage}, {rec.code}) "
                  f"{rec.where or rec.message or ''}", file=sys.stderr)  # fmt: skip
        done = len(records) + 1
        if done % 50 == 0:
            print(f"fuzz: {done}/{args.count} in {time.monotonic() - t0:.0f} s", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="binlens-fuzz-") as tmp:
        runner = Runner(limits, args.jobs, Path(tmp), args.keep_dir, args.seed)
        for rec in runner.run(make_jobs(sources, args.corpus, args.seed, args.start, args.count), progress):
            records.append(rec)
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    tallies = summarise(records)
    print(render(tallies, meta) + render_failures(records))
    out = args.out or RESULTS / f"summary-s{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "meta": meta,
        "by_format": {k: _figures(t) for k, t in tallies.items()},
        "mutants": [r.to_dict() for r in sorted(records, key=lambda r: r.index)],
    }
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"fuzz: summary in {out}", file=sys.stderr)
    bad = tallies.get("all")
    return 1 if bad is not None and (bad.crashes or bad.hangs) else 0


if __name__ == "__main__":
    sys.exit(main())
