"""`binlens corpus index DIR... --corpus NAME`: the indexer's options, its progress on stderr and
its summary (a table for people, `--json` for agents). The run itself is `binlens.corpus.index`;
the subcommand registers in `cli/corpus_commands.py`'s table (which imports this module)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from binlens.cli.corpus_commands import corpus_command
from binlens.printable import escape_controls

_PLAIN_EVERY_S = 5.0  # a plain progress line at most this often when stderr is not a terminal


def configure_index(p: argparse.ArgumentParser) -> None:
    """Analyse every binary under DIRs in parallel on Ray into a corpus (resumable)."""
    from binlens.cli.main import byte_count
    from binlens.corpus.index import DEFAULT_TIMEOUT_S

    p.add_argument("paths", nargs="+", metavar="DIR", help="folders to walk recursively (or single files)")
    p.add_argument("--corpus", required=True, metavar="NAME", help="the corpus to add the binaries to")
    p.add_argument(
        "--store",
        dest="corpus_store",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="the corpus store, as --corpus-store: postgresql://... (default: SQLite under the home)",
    )
    p.add_argument(
        "--workers", type=_positive_int, default=None, help="CPUs of the local Ray (default: all of this machine's)"
    )
    p.add_argument("--ray-address", metavar="ADDR", default=None, help="use the Ray cluster at ADDR (host:port)")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds one file may take before its worker is killed and the file reported as failed "
        f"(default {DEFAULT_TIMEOUT_S:g})",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--max-file-bytes",
        metavar="N",
        type=byte_count,
        default=argparse.SUPPRESS,
        help="report files larger than N bytes as failed, unread (K, M, G suffixes; default 512M)",
    )


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def _positive_float(value: str) -> float:
    x = float(value)
    if not x > 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return x


@corpus_command("index", configure_index)
def run_index(args: argparse.Namespace) -> int:
    """Run `binlens corpus index`."""
    from binlens.corpus.index import IndexOptions, index
    from binlens.corpus.store import open_store
    from binlens.errors import BinlensError
    from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES
    from binlens.store import default_home

    home = args.home or default_home()
    opts = IndexOptions(
        corpus=args.corpus,
        paths=args.paths,
        home=home,
        workers=args.workers,
        ray_address=args.ray_address,
        timeout_s=args.timeout,
        max_file_bytes=args.max_file_bytes or DEFAULT_MAX_FILE_BYTES,
    )
    display = ProgressDisplay(sys.stderr)
    try:
        store = open_store(args.corpus_store, home, target="/options/corpus_store")
        try:
            report = index(opts, store, display.update)
        finally:
            display.close()
            store.close()
    except BinlensError as err:
        if args.json:
            print(json.dumps({"error": err.to_dict()}, indent=1))
        sys.stderr.write(f"binlens: error: {escape_controls(err.message)}\n")
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print_summary(report.to_dict(), sys.stdout)
    return 0


class ProgressDisplay:
    """The run's progress on `stream`: a bar on a terminal, a plain line now and then otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._bar: Any = None
        self._task: Any = None
        self._shown_at = 0.0
        self._phase = ""

    def update(self, p: Any) -> None:
        """Show the progress `p` (`binlens.corpus.index.Progress`)."""
        if self.tty:
            self._update_bar(p)
            return
        now = time.monotonic()
        if p.phase != self._phase or now - self._shown_at >= _PLAIN_EVERY_S:
            self._phase, self._shown_at = p.phase, now
            self.stream.write(_line(p) + "\n")
            self.stream.flush()

    def _update_bar(self, p: Any) -> None:
        if p.phase != "indexing":
            if p.phase != self._phase:
                self._phase = p.phase
                self.close()  # (the bar goes before the line under it)
                self.stream.write(_line(p) + "\n")
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("indexing"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=p.total)
        self._bar.update(self._task, completed=p.done, description=_rates(p))

    def close(self) -> None:
        """Take the bar off the terminal."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _rates(p: Any) -> str:
    elapsed = max(time.monotonic() - p.started, 1e-9)
    return f"{p.failed} failed · {p.done / elapsed:.1f} files/s · {p.functions / elapsed:,.0f} functions/s"


def _line(p: Any) -> str:
    if p.phase == "discovering":
        return f"discovering: {p.examined} files examined"
    if p.phase == "starting":
        return f"starting Ray for {p.total} files to index"
    if p.phase == "done":
        return f"done: {p.indexed} indexed, {p.failed} failed"
    pct = 100 * p.done / p.total if p.total else 100.0
    return f"indexing: {p.done}/{p.total} files ({pct:.0f}%), {_rates(p)}"


def print_summary(r: dict[str, Any], out: TextIO) -> None:
    """The report for people: counts, rates, then each failed file with its reason."""
    out.write(
        f"corpus {escape_controls(r['corpus'])}: {r['indexed']} indexed, {r['skipped']} skipped (already indexed), "
        f"{len(r['failed'])} failed; {r['found']} distinct executables found, {r['duplicates']} duplicate copies, "
        f"{r['other_files']} other files\n"
    )
    if r["seconds"]:
        out.write(
            f"{r['seconds']:.1f} s on {r['workers']} workers: {r['files_per_s']:.2f} files/s, "
            f"{r['functions_per_s']:,.0f} functions/s ({r['functions']:,} functions)\n"
        )
    if r["failed"]:
        out.write("failed:\n")
        for f in r["failed"]:
            out.write(f"  {escape_controls(f['path'])}: {f['code']}: {escape_controls(f['message'])}\n")
