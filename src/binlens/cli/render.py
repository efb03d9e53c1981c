"""Rich rendering for the human commands (stdout is for the reader; errors go to stderr)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, soft_wrap=True)


def print_table(headers: list[str], rows: list[list[str]], title: str | None = None) -> None:
    """A plain table; numbers and addresses right-aligned where they look like them."""
    table = Table(title=title, show_edge=False, header_style="bold")
    for h in headers:
        table.add_column(h, no_wrap=h in ("address", "start", "end"))
    for r in rows:
        table.add_row(*(str(c) for c in r))
    console.print(table)


def print_info(data: dict[str, Any]) -> None:
    """`binlens info`: identity, sections, counts."""
    ident = data["identity"]
    ident_rows = [
        [k, str(ident[k])]
        for k in ("file_name", "format", "arch", "bits", "endian", "image_base", "entry", "size", "sha256", "program")
        if k in ident
    ]
    if ident.get("slice"):
        ident_rows.append(["slice", f"{ident['slice']} of {', '.join(data['slices'])}"])
    ident_rows.append(["database", data["database"]])
    print_table(["field", "value"], ident_rows, title="identity")
    print_table(
        ["name", "start", "end", "size", "perms", "kind"],
        [[s["name"], s["start"], s["end"], str(s["size"]), s["perms"], s["kind"]] for s in data["sections"]],
        title="sections",
    )
    print_table(["what", "count"], [[k, str(v)] for k, v in data["counts"].items()], title="counts")
    for w in data.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {w}")
