"""Human commands (`info`, `symbols`, `methods`) and the one-shot `query`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from binlens.cli.main import command, make_workspace
from binlens.cli.render import add_full_option

if TYPE_CHECKING:
    from binlens.errors import BinlensError


def _fail(err: BinlensError) -> int:
    from binlens.printable import escape_controls

    sys.stderr.write(f"binlens: error: {escape_controls(err.message)}\n")
    return 1


def _query_args(p: argparse.ArgumentParser) -> None:
    """Run one JSON request: {"method": ..., "params": {...}} (use '-' to read it from stdin)."""
    p.add_argument("-b", "--binary", action="append", default=[], metavar="FILE", help="open this file first")
    p.add_argument("request", help="JSON request, or '-' for stdin")


@command("query", _query_args)
def cmd_query(args: argparse.Namespace) -> int:
    from binlens.cli.query import run_query

    text = sys.stdin.read() if args.request == "-" else args.request
    return run_query(make_workspace(args), text, args.binary)


def _info_args(p: argparse.ArgumentParser) -> None:
    """Identity, sections and counts of a binary."""
    p.add_argument("file")
    p.add_argument("--slice", default=None, help="slice of a universal Mach-O")
    p.add_argument("--json", action="store_true", help="print program.get's JSON")
    add_full_option(p)


@command("info", _info_args)
def cmd_info(args: argparse.Namespace) -> int:
    from binlens.api import invoke
    from binlens.cli.render import print_info
    from binlens.errors import BinlensError

    ws = make_workspace(args)
    try:
        prog = ws.open(args.file, args.slice, check_roots=False)
        data = invoke(ws, "program.get", {"program": prog.handle})
    except BinlensError as err:
        return _fail(err)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_info(data, args.full)
    return 0


def _symbols_args(p: argparse.ArgumentParser) -> None:
    """List symbols, imports and exports."""
    p.add_argument("file")
    p.add_argument("--kind", choices=["function", "object", "import", "export", "other"])
    p.add_argument("--name", help="glob on the name")
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    add_full_option(p)


@command("symbols", _symbols_args)
def cmd_symbols(args: argparse.Namespace) -> int:
    from binlens.api import invoke
    from binlens.cli.render import print_table
    from binlens.errors import BinlensError

    ws = make_workspace(args)
    params: dict[str, Any] = {"page": {"limit": max(1, min(args.limit, 1000))}}
    if args.kind:
        params["kind"] = args.kind
    if args.name:
        params["name"] = args.name
    try:
        ws.open(args.file, check_roots=False)
        data = invoke(ws, "symbol.list", params)
    except BinlensError as err:
        return _fail(err)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print_table(
        ["address", "kind", "size", "name", "library"],
        [[s["address"], s["kind"], str(s["size"]), s["name"], s["library"] or ""] for s in data["items"]],
        full=args.full,
    )
    if data["next_cursor"]:
        print(f"... more (showing {len(data['items'])}; use --limit or query with a cursor)", file=sys.stderr)
    return 0


def _methods_args(p: argparse.ArgumentParser) -> None:
    """List the API's methods with their effects."""
    p.add_argument("--json", action="store_true", help="the full catalog with schemas")
    add_full_option(p)


@command("methods", _methods_args)
def cmd_methods(args: argparse.Namespace) -> int:
    from binlens.api import invoke
    from binlens.cli.render import print_table

    ws = make_workspace(args)
    data = invoke(ws, "interface.get", {"schemas": bool(args.json)})
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = [[m["name"], m["effect"], m["summary"]] for m in data["methods"]]
    print_table(["method", "effect", "summary"], rows, full=args.full)
    return 0
