"""Parse ELF files with both readers and count: taken by the fast reader and equal to LIEF's Image,
left to LIEF, taken but different (must be 0), and errors the fast reader raised besides NeedsLief.

    python bench/elf_readers.py [--timing] [PATH...]

Without paths it reads every ELF under /work/bench-work/bin/*/{stripped,unstripped} and the corpus's
elf/, elf/analysis/ and fuzzed/ (read-only input: parsed, never executed). Each file is parsed in a
forked child with a time limit, so a crash or a hang of either reader is counted, not fatal.
"""

from __future__ import annotations

import argparse
import glob
import os
import pickle
import signal
import sys
import time
from collections import Counter

CORPUS = "/work/shared/corpus"


def default_paths() -> list[str]:
    """The bench builds and the corpus's ELF folders."""
    out = sorted(glob.glob("/work/bench-work/bin/*/stripped")) + sorted(glob.glob("/work/bench-work/bin/*/unstripped"))
    for sub in ("elf", "elf/analysis", "fuzzed"):
        out += sorted(p for p in glob.glob(f"{CORPUS}/{sub}/*") if os.path.isfile(p))
    return out


def compare(path: str, timing: bool) -> tuple[str, str, dict]:
    """(outcome, detail, extra) for one file: outcome is equal, lief, different, fast_error or not_elf."""
    from dataclasses import fields

    from binlens.errors import BinlensError
    from binlens.loader.image import encode_image
    from binlens.loader.parse_elf import NeedsLief, parse_elf
    from binlens.loader.parse_lief import parse_image

    with open(path, "rb") as fh:
        data = fh.read()
    if data[:4] != b"\x7fELF":
        return "not_elf", "", {}
    extra: dict = {}
    t = time.perf_counter()
    try:
        fast = parse_elf(data, os.path.basename(path))
    except NeedsLief as why:
        return "lief", str(why), {}
    except Exception as err:  # noqa: BLE001 - counted: the fast reader must only ever raise NeedsLief
        return "fast_error", f"{type(err).__name__}: {err}", {}
    extra["fast_ms"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    try:
        slow = parse_image(data, os.path.basename(path))
    except BinlensError as err:
        return "different", f"LIEF rejects it: {err.message}", extra
    extra["lief_ms"] = (time.perf_counter() - t) * 1000
    if encode_image(fast) == encode_image(slow) and fast.code_endian == slow.code_endian:
        return "equal", "", extra
    names = [f.name for f in fields(fast) if f.name != "data" and getattr(fast, f.name) != getattr(slow, f.name)]
    return "different", ",".join(names), extra


def run_one(path: str, timing: bool, timeout: float = 60.0) -> tuple[str, str, dict]:
    """`compare` in a forked child: a crash or a hang becomes an outcome."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            body = pickle.dumps(compare(path, timing))
        except BaseException as err:  # noqa: BLE001
            body = pickle.dumps(("fast_error", f"{type(err).__name__}: {err}", {}))
        with os.fdopen(wfd, "wb") as fh:
            fh.write(body)
        os._exit(0)
    os.close(wfd)
    signal.alarm(int(timeout))
    try:
        with os.fdopen(rfd, "rb") as fh:
            body = fh.read()
        signal.alarm(0)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return "hang", f"over {timeout:g} s", {}
    _, status = os.waitpid(pid, 0)
    if not body:
        return "crash", f"status {status}", {}
    return pickle.loads(body)


def _alarm(_signum: int, _frame: object) -> None:
    raise TimeoutError


def main() -> None:
    """Compare both readers on every file and print the counts (and every file not equal or left to LIEF)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--timing", action="store_true", help="print each accepted file's parse times")
    ap.add_argument("--quiet", action="store_true", help="do not list the files left to LIEF")
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    import binlens.loader.parse_lief  # noqa: F401 - once, before forking

    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for path in args.paths or default_paths():
        outcome, detail, extra = run_one(path, args.timing)
        counts[outcome] += 1
        if outcome == "lief":
            reasons[detail] += 1
        if outcome not in ("equal", "not_elf") and not (args.quiet and outcome == "lief"):
            print(f"{outcome:10} {path}: {detail}")
        elif args.timing and outcome == "equal":
            print(f"equal      {path}: fast {extra['fast_ms']:.1f} ms, LIEF {extra['lief_ms']:.1f} ms")
    print()
    print("| outcome | files |\n|---|---|")
    for key in ("equal", "lief", "different", "fast_error", "crash", "hang", "not_elf"):
        print(f"| {key} | {counts[key]} |")
    if reasons:
        print("\nLeft to LIEF, by reason:")
        for why, n in reasons.most_common():
            print(f"  {n:4}  {why}")
    sys.exit(1 if counts["different"] or counts["fast_error"] or counts["crash"] or counts["hang"] else 0)


if __name__ == "__main__":
    main()
