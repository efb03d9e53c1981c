"""The `binlens` command: argument parsing and dispatch to subcommands."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from binlens import __version__

# Subcommands register here: name -> (configure parser, run). Other layers add theirs.
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, configure: Callable[[argparse.ArgumentParser], None]):
    """Register a subcommand."""

    def wrap(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = (configure, run)
        return run

    return wrap


def add_common(p: argparse.ArgumentParser) -> None:
    """Options every subcommand takes."""
    p.add_argument(
        "--home", type=Path, default=None, help="program database folder (default: $BINLENS_HOME or the XDG data dir)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")


def make_workspace(args: argparse.Namespace, **kw):  # noqa: ANN201 - avoids importing the api at start
    from binlens.store import default_home
    from binlens.workspace import Config, Workspace

    cfg = Config(home=args.home or default_home(), **kw)
    return Workspace(cfg)


def build_parser() -> argparse.ArgumentParser:
    from binlens.cli import commands  # noqa: F401 - registers the human and query commands

    for mod in ("binlens.cli.serve_command", "binlens.cli.mcp_command", "binlens.cli.analysis_commands"):
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


# Commands that need the program's analysis (which runs in its own process, see analysis_worker).
NEEDS_ANALYSIS = {"functions", "disasm", "strings", "xrefs", "cfg"}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `binlens` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    if getattr(args, "file", None) or getattr(args, "binary", None) or getattr(args, "files", None):
        from binlens.loader.isolate import prestart

        prestart()  # the parser worker starts while this process imports the API
        if args.command in NEEDS_ANALYSIS:
            from binlens.analysis_worker import prestart as prestart_analysis
            from binlens.store import default_home

            # The analysis process starts analysing the file now; it saves only if the command needs it.
            prestart_analysis(args.file, getattr(args, "slice", None), str(args.home or default_home()))
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
