"""`binlens corpus SUBCOMMAND`: many binaries at once (docs/CORPUS.md)."""

from __future__ import annotations

import argparse

from binlens.cli.corpus_index import configure_index, run_index
from binlens.cli.main import add_common, command

# subcommand -> (configure, run)
SUBCOMMANDS = {
    "index": (configure_index, run_index),
}


def _args(p: argparse.ArgumentParser) -> None:
    """Index many binaries on Ray and search them (docs/CORPUS.md)."""
    sub = p.add_subparsers(dest="corpus_command", metavar="SUBCOMMAND", required=True)
    for name, (configure, _run) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=(configure.__doc__ or "").strip().split("\n")[0])
        configure(sp)
        add_common(sp)


@command("corpus", _args)
def cmd_corpus(args: argparse.Namespace) -> int:
    _configure, run = SUBCOMMANDS[args.corpus_command]
    return run(args)
