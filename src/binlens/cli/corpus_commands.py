"""`binlens corpus SUBCOMMAND`: the corpus store from the command line (docs/CORPUS.md).

Subcommands register in `CORPUS_COMMANDS` with `corpus_command`: the readers here (list, get,
search-function, search-string, search-import, remove) call the corpus.* methods; `index` (Ray)
registers from `binlens.cli.corpus_index` when that module exists. Each subcommand takes
`--home` and `--corpus-store` after its name too.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from binlens.cli.main import command, make_workspace
from binlens.cli.render import add_full_option
from binlens.cli.server_args import add_corpus_store_option

Run = Callable[[argparse.Namespace], int]
CORPUS_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Run]] = {}
# modules that add subcommands of their own (imported when the parser is built, skipped when absent)
EXTENSIONS = ("binlens.cli.corpus_index",)  # `binlens corpus index DIR... --corpus NAME` (Ray)


def corpus_command(name: str, configure: Callable[[argparse.ArgumentParser], None]) -> Callable[[Run], Run]:
    """Register `binlens corpus NAME`: `configure` adds its arguments, the function runs it."""

    def wrap(run: Run) -> Run:
        CORPUS_COMMANDS[name] = (configure, run)
        return run

    return wrap


def _configure(p: argparse.ArgumentParser) -> None:
    """Index folders of binaries and search them (list, get, search-function, search-string, ...)."""
    from pathlib import Path

    for mod in EXTENSIONS:
        try:
            __import__(mod)
        except ModuleNotFoundError as err:
            if err.name != mod:
                raise
    add_corpus_store_option(p)
    sub = p.add_subparsers(dest="corpus_command", metavar="SUBCOMMAND", required=True)
    for name, (configure, _run) in CORPUS_COMMANDS.items():
        sp = sub.add_parser(name, help=(configure.__doc__ or "").strip().split("\n")[0])
        configure(sp)
        # (after the subcommand too; SUPPRESS keeps a value given before it)
        sp.add_argument("--home", type=Path, default=argparse.SUPPRESS, help="program database folder")
        sp.add_argument("--corpus-store", metavar="URL", default=argparse.SUPPRESS, help="as before the subcommand")


@command("corpus", _configure)
def cmd_corpus(args: argparse.Namespace) -> int:
    """Run the corpus subcommand."""
    from binlens.cli.server_args import corpus_store_url

    if args.corpus_store is not None:
        try:
            corpus_store_url(args.corpus_store)
        except argparse.ArgumentTypeError as err:
            return _fail(f"--corpus-store {err}", 2)
    _configure_, run = CORPUS_COMMANDS[args.corpus_command]
    return run(args)


def _fail(message: str, code: int = 1) -> int:
    from binlens.cli.analysis_commands import _fail as fail

    return fail(message, code)


def call(args: argparse.Namespace, name: str, params: dict[str, Any], ws: Any = None) -> dict[str, Any] | None:
    """Invoke corpus method `name` on a workspace with the command's home and store (None, with
    the message on stderr, when it fails)."""
    from binlens.api import invoke
    from binlens.errors import BinlensError

    ws = ws or make_workspace(args, corpus_store=args.corpus_store)
    try:
        out = invoke(ws, name, params, max_response_bytes=1 << 30)
    except BinlensError as err:
        _fail(err.message)
        return None
    assert isinstance(out, dict)
    return out


def _json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="the method's result as JSON")
    add_full_option(p)


def _print(args: argparse.Namespace, data: dict[str, Any], headers: list[str], rows: list[list[str]]) -> int:
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    from binlens.cli.render import print_table

    print_table(headers, rows, full=args.full)
    return 0


# ---------------------------------------------------------------------------- list / get / remove
def _list_args(p: argparse.ArgumentParser) -> None:
    """The corpora of the store, with their counts."""
    _json_option(p)


@corpus_command("list", _list_args)
def cmd_list(args: argparse.Namespace) -> int:
    """`binlens corpus list`."""
    data = call(args, "corpus.list", {})
    if data is None:
        return 1
    rows = [
        [c["name"], str(c["binaries"]), str(c["functions"]), str(c["failures"]), c["updated_at"]] for c in data["items"]
    ]
    return _print(args, data, ["corpus", "binaries", "functions", "failures", "updated"], rows)


def _get_args(p: argparse.ArgumentParser) -> None:
    """One corpus: counts, build state, the files it could not index."""
    p.add_argument("name", help="the corpus")
    _json_option(p)


@corpus_command("get", _get_args)
def cmd_get(args: argparse.Namespace) -> int:
    """`binlens corpus get NAME`."""
    data = call(args, "corpus.get", {"corpus": args.name})
    if data is None:
        return 1
    keys = ("name", "state", "binaries", "functions", "strings", "imports", "failures", "created_at", "updated_at")
    rows = [[k, str(data[k])] for k in keys] + [["store", f"{data['store']['kind']} {data['store']['location']}"]]
    rows += [[f"failed: {f['code']}", f"{f['path']}: {f['message']}"] for f in data["failed_files"]]
    return _print(args, data, ["field", "value"], rows)


def _remove_args(p: argparse.ArgumentParser) -> None:
    """Delete a corpus and everything indexed in it."""
    p.add_argument("name", help="the corpus")
    p.add_argument("--json", action="store_true", help="the method's result as JSON")


@corpus_command("remove", _remove_args)
def cmd_remove(args: argparse.Namespace) -> int:
    """`binlens corpus remove NAME`."""
    data = call(args, "corpus.remove", {"corpus": args.name})
    if data is None:
        return 1
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        r = data["removed"]
        print(f"removed corpus {r['name']}: {r['binaries']} binaries, {r['functions']} functions")
    return 0


# ----------------------------------------------------------------------------------- searches
def _search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", required=True, help="the corpus searched")
    p.add_argument("--limit", type=int, default=20, help="most results (1..1000)")
    _json_option(p)


def _search_function_args(p: argparse.ArgumentParser) -> None:
    """The corpus's functions most like FUNCTION of FILE."""
    p.add_argument("file", help="the program holding the function")
    p.add_argument("function", help="its name or an address inside it (0x...)")
    p.add_argument("--slice", default=None, help="architecture slice of a universal Mach-O")
    p.add_argument("--min-similarity", type=float, default=0.0, help="only functions at least this similar (0..1)")
    _search_args(p)


@corpus_command("search-function", _search_function_args)
def cmd_search_function(args: argparse.Namespace) -> int:
    """`binlens corpus search-function FILE FUNCTION --corpus NAME`."""
    from binlens.cli.analysis_commands import _open_and_analyse
    from binlens.errors import BinlensError

    try:
        ws, prog = _open_and_analyse(args, "corpus.search_function")
    except BinlensError as err:
        return _fail(err.message)
    ws.config.corpus_store = args.corpus_store
    key = "address" if args.function.lower().startswith("0x") else "name"
    params = {
        "program": prog.handle,
        "corpus": args.corpus,
        "selector": {key: args.function},
        "limit": args.limit,
        "min_similarity": args.min_similarity,
    }
    data = call(args, "corpus.search_function", params, ws)
    if data is None:
        return 1
    rows = [[f"{m['similarity']:.3f}", m["function"], m["address"], m["file"], m["sha256"][:16]] for m in data["items"]]
    return _print(args, data, ["similarity", "function", "address", "file", "sha256"], rows)


def _search_string_args(p: argparse.ArgumentParser) -> None:
    """The corpus's binaries holding a string containing TEXT (--exact: equal to it)."""
    p.add_argument("text", help="the text searched for")
    p.add_argument("--exact", action="store_true", help="whole strings equal to TEXT only")
    _search_args(p)


@corpus_command("search-string", _search_string_args)
def cmd_search_string(args: argparse.Namespace) -> int:
    """`binlens corpus search-string TEXT --corpus NAME`."""
    mode = "exact" if args.exact else "substring"
    data = call(
        args, "corpus.search_string", {"corpus": args.corpus, "text": args.text, "mode": mode, "limit": args.limit}
    )
    return 1 if data is None else _print_binaries(args, data)


def _search_import_args(p: argparse.ArgumentParser) -> None:
    """The corpus's binaries importing SYMBOL (--substring: a name containing it)."""
    p.add_argument("symbol", help="the imported name")
    p.add_argument("--substring", action="store_true", help="names containing SYMBOL")
    _search_args(p)


@corpus_command("search-import", _search_import_args)
def cmd_search_import(args: argparse.Namespace) -> int:
    """`binlens corpus search-import SYMBOL --corpus NAME`."""
    mode = "substring" if args.substring else "exact"
    data = call(
        args, "corpus.search_import", {"corpus": args.corpus, "name": args.symbol, "mode": mode, "limit": args.limit}
    )
    return 1 if data is None else _print_binaries(args, data)


def _print_binaries(args: argparse.Namespace, data: dict[str, Any]) -> int:
    rows = [[m["file"], m["sha256"][:16], ", ".join(m["matches"])] for m in data["items"]]
    return _print(args, data, ["file", "sha256", "matches"], rows)
