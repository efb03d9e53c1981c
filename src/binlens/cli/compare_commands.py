"""`binlens diff OLD NEW` and `binlens port OLD NEW`: compare.programs and compare.port_annotations."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from binlens.cli.analysis_commands import _open_and_analyse, _run
from binlens.cli.main import command
from binlens.cli.render import add_full_option


def _two(p: argparse.ArgumentParser) -> None:
    p.add_argument("old", help="the older (or annotated) program")
    p.add_argument("new", help="the newer program")
    p.add_argument("--json", action="store_true", help="the whole result as JSON")


def _open_both(args: argparse.Namespace, then: str) -> tuple[Any, str, str]:
    """The workspace and the handles of OLD and NEW, both analysed (or loaded)."""
    from binlens.api import invoke

    ws, old = _open_and_analyse(argparse.Namespace(**{**vars(args), "file": args.old, "slice": None}), then)
    new = ws.open(args.new, None, check_roots=False)
    invoke(ws, "analysis.start", {"program": new.handle, "wait": True})
    return ws, old.handle, new.handle


# ------------------------------------------------------------------------------------ diff
def _diff_args(p: argparse.ArgumentParser) -> None:
    """Match two programs' functions: changed (with scores), added, removed (BinDiff-style)."""
    _two(p)
    p.add_argument("--all", action="store_true", help="list the identical functions too")
    add_full_option(p)


@command("diff", _diff_args)
def cmd_diff(args: argparse.Namespace) -> int:
    return _run(_diff, args)


def _diff(args: argparse.Namespace) -> int:
    from binlens.api import invoke

    ws, old, new = _open_both(args, "compare.programs")
    matched: list[dict[str, Any]] = []
    added: list[dict[str, Any]] = []
    removed: list[dict[str, Any]] = []
    params: dict[str, Any] = {"left": old, "right": new}
    if not args.all and not args.json:
        params["kinds"] = ["changed"]
    cursor = None
    while True:
        page: dict[str, Any] = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
        data = invoke(ws, "compare.programs", {**params, "page": page}, max_response_bytes=1 << 30)
        matched += data["matched"]
        added += data["added"]
        removed += data["removed"]
        cursor = data["next_cursor"]
        if not cursor:
            break
    if args.json:
        data.update(matched=matched, added=added, removed=removed, next_cursor=None)
        print(json.dumps(data, indent=1))
        return 0
    from binlens.cli.render import print_table

    rows = [
        [
            m["kind"],
            f"{m['similarity']:.2f}",
            m["left"]["address"],
            m["left"]["name"],
            m["right"]["address"],
            m["right"]["name"],
        ]
        for m in sorted(matched, key=lambda m: (m["kind"] != "changed", m["similarity"], m["left"]["address"]))
    ]
    rows += [["removed", "", f["address"], f["name"], "", ""] for f in removed]
    rows += [["added", "", "", "", f["address"], f["name"]] for f in added]
    c = data["counts"]
    title = f"{c['identical']} identical, {c['changed']} changed, {c['added']} added, {c['removed']} removed"
    print_table(["status", "similarity", "old", "old name", "new", "new name"], rows, title=title, full=args.full)
    return 0


# ------------------------------------------------------------------------------------ port
def _port_args(p: argparse.ArgumentParser) -> None:
    """Copy names, prototypes, comments, local variable names and typed globals from OLD to the matched functions
    of NEW."""
    _two(p)
    p.add_argument("--min-similarity", type=float, default=0.6, help="only pairs at least this similar (0..1)")
    p.add_argument(
        "--kinds",
        default="names,prototypes,comments,local_variables,globals",
        help="comma-separated: names,prototypes,comments,local_variables,globals",
    )
    add_full_option(p)


@command("port", _port_args)
def cmd_port(args: argparse.Namespace) -> int:
    return _run(_port, args)


def _port(args: argparse.Namespace) -> int:
    from binlens.api import invoke

    ws, old, new = _open_both(args, "compare.port_annotations")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    data = invoke(
        ws,
        "compare.port_annotations",
        {"from": old, "to": new, "min_similarity": args.min_similarity, "kinds": kinds},
        max_response_bytes=1 << 30,
    )
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    from binlens.cli.render import print_table

    rows = [["copied", e["kind"], e["source"] or "", e["target"] or "", e["value"] or "", ""] for e in data["copied"]]
    rows += [
        ["skipped", e["kind"], e["source"] or "", e["target"] or "", e["value"] or "", e["reason"] or ""]
        for e in data["skipped"]
    ]
    title = (
        f"{data['copied_count']} copied, {data['skipped_count']} skipped over {data['matched']} matched functions"
        f" (journal entry {data['journal_id']}: journal.undo on NEW takes it all back)"
    )
    print_table(["", "kind", "old", "new", "value", "reason"], rows, title=title, full=args.full)
    sys.stdout.flush()
    return 0
