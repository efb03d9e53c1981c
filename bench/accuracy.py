"""Function-start accuracy of binlens and its peers on the stripped corpus.

Builds the corpus (see builds.py) if needed, runs every chosen tool on every chosen stripped binary,
and prints a Markdown table of precision / recall / F1 of function starts per binary and
micro-averaged (all binaries; with unwind information; without). Ground truth: the FUNC symbols
of nonzero size in executable sections of the unstripped build. Predictions in PLT sections and
at size-0 FUNC symbols (crt's `_init`, `frame_dummy`, ...) are not scored.

    .venv/bin/python bench/accuracy.py --quick
    .venv/bin/python bench/accuracy.py --programs zlib,lua5.4 --compilers clang --tools binlens,smda

`--arch aarch64|arm|mips|ppc|ppc64le|riscv64|i386` scores the cross-compiled corpus (see builds.py): binlens and
the `.eh_frame` baseline run everywhere; of the peers only ddisasm handles one of these targets
(ARM64, ARM32, MIPS32), the others show `n/a` with the reason.

A tool that cannot run here shows `n/a: <reason>`; a run that fails or times out on one binary counts
as finding nothing there (and is marked). Results are cached per tool version and binary in
WORKDIR/results/ (`--fresh` ignores the cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from bisect import bisect_right
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import builds
import tools
from metrics import Score, in_ranges, score


def sha256(path: Path) -> str:
    """Hex digest of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cached_run(tool: str, binary: builds.Binary, workdir: Path, version: str, timeout: float, fresh: bool) -> tools.Run:
    """Run a tool on a binary, or reuse the result of the same tool version on the same file."""
    cache = workdir / "results" / "accuracy" / tool / f"{binary.variant.name}.json"
    digest = sha256(binary.stripped)
    if cache.is_file() and not fresh:
        data = json.loads(cache.read_text())
        if data.get("version") == version and data.get("sha256") == digest:
            return tools.Run(**data["run"])
    builds.log(f"{tool} on {binary.variant.name} ...")
    run = tools.run_tool(tool, binary.stripped, workdir, timeout)
    builds.log(
        f"{tool} on {binary.variant.name}: {len(run.starts)} starts, {run.wall or 0:.1f}s"
        + (f" ERROR {run.error}" if run.error else "")
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"version": version, "sha256": digest, "run": run.to_json()}))
    return run


# Peers off x86-64: what each supports, and why it is not in the table otherwise.
PEER_ARCHES = {
    "smda": (set(), "smda disassembles x86/x64 only"),
    "angr": (set(), "not run off x86-64 in this bench (CFGFast would need per-arch validation; time budget)"),
    "ddisasm": ({"aarch64", "arm", "mips"}, "ddisasm has no PowerPC or RISC-V backend"),
}


def arch_unavailable(tool: str, arch: str) -> str | None:
    """Why a peer is not run on this architecture (None: it is)."""
    if arch == builds.NATIVE or tool not in PEER_ARCHES:
        return None
    supported, reason = PEER_ARCHES[tool]
    return None if arch in supported else reason


def fmt(s: Score) -> str:
    """One table cell: precision / recall / F1."""
    return f"{s.precision:.3f} / {s.recall:.3f} / **{s.f1:.3f}**"


def explain(binary: builds.Binary, tool: str, starts: list[int], limit: int) -> str:
    """The misses of one tool on one binary: false starts as `function+offset` inside the true function
    that contains them, missed starts by name (how many of those are gcc `.cold` parts)."""
    truth = binary.truth()
    ordered = sorted(truth)
    scope = sorted(binary.scope())
    neutral = binary.neutral()
    found = set(starts)
    false = [a for a in sorted(found) if a not in truth and a not in neutral and in_ranges(a, scope)]
    missed = [a for a in ordered if a not in found]

    def where(addr: int) -> str:
        i = bisect_right(ordered, addr) - 1
        return f"{truth[ordered[i]]}+{addr - ordered[i]:#x}" if i >= 0 else f"{addr:#x}"

    cold = sum(1 for a in missed if ".cold" in truth[a])
    lines = [
        f"{tool} on {binary.variant.name}: {len(false)} false starts, {len(missed)} missed ({cold} .cold parts)",
        "  false: " + ", ".join(f"{a:#x} ({where(a)})" for a in false[:limit]),
        "  missed: " + ", ".join(f"{a:#x} {truth[a]}" for a in missed[:limit]),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    """Build, run, score, print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    builds.add_subset_args(ap)
    every = (*tools.ALL_TOOLS, *tools.BASELINES)
    ap.add_argument("--tools", default=",".join(every), help="comma list of " + ",".join(every))
    ap.add_argument(
        "--quick", action="store_true", help="only -O2 PIE builds (both compilers, with and without unwind)"
    )
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per tool run")
    ap.add_argument("--tool-jobs", type=int, default=1, help="tool runs in parallel (accuracy only, not timing)")
    ap.add_argument("--fresh", action="store_true", help="ignore cached results")
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    ap.add_argument("--explain", type=int, default=0, metavar="N", help="list up to N misses per binary and tool")
    args = ap.parse_args()
    if args.quick:
        args.opts, args.pie = "O2", "pie"
    chosen = [t.strip() for t in args.tools.split(",") if t.strip()]
    bad = [t for t in chosen if t not in every]
    if bad:
        ap.error(f"unknown tool(s): {', '.join(bad)}")
    variants = builds.variants_from_args(args)
    workdir = args.workdir.resolve()
    binaries = builds.build_all(workdir, variants, args.jobs)

    unavailable: dict[str, str] = {}
    versions: dict[str, str] = {}
    for tool in chosen:
        why = arch_unavailable(tool, args.arch)
        if why:
            unavailable[tool] = why
            continue
        try:
            if tool == "binlens":
                tools.binlens_mode()
            elif tool in tools.PEERS:
                tools.check_peer(tool, workdir)
            versions[tool] = tools.tool_version(tool, workdir)
        except tools.Unavailable as exc:
            unavailable[tool] = str(exc)

    runnable = [t for t in chosen if t not in unavailable]
    jobs = [(t, b) for b in binaries for t in runnable]
    t0 = time.monotonic()

    def one(job: tuple[str, builds.Binary]) -> tuple[tuple[str, str], tools.Run]:
        tool, binary = job
        try:
            run = cached_run(tool, binary, workdir, versions[tool], args.timeout, args.fresh)
        except tools.Unavailable as exc:
            run = tools.Run(tool=tool, error=f"n/a: {exc}")
        return (tool, binary.variant.name), run

    with ThreadPoolExecutor(max_workers=max(1, args.tool_jobs)) as pool:
        runs = dict(pool.map(one, jobs))

    rows: list[str] = []
    header = ["binary", "functions", *[f"{t} P / R / F1" for t in chosen]]
    rows.append("| " + " | ".join(header) + " |")
    rows.append("|" + "---|" * len(header))
    totals: dict[tuple[str, str], Score] = {}
    failures: dict[str, int] = {t: 0 for t in chosen}
    for b in binaries:
        truth = b.truth()
        cells = [f"`{b.variant.name}`", str(len(truth))]
        for tool in chosen:
            if tool in unavailable:
                cells.append("n/a")
                continue
            run = runs[(tool, b.variant.name)]
            s = score(truth, run.starts, b.scope(), b.neutral())
            for group in ("all", b.variant.unwind, b.variant.compiler):
                totals[(tool, group)] = totals.get((tool, group), Score()) + s
            if run.error:
                failures[tool] += 1
                cells.append(f"{fmt(s)} ({run.error})")
            else:
                cells.append(fmt(s))
        rows.append("| " + " | ".join(cells) + " |")
    groups = [
        ("all", "micro-average, all"),
        ("eh", "micro-average, with unwind info"),
        ("noeh", "micro-average, unwind info removed"),
        ("gcc", "micro-average, gcc"),
        ("clang", "micro-average, clang"),
    ]
    for key, label in groups:
        if not any((t, key) in totals for t in chosen):
            continue
        if key in builds.COMPILERS and len({b.variant.compiler for b in binaries}) == 1:
            continue  # one compiler: its average is the overall one
        n = sum(len(b.truth()) for b in binaries if key in ("all", b.variant.unwind, b.variant.compiler))
        cells = [f"**{label}**", str(n)]
        for tool in chosen:
            if tool in unavailable:
                cells.append("n/a")
            else:
                cells.append(fmt(totals[(tool, key)]))
        rows.append("| " + " | ".join(cells) + " |")

    notes = [
        f"Subset: arch={args.arch} programs={args.programs} compilers={args.compilers} opts={args.opts} pie={args.pie} "
        f"unwind={args.unwind} ({len(binaries)} binaries).",
        "Tools: " + ", ".join(f"{t} {versions.get(t, 'n/a')}" for t in chosen) + ".",
        f"Machine: {platform.node() or '?'} {platform.machine()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; tool time {time.monotonic() - t0:.0f}s.",
    ]
    notes += [f"{t}: n/a: {why}." for t, why in unavailable.items()]
    failed = [f"{t}: {n}" for t, n in failures.items() if n]
    if failed:
        notes.append("Failed runs (counted as finding nothing): " + ", ".join(failed) + ".")
    text = "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"
    if args.explain:
        for b in binaries:
            for tool in runnable:
                sys.stdout.write(explain(b, tool, runs[(tool, b.variant.name)].starts, args.explain))
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
