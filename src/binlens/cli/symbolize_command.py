"""`binlens symbolize FILE --base 0x... [ADDR...]`: a stack's runtime addresses as functions, offline."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from typing import Any

from binlens.cli.main import command

# a line's address: the one in brackets (glibc's backtrace_symbols: `./prog(main+0x1d)[0x55d0...]`),
# else its first 0x number (gdb's `#1  0x000055... in main ()`, one address a line)
_BRACKETED = re.compile(r"\[\s*(0[xX][0-9a-fA-F]{1,16})\s*\]")
_FIRST = re.compile(r"\b(0[xX][0-9a-fA-F]{1,16})\b")
_CHUNK = 1024  # addresses a call (address.symbolize's bound)


def stack_addresses(lines: Iterable[str]) -> list[str]:
    """The runtime address of each line of a stack dump that has one, in order."""
    out = []
    for line in lines:
        m = _BRACKETED.search(line) or _FIRST.search(line)
        if m is not None:
            out.append(m.group(1))
    return out


def _args(p: argparse.ArgumentParser) -> None:
    """Name the functions of a stack's runtime addresses (arguments, or one a line on stdin)."""
    p.add_argument("file")
    p.add_argument("addresses", nargs="*", metavar="ADDR", help="runtime addresses (0x...); none: read stdin")
    p.add_argument("--base", help="the image's runtime load address (its first mapping; dladdr's dli_fbase)")
    p.add_argument(
        "--return-addresses",
        action="store_true",
        help="all but the first are return addresses (a backtrace): look each up one byte before",
    )
    p.add_argument("--slice", default=None, help="slice of a universal Mach-O")
    p.add_argument("--json", action="store_true", help="the items as JSON")
    p.set_defaults(trailing="addresses")  # (addresses after the options too: `main.py`)


@command("symbolize", _args)
def cmd_symbolize(args: argparse.Namespace) -> int:
    """Symbolize the addresses through address.symbolize, 1,024 a call."""
    from binlens.cli.analysis_commands import _fail, _open_and_analyse
    from binlens.errors import BinlensError

    if not args.addresses and sys.stdin.isatty():
        sys.stderr.write("binlens: reading a stack from stdin, an address a line (end with Ctrl-D)\n")
    addresses = args.addresses or stack_addresses(sys.stdin)
    if not addresses:
        return _fail("no addresses: give them as arguments or one a line on stdin", 2)
    try:
        ws, prog = _open_and_analyse(args, "address.symbolize")
        items = _symbolize(ws, prog.handle, addresses, args)
    except BinlensError as err:
        return _fail(f"{err.target + ': ' if err.target else ''}{err.message}")
    if args.json:
        sys.stdout.write(json.dumps({"program": prog.identity, "items": items}, indent=1) + "\n")
        return 0
    from binlens.cli.render import print_table

    print_table(["#", "runtime", "static", "where"], [_row(i, x) for i, x in enumerate(items)], full=False)
    return 0


def _symbolize(ws: Any, handle: str, addresses: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    from binlens.api import invoke

    items: list[dict[str, Any]] = []
    for at in range(0, len(addresses), _CHUNK):
        params: dict[str, Any] = {"program": handle, "addresses": addresses[at : at + _CHUNK]}
        if args.base:
            params["base"] = args.base
        # (a chunk after the first starts with a return address too)
        params["return_addresses"] = bool(args.return_addresses)
        if args.return_addresses and at:
            params["addresses"] = [addresses[at - 1], *params["addresses"]]
            items += invoke(ws, "address.symbolize", params, max_response_bytes=1 << 30)["items"][1:]
        else:
            items += invoke(ws, "address.symbolize", params, max_response_bytes=1 << 30)["items"]
    return items


def _row(i: int, x: dict[str, Any]) -> list[str]:
    f = x.get("function")
    if f is not None:
        where = f"{f['name']}+{x['offset']:#x}" + (" (heuristic)" if x.get("warnings") else "")
    else:
        where = x["note"] + (f" ({x['section']})" if x.get("section") else "")
    return [str(i), x["runtime"], x.get("address") or "", where]
