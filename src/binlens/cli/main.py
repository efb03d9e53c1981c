"""The `binlens` command: argument parsing and dispatch to subcommands."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable

from binlens import __version__

TYPE_CHECKING = False  # (`typing` itself costs ~15 ms of start-up before the analysis process starts)
if TYPE_CHECKING:  # (imported where used: a command that analyses starts its analysis process first)
    import argparse
    import subprocess
    from typing import Any

    from binlens.workspace import Workspace

    Run = Callable[[argparse.Namespace], int]

# Subcommands register here: name -> (configure parser, run). Other layers add theirs.
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Run]] = {}


def command(name: str, configure: Callable[[argparse.ArgumentParser], None]) -> Callable[[Run], Run]:
    """Register a subcommand."""

    def wrap(run: Run) -> Run:
        COMMANDS[name] = (configure, run)
        return run

    return wrap


def add_common(p: argparse.ArgumentParser) -> None:
    """Options every subcommand takes."""
    from pathlib import Path

    p.add_argument(
        "--home", type=Path, default=None, help="program database folder (default: $BINLENS_HOME or the XDG data dir)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    p.add_argument(
        "--max-file-bytes",
        metavar="N",
        type=byte_count,
        default=None,
        help="refuse input files larger than N bytes before reading them (K, M, G suffixes: powers of 1024; "
        "default 512M)",
    )


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_count(value: str) -> int:
    """argparse type of a size in bytes: a whole number, optionally with K, M, G or T (powers of 1024,
    also written KiB, MiB, ...), at least 1."""
    import argparse

    text = value.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    digits = text[: len(text) - len(unit)].strip()
    if not digits.isdigit() or not digits.isascii():
        raise argparse.ArgumentTypeError(f"{value!r} is not a size like 1048576, 512M or 2G")
    n = int(digits) * _UNITS[unit]
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1 byte")
    return n


_workspaces: list[Workspace] = []  # the workspaces this command made: `console` closes their programs at the end


def make_workspace(args: argparse.Namespace, **kw: Any) -> Workspace:
    """The workspace of a command: `--home` (or the default) and `kw` as its Config; closed at exit."""
    from binlens.store import default_home
    from binlens.workspace import Config, Workspace

    cfg = Config(home=args.home or default_home(), **kw)
    if getattr(args, "max_file_bytes", None) is not None:
        cfg.limits.max_file_bytes = args.max_file_bytes
    ws = Workspace(cfg)
    _workspaces.append(ws)
    return ws


def build_parser() -> argparse.ArgumentParser:
    import argparse

    from binlens.cli import commands  # noqa: F401 - registers the human and query commands

    for mod in (
        "binlens.cli.serve_command",
        "binlens.cli.mcp_command",
        "binlens.cli.analysis_commands",
        "binlens.cli.debug_command",
        "binlens.cli.compare_commands",
        "binlens.cli.corpus_commands",
        "binlens.cli.doctor",
    ):
        try:
            __import__(mod)
        except ModuleNotFoundError as err:
            if err.name != mod:
                raise
    parser = argparse.ArgumentParser(prog="binlens", description="Headless binary analysis for agents and people.")
    parser.add_argument("--version", action="version", version=f"binlens {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (configure, _run) in COMMANDS.items():
        sp = sub.add_parser(name, help=(configure.__doc__ or "").strip().split("\n")[0])
        configure(sp)
        add_common(sp)
    return parser


_YIELD = 5  # the niceness a command that analyses adds to itself once its analysis process runs

# Commands that need the program's analysis (which runs in its own process, see binlens.jobs).
NEEDS_ANALYSIS = {"functions", "disasm", "strings", "xrefs", "cfg", "decompile"}


def _early_target(argv: list[str]) -> tuple[str, str | None, str | None] | None:
    """(file, slice, home) of `binlens <analysis command> FILE ...`, read before the parser exists.

    Building the full parser imports every command module (~45 ms); the analysis process can start
    on the file before that. A wrong guess costs only time: the process is taken over only for the
    file and slice the parser reads, and killed otherwise.
    """
    command = file = slice_name = home = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        key, eq, value = arg.partition("=")
        if key in ("--home", "--slice"):
            if not eq:
                value, i = (argv[i] if i < len(argv) else ""), i + 1
            home, slice_name = (value, slice_name) if key == "--home" else (home, value)
        elif arg.startswith("-") and arg != "-":
            continue  # a flag, or an option whose value is skipped below as not a file
        elif command is None:
            command = arg
        elif file is None and os.path.isfile(arg):
            file = arg
    if command not in NEEDS_ANALYSIS or file is None:
        return None
    return file, slice_name, home


def _prestart(
    file: str, slice_name: str | None, home: str | None, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Start (or take `process`) an analysis process that analyses `file` at once; it saves only if
    the command needs it."""
    from pathlib import Path

    from binlens.jobs.client import prestart
    from binlens.store import default_home

    prestart(file, slice_name, str(Path(home) if home else default_home()), process)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `binlens` command (see `console`)."""
    early = _early_target(sys.argv[1:] if argv is None else argv)
    if early is not None:  # the analysis process starts before this process imports anything more
        from binlens.jobs.spawn import spawn_analysis_process

        _prestart(*early, spawn_analysis_process())
        # This process's own start-up (the API's imports, the parser worker, opening the program)
        # yields to the analysis, which is what the command waits for on a busy machine.
        try:  # noqa: SIM105 - contextlib costs ~10 ms of imports here
            os.nice(_YIELD)
        except OSError:
            pass
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    if getattr(args, "file", None) or getattr(args, "binary", None) or getattr(args, "files", None):
        from binlens.loader.isolate import prestart

        prestart()  # the parser worker starts while this process imports the API
        if args.command in NEEDS_ANALYSIS and early is None:
            _prestart(args.file, getattr(args, "slice", None), str(args.home) if args.home else None)
    import logging

    logging.basicConfig(
        level=logging.INFO if args.verbose or os.environ.get("BINLENS_LOG") else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    _configure, run = COMMANDS[args.command]
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


def console() -> None:
    """The `binlens` console script: `main`, then an exit without the interpreter's teardown.

    The programs' databases are closed, the output flushed and the exit handlers run (an unused
    analysis process is killed); only the freeing of every object one by one is skipped, which
    takes ~50 ms after listing libc's functions. A reader that closed the pipe early ends the
    command quietly with status 1, as Python's own guidance for SIGPIPE suggests.
    """
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`binlens functions FILE | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the buffered rest goes nowhere
        code = 1
    worker = sys.modules.get("binlens.jobs.client")
    if worker is not None:  # its analysis processes end (and are reaped) before the command does
        worker.wait_for_processes()
    for ws in _workspaces:
        for handle in list(ws.programs):
            ws.close(handle)
    sys.stderr.flush()
    atexit._run_exitfuncs()  # noqa: SLF001 - the handlers a normal exit would run, before os._exit
    os._exit(code if isinstance(code, int) else 0)
