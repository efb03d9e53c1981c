"""Tables for the human commands (stdout is for the reader; errors go to stderr).

The tables are drawn here, not with rich: rich's `Table` took 2.5 s and 12 MiB to lay out libc.so.6's
3,695 functions, and fitted every table to the terminal's width (80 columns when piped), cutting
values short with an ellipsis: a database path in `binlens info | cat` lost its end. These rows are
never wrapped to the terminal, so `grep` and `cut -d│` see each value on its row.

Every cell is data from the binary: its control characters are escaped (binlens.printable) and a
cell longer than CELL_MAX characters ends in an ellipsis (every row is padded to the widest cell,
so one 1 MiB symbol name would make each row 1 MiB wide), unless the command's `--full` asks for
whole values (`--json` gives them too).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, TextIO

from binlens.printable import escape_controls

_BOLD, _YELLOW, _RESET = "\x1b[1m", "\x1b[33m", "\x1b[0m"
CELL_MAX = 200  # characters of a cell, escapes included, before the ellipsis


def add_full_option(p: argparse.ArgumentParser) -> None:
    """The `--full` flag of a human command: cells whole, not cut at CELL_MAX characters."""
    p.add_argument(
        "--full", action="store_true", help=f"print long values whole (cut at {CELL_MAX} characters otherwise)"
    )


def cell(value: object, full: bool = False) -> str:
    """`value` as text safe for a terminal: control characters escaped and, unless `full`, at most
    CELL_MAX characters (the last an ellipsis)."""
    text = str(value)
    if full:
        return escape_controls(text)
    shown = escape_controls(text[: CELL_MAX + 1])  # escaping never shortens: the rest is cut anyway
    return shown if len(shown) <= CELL_MAX else shown[: CELL_MAX - 1] + "…"


def _styled(stream: TextIO) -> bool:
    """Bold headers only on a terminal (and never under NO_COLOR)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


RULE_MAX = 40  # columns of the rule under a table's last column


def table_lines(headers: list[str], rows: list[list[str]], title: str | None = None, bold: bool = False) -> list[str]:
    """The table's lines: a title, the header, a rule, then one line per row, columns padded to
    their widest cell and separated by `│` (the header by `┃`). The last column is not padded and
    its rule is at most RULE_MAX wide, so one long cell (a string, a path) does not widen every
    line of a piped table to hundreds of columns."""
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            if len(c) > widths[i]:
                widths[i] = len(c)
    rule = [*widths[:-1], min(widths[-1], max(len(headers[-1]), RULE_MAX))]
    total = sum(rule) + 3 * (len(rule) - 1) + 2
    head = (" " + " ┃ ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))).rstrip()
    out = [title.center(total).rstrip()] if title else []
    out.append(f"{_BOLD}{head}{_RESET}" if bold else head)
    out.append("━" + "━╇━".join("━" * w for w in rule) + "━")
    fmt = " " + " │ ".join(f"{{:<{w}}}" for w in widths)
    out += [fmt.format(*r).rstrip() for r in rows]
    return out


def print_table(headers: list[str], rows: list[list[str]], title: str | None = None, full: bool = False) -> None:
    """A plain table on stdout, written at once, each cell made safe by `cell`."""
    cells = [[cell(c, full) for c in r] for r in rows]
    lines = table_lines(headers, cells, title, bold=_styled(sys.stdout))
    sys.stdout.write("\n".join(lines) + "\n")


def print_info(data: dict[str, Any], full: bool = False) -> None:
    """`binlens info`: identity, sections, counts (`full`: long values whole)."""
    ident = data["identity"]
    ident_rows = [
        [k, "none" if ident[k] is None else str(ident[k])]
        for k in ("file_name", "format", "arch", "bits", "endian", "image_base", "entry", "size", "sha256", "program")
        if k in ident
    ]
    if ident.get("slice"):
        ident_rows.append(["slice", f"{ident['slice']} of {', '.join(data['slices'])}"])
    ident_rows.append(["database", data["database"]])
    print_table(["field", "value"], ident_rows, title="identity", full=full)
    print_table(
        ["name", "start", "end", "size", "perms", "kind"],
        [[s["name"], s["start"], s["end"], str(s["size"]), s["perms"], s["kind"]] for s in data["sections"]],
        title="sections",
        full=full,
    )
    print_table(["what", "count"], [[k, str(v)] for k, v in data["counts"].items()], title="counts", full=full)
    color = _styled(sys.stdout)
    for w in data.get("warnings", []):
        text = cell(w, full)
        sys.stdout.write(f"{_YELLOW}warning:{_RESET} {text}\n" if color else f"warning: {text}\n")


def listing_text(lines: list[dict[str, Any]], full: bool = False) -> str:
    """`listing.get`'s lines as its text, each label, instruction and comment made safe by `cell`."""
    from binlens.api.instruction import ListingLine, render_text

    safe = [
        ListingLine.model_construct(
            **{**ln, "text": cell(ln["text"], full), "comment": ln.get("comment") and cell(ln["comment"], full)}
        )
        for ln in lines
    ]
    return render_text(safe)
