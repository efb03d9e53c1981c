"""Human commands over the analysis: functions, disasm, strings, xrefs, cfg, decompile."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from binlens.cli.main import command, make_workspace
from binlens.cli.render import add_full_option
from binlens.printable import escape_controls

if TYPE_CHECKING:
    from binlens.workspace import Program, Workspace


def _fail(message: str, code: int = 1) -> int:
    sys.stderr.write(f"binlens: error: {escape_controls(message)}\n")
    return code


def _open_and_analyse(args: argparse.Namespace, then: str) -> tuple[Workspace, Program]:
    """Open the file and run (or load) its analysis, with a progress bar on stderr; `then` is the
    method the command calls next (imported while the analysis runs, not after)."""
    from binlens.api import CallContext, invoke
    from binlens.api.registry import lookup

    ws = make_workspace(args)
    prog = ws.open(args.file, getattr(args, "slice", None), check_roots=False)
    lookup(then)
    status = invoke(ws, "analysis.get", {"program": prog.handle})
    if status["status"] == "done":
        return ws, prog
    t0 = time.monotonic()
    tty = sys.stderr.isatty()
    if tty:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("analysing"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=Console(stderr=True),
            transient=True,
        )
        with bar:
            task = bar.add_task("", total=100)

            def report(done: float, total: float | None, message: str | None) -> None:
                bar.update(task, completed=done if total else 0, description=message or "")

            invoke(ws, "analysis.start", {"program": prog.handle, "wait": True}, CallContext(progress=report))
    else:
        last = [-1]

        def report(done: float, total: float | None, message: str | None) -> None:
            step = int(done // 25) if total else 0
            if step != last[0]:
                last[0] = step
                sys.stderr.write(f"analysing: {done:.0f}% {message or ''}\n")

        invoke(ws, "analysis.start", {"program": prog.handle, "wait": True}, CallContext(progress=report))
    status = invoke(ws, "analysis.get", {"program": prog.handle})
    counts = status.get("counts") or {}
    sys.stderr.write(
        f"analysed {args.file}: {counts.get('functions', 0)} functions, {counts.get('xrefs', 0)} references, "
        f"{counts.get('strings', 0)} strings in {time.monotonic() - t0:.2f} s\n"
    )
    for warning in status.get("warnings") or ():
        sys.stderr.write(f"binlens: warning: {escape_controls(warning)}\n")
    return ws, prog


def _pages(
    ws: Workspace, method: str, params: dict[str, Any], limit: int | None = None
) -> Iterator[list[dict[str, Any]]]:
    """The items of a listing method, a page (of at most 1,000) at a time; `limit`: at most that many."""
    from binlens.api import invoke

    cursor = None
    left = limit
    while left is None or left > 0:
        page: dict[str, Any] = {"limit": 1000 if left is None else min(1000, left)}
        if cursor:
            page["cursor"] = cursor
        data = invoke(ws, method, {**params, "page": page}, max_response_bytes=1 << 30)
        items = data["items"]
        if left is not None:
            left -= len(items)
        yield items
        cursor = data.get("next_cursor")
        if not cursor:
            return


def _print_listing(identity: dict[str, Any], key: str, pages: Iterable[list[dict[str, Any]]]) -> None:
    """`{"program": ..., key: [...]}` with one item per line, written a page at a time, not held
    whole with their text, so the command's memory does not grow with the listing.

    json's C encoder runs only without `indent`; an indented dump of libc's 3695 functions takes
    ~5x longer than this, for output no easier to read or to `grep`. One write a page: with
    PYTHONUNBUFFERED set, a write per item is a system call per item.
    """
    dumps = json.JSONEncoder(ensure_ascii=True, separators=(", ", ": ")).encode
    head = f'{{"program": {dumps(identity)}, "{key}": ['
    wrote = False
    for items in pages:
        if items:
            sys.stdout.write((",\n " if wrote else head + "\n ") + ",\n ".join(map(dumps, items)))
            wrote = True
    sys.stdout.write("\n]}\n" if wrote else head + "]}\n")


def _show_listing(
    args: argparse.Namespace,
    identity: dict[str, Any],
    key: str,
    pages: Iterable[list[dict[str, Any]]],
    header: list[str],
    row: Callable[[dict[str, Any]], list[str]],
) -> int:
    """A listing command's output: the items as JSON with `--json`, else a table of `header`
    columns with `row(item)` a line."""
    if args.json:
        _print_listing(identity, key, pages)
        return 0
    items = [item for page in pages for item in page]
    from binlens.cli.render import print_table

    print_table(header, [row(item) for item in items], full=args.full)
    return 0


def _given(args: argparse.Namespace, keys: tuple[str, ...]) -> dict[str, Any]:
    """The options among `keys` given on the command line, as method parameters."""
    return {key: getattr(args, key) for key in keys if getattr(args, key) is not None}


def _common_file(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument("--slice", default=None, help="slice of a universal Mach-O")


def _run(fn: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    from binlens.errors import BinlensError

    try:
        return fn(args)
    except BinlensError as err:
        return _fail(err.message)


# ----------------------------------------------------------------------------- functions
def _functions_args(p: argparse.ArgumentParser) -> None:
    """List the functions the engine finds (entry, size, name, how found)."""
    _common_file(p)
    p.add_argument("--name", help="glob on the name")
    p.add_argument("--source", help="only functions found this way (symbol, eh_frame, call, ...)")
    p.add_argument("--min-size", type=int)
    p.add_argument("--max-size", type=int)
    p.add_argument("--limit", type=int, default=None, help="at most this many")
    p.add_argument("--json", action="store_true", help="all matching functions as JSON")
    add_full_option(p)


@command("functions", _functions_args)
def cmd_functions(args: argparse.Namespace) -> int:
    return _run(_functions, args)


def _functions(args: argparse.Namespace) -> int:
    ws, prog = _open_and_analyse(args, "function.list")
    params = {"program": prog.handle, **_given(args, ("name", "source", "min_size", "max_size"))}
    return _show_listing(
        args,
        prog.identity,
        "functions",
        _pages(ws, "function.list", params, args.limit),
        ["address", "size", "name", "sources"],
        lambda f: [f["address"], str(f["size"]), f["name"], ",".join(f["sources"])],
    )


# -------------------------------------------------------------------------------- disasm
def _disasm_args(p: argparse.ArgumentParser) -> None:
    """Disassemble a function (by name or address) with labels, names and string comments."""
    _common_file(p)
    p.add_argument("target", help="function name or address (0x...)")
    p.add_argument("--max", type=int, default=20000, help="at most this many instructions")
    p.add_argument("--json", action="store_true")
    add_full_option(p)


@command("disasm", _disasm_args)
def cmd_disasm(args: argparse.Namespace) -> int:
    return _run(_disasm, args)


def _selector(text: str) -> dict[str, str]:
    return {"address": text} if text.lower().startswith("0x") else {"name": text}


def _disasm(args: argparse.Namespace) -> int:
    from binlens.api import invoke

    ws, prog = _open_and_analyse(args, "listing.get")
    params = {
        "program": prog.handle,
        "selector": _selector(args.target),
        "max_instructions": max(1, min(args.max, 20000)),
        "format": "both" if args.json else "lines",
        "max_bytes": 1 << 24,
    }
    data = invoke(ws, "listing.get", params, max_response_bytes=1 << 30)
    lines, text = data["lines"], data.get("text") or ""
    while data["next_offset"] is not None:  # a listing of more than 16 MiB of text
        data = invoke(ws, "listing.get", {**params, "offset": data["next_offset"]}, max_response_bytes=1 << 30)
        lines += data["lines"]
        text += data.get("text") or ""
    if args.json:
        whole = {**data, "text": text, "lines": lines, "offset": 0, "next_offset": None, "fragment": False}
        print(json.dumps(whole, indent=1))
    else:
        from binlens.cli.render import listing_text

        sys.stdout.write(listing_text(lines, args.full))
        if data["truncated"]:
            sys.stderr.write("... truncated; raise --max\n")
    return 0


# ------------------------------------------------------------------------------- strings
def _strings_args(p: argparse.ArgumentParser) -> None:
    """List strings (ASCII/UTF-8, UTF-16LE) with their section and reference counts."""
    _common_file(p)
    p.add_argument("--min-length", type=int, default=4)
    p.add_argument("--text", help="only strings containing this")
    p.add_argument("--regex", help="only strings matching this regex")
    p.add_argument("--encoding", choices=["ascii", "utf-8", "utf-16le"])
    p.add_argument("--section")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--json", action="store_true")
    add_full_option(p)


@command("strings", _strings_args)
def cmd_strings(args: argparse.Namespace) -> int:
    return _run(_strings, args)


def _strings(args: argparse.Namespace) -> int:
    ws, prog = _open_and_analyse(args, "string.list")
    params = {
        "program": prog.handle,
        "min_length": max(1, args.min_length),
        **_given(args, ("text", "regex", "encoding", "section")),
    }
    return _show_listing(
        args,
        prog.identity,
        "strings",
        _pages(ws, "string.list", params, args.limit),
        ["address", "refs", "encoding", "section", "text"],
        lambda s: [s["address"], str(s["references"]), s["encoding"], s["section"] or "", repr(s["text"])[1:-1]],
    )


# -------------------------------------------------------------------------------- xrefs
def _xrefs_args(p: argparse.ArgumentParser) -> None:
    """Cross-references to (or, with --from, from) an address or name."""
    _common_file(p)
    p.add_argument("address", help="address (0x...) or name")
    p.add_argument("--from", dest="from_", action="store_true", help="references made from the address")
    p.add_argument("--function", action="store_true", help="with --from: everything the function references")
    p.add_argument("--kind", action="append", help="only this kind (repeatable)")
    p.add_argument("--json", action="store_true")
    add_full_option(p)


@command("xrefs", _xrefs_args)
def cmd_xrefs(args: argparse.Namespace) -> int:
    return _run(_xrefs, args)


def _xrefs(args: argparse.Namespace) -> int:
    ws, prog = _open_and_analyse(args, "reference.list")
    params: dict[str, Any] = {
        "program": prog.handle,
        "address": args.address,
        "direction": "from" if args.from_ else "to",
        "scope": "function" if args.function else "address",
    }
    if args.kind:
        params["kind"] = args.kind
    return _show_listing(
        args,
        prog.identity,
        "references",
        _pages(ws, "reference.list", params),
        ["from", "function", "kind", "to", "to name"],
        lambda x: [x["from_address"], x["function_name"] or "", x["kind"], x["to_address"], x["to_name"] or ""],
    )


# ---------------------------------------------------------------------------------- cfg
def _cfg_args(p: argparse.ArgumentParser) -> None:
    """Control-flow graph of a function as DOT, Mermaid, or SVG/PNG through graphviz."""
    _common_file(p)
    p.add_argument("target", help="function name or address (0x...)")
    p.add_argument("--format", choices=["dot", "mermaid", "svg", "png", "json"], default="dot")
    p.add_argument("-o", "--output", help="write here instead of stdout")


@command("cfg", _cfg_args)
def cmd_cfg(args: argparse.Namespace) -> int:
    return _run(_cfg, args)


def _cfg(args: argparse.Namespace) -> int:
    from binlens.api import invoke

    if args.format in ("svg", "png") and shutil.which("dot") is None:
        return _fail(
            f"--format {args.format} needs graphviz's 'dot' program, which is not installed "
            "(apt-get install graphviz); --format dot or mermaid work without it"
        )
    if args.format == "png" and not args.output and sys.stdout.isatty():
        return _fail("refusing to write PNG bytes to a terminal; use -o FILE", 2)
    ws, prog = _open_and_analyse(args, "function.cfg")
    fmt = "dot" if args.format in ("svg", "png") else args.format
    data = invoke(
        ws,
        "function.cfg",
        {"program": prog.handle, "selector": _selector(args.target), "format": fmt},
        max_response_bytes=1 << 30,
    )
    if args.format == "json":
        out: bytes = json.dumps(data, indent=1).encode() + b"\n"
    elif args.format in ("dot", "mermaid"):
        out = escape_controls(data["text"], keep="\n").encode()
    else:
        proc = subprocess.run(
            ["dot", f"-T{args.format}"], input=data["text"].encode(), capture_output=True, timeout=120
        )
        if proc.returncode != 0:
            return _fail(f"graphviz failed: {proc.stderr.decode(errors='replace').strip()}")
        out = proc.stdout
    if args.output:
        with open(args.output, "wb") as fh:
            fh.write(out)
    else:
        sys.stdout.buffer.write(out)
    return 0


# ----------------------------------------------------------------------------- decompile
def _decompile_args(p: argparse.ArgumentParser) -> None:
    """Decompile a function (by name or address) to C-like code through a decompiler provider (angr)."""
    _common_file(p)
    p.add_argument("target", help="function name or address (0x...)")
    p.add_argument("--provider", default="auto", help="decompiler provider id (default: auto)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds the decompiler may take")
    p.add_argument("--json", action="store_true")


@command("decompile", _decompile_args)
def cmd_decompile(args: argparse.Namespace) -> int:
    return _run(_decompile, args)


def _decompile(args: argparse.Namespace) -> int:
    from binlens.api import invoke

    ws, prog = _open_and_analyse(args, "decompilation.get")
    params: dict[str, Any] = {
        "program": prog.handle,
        "selector": _selector(args.target),
        "provider": args.provider,
        "timeout_ms": int(max(0.1, min(args.timeout, 600.0)) * 1000),
        "max_bytes": 1 << 20,
    }
    pages = [invoke(ws, "decompilation.get", params, max_response_bytes=1 << 30)]
    while pages[-1]["next_offset"] is not None:
        params["offset"] = pages[-1]["next_offset"]
        pages.append(invoke(ws, "decompilation.get", params, max_response_bytes=1 << 30))
    data = pages[0]
    if args.json:
        data = {**data, "code": "".join(p["code"] for p in pages), "lines": [ln for p in pages for ln in p["lines"]]}
        print(json.dumps(data, indent=1))
        return 0
    # names and strings come from the file: no control character reaches the terminal
    code = "\n".join(escape_controls(line) for line in "".join(p["code"] for p in pages).split("\n"))
    for warning in data["warnings"]:
        sys.stderr.write(f"// {escape_controls(warning)}\n")
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        from rich.console import Console
        from rich.syntax import Syntax

        Console().print(Syntax(code, "c", theme="ansi_dark", background_color="default", word_wrap=False))
    else:
        sys.stdout.write(code if code.endswith("\n") else code + "\n")
    return 0
