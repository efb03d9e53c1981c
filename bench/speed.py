"""Wall time and peak RSS of full analysis: binlens, `objdump -d` and the peers, on the corpus and libc.so.6.

Every tool runs as its own process under `/usr/bin/time -v`, one at a time, on the stripped
corpus binaries of the chosen subset and on the system's libc.so.6. binlens gets a fresh program
database each run (a full analysis: functions, blocks, xrefs, strings). Prints a Markdown table
with each tool's wall time, its ratio to `objdump -d` on the same file in the same run, and peak
RSS (and its ratio to the file size for binlens), then corpus totals.
binlens and objdump run `--repeat` times (default 3) and the run with the median wall time is kept.

    .venv/bin/python bench/speed.py --quick
    .venv/bin/python bench/speed.py --programs sqlite3 --tools binlens,ddisasm --no-libc
    .venv/bin/python bench/speed.py --no-corpus --tools binlens --repeat 1 --extra /usr/lib/gcc/x86_64-linux-gnu/12/cc1

binlens and objdump are measured in every run. Peer timings are cached per tool version and file
in WORKDIR/results/speed/ (peers take minutes per file) and reused unless `--fresh`; the notes say
when they were measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import builds
import tools

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def measure_cached(  # noqa: ANN201
    tool: str, path: Path, label: str, workdir: Path, version: str, timeout: float, fresh: bool, repeat: int = 1
):
    """(Run, measured_at): peers come from the cache when the same version measured the same file.

    binlens and objdump run `repeat` times; the run with the median wall time is kept."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    cache = workdir / "results" / "speed" / tool / f"{label}.json"
    if tool in tools.PEERS and cache.is_file() and not fresh:
        data = json.loads(cache.read_text())
        if data.get("version") == version and data.get("sha256") == digest:
            fields = tools.Run.__dataclass_fields__
            return tools.Run(**{k: v for k, v in data["run"].items() if k in fields}), data["measured_at"]
    builds.log(f"{tool} on {label} ...")
    runs = [tools.run_tool(tool, path, workdir, timeout) for _ in range(1 if tool in tools.PEERS else max(1, repeat))]
    runs.sort(key=lambda r: (r.error is not None, r.wall or 0.0))
    run = runs[(len(runs) - 1) // 2] if not runs[0].error else runs[0]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    builds.log(
        f"{tool} on {label}: {run.wall or 0:.2f}s {run.rss_kb or 0} KiB" + (f" ERROR {run.error}" if run.error else "")
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"version": version, "sha256": digest, "measured_at": when, "run": run.to_json()}))
    return run, when


def mib(kb: int | None) -> str:
    """KiB as MiB text."""
    return "?" if kb is None else f"{kb / 1024:.0f}"


def main() -> int:
    """Build, measure, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    builds.add_subset_args(ap)
    ap.add_argument("--tools", default=",".join(tools.ALL_TOOLS), help="comma list of " + ",".join(tools.ALL_TOOLS))
    ap.add_argument("--quick", action="store_true", help="only -O2 PIE builds with unwind info, both compilers")
    ap.add_argument("--no-libc", action="store_true", help=f"skip {LIBC}")
    ap.add_argument("--no-corpus", action="store_true", help="only libc.so.6 (and the --extra files)")
    ap.add_argument(
        "--extra",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="also measure FILE, like libc.so.6 (outside the corpus totals); repeatable. A large "
        "binary shows how time and memory scale: /usr/lib/gcc/x86_64-linux-gnu/12/cc1 is 32 MiB "
        "(the chosen peers run on it too: ddisasm peaks at ~30x binlens's memory on libc)",
    )
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per tool run")
    ap.add_argument("--fresh", action="store_true", help="re-measure the peers too")
    ap.add_argument("--repeat", type=int, default=3, help="runs of binlens and objdump per file (median kept)")
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    args = ap.parse_args()
    if args.quick:
        args.opts, args.pie, args.unwind = "O2", "pie", "eh"
    chosen = [t.strip() for t in args.tools.split(",") if t.strip()]
    bad = [t for t in chosen if t not in tools.ALL_TOOLS]
    if bad:
        ap.error(f"unknown tool(s): {', '.join(bad)}")
    workdir = args.workdir.resolve()
    tools.OBJDUMP = builds.ARCHES[args.arch].tool("objdump")  # the cross binutils' objdump off x86-64
    files: list[tuple[str, Path]] = []
    if not args.no_corpus:
        for b in builds.build_all(workdir, builds.variants_from_args(args), args.jobs):
            files.append((b.variant.name, b.stripped))
    if not args.no_libc:
        if LIBC.is_file():
            files.append(("libc.so.6", LIBC.resolve()))
        else:
            builds.log(f"{LIBC} not found; skipped")
    for extra in args.extra:
        if not extra.is_file():
            ap.error(f"--extra {extra}: no such file")
        files.append((extra.name, extra.resolve()))
    outside = {"libc.so.6", *(extra.name for extra in args.extra)}  # measured alone, not in the corpus totals

    unavailable: dict[str, str] = {}
    versions: dict[str, str] = {"objdump": tools.tool_version("objdump", workdir)}
    for tool in chosen:
        try:
            if tool == "binlens":
                tools.binlens_mode()
            else:
                tools.check_peer(tool, workdir)
            versions[tool] = tools.tool_version(tool, workdir)
        except tools.Unavailable as exc:
            unavailable[tool] = str(exc)

    header = ["file", "MiB", "objdump -d s", "objdump CPU s"]
    for t in chosen:
        header += [f"{t} s", f"{t} ×objdump", f"{t} CPU s", f"{t} CPU ×objdump", f"{t} peak MiB"]
        if t == "binlens":
            header.append("binlens RSS ×file")
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    totals: dict[str, float] = {}
    cpu_totals: dict[str, float] = {}
    complete: dict[str, bool] = {}
    peer_times: list[str] = []
    for label, path in files:
        size = path.stat().st_size
        base, _ = measure_cached("objdump", path, label, workdir, versions["objdump"], args.timeout, True, args.repeat)
        cells = [f"`{label}`", f"{size / 2**20:.2f}", f"{base.wall:.2f}" if base.wall else "?", f"{base.cpu:.2f}"]
        if label not in outside:
            totals["objdump"] = totals.get("objdump", 0.0) + (base.wall or 0.0)
            cpu_totals["objdump"] = cpu_totals.get("objdump", 0.0) + (base.cpu or 0.0)
        for t in chosen:
            if t in unavailable:
                cells += [f"n/a: {unavailable[t]}", "", "", "", ""] + ([""] if t == "binlens" else [])
                continue
            run, when = measure_cached(t, path, label, workdir, versions[t], args.timeout, args.fresh, args.repeat)
            if t in tools.PEERS:
                peer_times.append(when)
            wall = f"{run.wall:.2f}" if run.wall is not None else "?"
            if run.error:
                wall += f" ({run.error})"
            ratio = f"{run.wall / base.wall:.1f}" if run.wall and base.wall else "?"
            cpu = f"{run.cpu:.1f}" if run.cpu is not None else "?"
            cpu_ratio = f"{run.cpu / base.cpu:.1f}" if run.cpu is not None and base.cpu else "?"
            cells += [wall, ratio, cpu, cpu_ratio, mib(run.rss_kb)]
            if t == "binlens":
                cells.append(f"{run.rss_kb * 1024 / size:.1f}" if run.rss_kb else "?")
            if label not in outside:
                totals[t] = totals.get(t, 0.0) + (run.wall or 0.0)
                cpu_totals[t] = cpu_totals.get(t, 0.0) + (run.cpu or 0.0)
                complete[t] = complete.get(t, True) and not run.error
        rows.append("| " + " | ".join(cells) + " |")
    corpus_files = [f for f in files if f[0] not in outside]
    notes = []
    if corpus_files:
        cells = [
            f"**corpus total ({len(corpus_files)} files)**",
            "",
            f"{totals.get('objdump', 0):.2f}",
            f"{cpu_totals.get('objdump', 0):.2f}",
        ]
        for t in chosen:
            if t in unavailable:
                cells += ["n/a", "", "", "", ""] + ([""] if t == "binlens" else [])
                continue
            tot = totals.get(t, 0.0)
            mark = "" if complete.get(t, True) else " (incl. failed runs)"
            ratio = f"{tot / totals['objdump']:.1f}" if totals.get("objdump") else "?"
            ctot = cpu_totals.get(t, 0.0)
            cratio = f"{ctot / cpu_totals['objdump']:.1f}" if cpu_totals.get("objdump") else "?"
            cells += [f"{tot:.2f}{mark}", ratio, f"{ctot:.1f}", cratio, ""]
            if t == "binlens":
                cells.append("")
        rows.append("| " + " | ".join(cells) + " |")
        if "binlens" in totals and totals["binlens"]:
            for t in tools.PEERS:
                if t in totals and complete.get(t, True):
                    notes.append(
                        f"Corpus: {t} takes {totals[t] / totals['binlens']:.1f}× binlens's wall time "
                        f"({cpu_totals[t] / max(cpu_totals['binlens'], 1e-9):.1f}× its CPU time)."
                    )
    subset = (
        "no corpus binaries"
        if args.no_corpus
        else f"programs={args.programs} compilers={args.compilers} opts={args.opts} pie={args.pie} unwind={args.unwind}"
    )
    notes += [
        f"Subset: {subset}"
        + ("" if args.no_libc else f" + {LIBC}")
        + "".join(f" + {extra}" for extra in args.extra)
        + ".",
        "Tools: " + ", ".join(f"{t} {versions.get(t, 'n/a')}" for t in ["objdump", *chosen]) + ".",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}; "
        f"run finished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
    ]
    if peer_times:
        notes.append(f"Peer timings measured between {min(peer_times)} and {max(peer_times)} (cached per version).")
    text = "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
