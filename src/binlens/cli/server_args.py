"""Options shared by `binlens mcp` and `binlens serve`, defined once."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

# Kept in step with binlens.server.mcp_tools.validate_prefix (that module imports the MCP SDK,
# which the CLI does not need just to parse arguments).
_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
SEPARATOR_ENV = "BINLENS_TOOL_SEPARATOR"


def tool_prefix(value: str) -> str:
    """argparse type of `--tool-prefix`: 1-64 letters, digits, `_` or `-`, starting with a letter."""
    if not _PREFIX_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"tool prefix {value!r} must be 1-64 letters, digits, '_' or '-', starting with a letter"
        )
    return value


def response_bytes(value: str) -> int:
    """argparse type of --max-response-bytes: a size (`byte_count`) of at least 1 KiB."""
    from binlens.cli.main import byte_count  # (main imports this module)

    n = byte_count(value)
    if n < 1024:
        raise argparse.ArgumentTypeError("must be at least 1K")
    return n


def max_response_bytes(args: argparse.Namespace) -> int:
    """The response budget a server was started with: --max-response-bytes, else
    $BINLENS_MAX_RESPONSE_BYTES, else the default."""
    from binlens.workspace import DEFAULT_MAX_RESPONSE_BYTES, MAX_RESPONSE_ENV

    if args.max_response_bytes is not None:
        return int(args.max_response_bytes)
    env = os.environ.get(MAX_RESPONSE_ENV)
    if env:
        try:
            return response_bytes(env)
        except argparse.ArgumentTypeError as err:
            raise SystemExit(f"binlens: error: ${MAX_RESPONSE_ENV}={env!r}: {err}") from None
    return DEFAULT_MAX_RESPONSE_BYTES


def positive(value: str) -> int:
    """argparse type of a count that must be at least 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def seconds(value: str) -> float:
    """argparse type of a duration in seconds: a number above 0."""
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not n > 0 or n == float("inf"):
        raise argparse.ArgumentTypeError("must be a number of seconds above 0")
    return n


def separator(value: str) -> str:
    """argparse type of `--tool-separator` (also applied to the $BINLENS_TOOL_SEPARATOR default)."""
    if value not in (".", "_"):
        raise argparse.ArgumentTypeError(f"{value!r} is not '.' or '_' (check ${SEPARATOR_ENV})")
    return value


CORPUS_STORE_ENV = "BINLENS_CORPUS_STORE"


def corpus_store_url(value: str) -> str:
    """argparse type of `--corpus-store`: a postgresql:// (or postgres://) URL or a sqlite:///path URL."""
    if not value.startswith(("postgresql://", "postgres://", "sqlite:///")):
        raise argparse.ArgumentTypeError(
            "is not a postgresql://user@host:port/database URL or a sqlite:///path URL (check $BINLENS_CORPUS_STORE)"
        )
    return value


def has_password(url: str) -> bool:
    """Whether a store URL carries a password (which is never printed)."""
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).password is not None
    except ValueError:
        return True


def add_corpus_store_option(p: argparse.ArgumentParser) -> None:
    """`--corpus-store URL`: the corpus store the corpus.* methods and commands use."""
    env = os.environ.get(CORPUS_STORE_ENV) or None
    p.add_argument(
        "--corpus-store",
        metavar="URL",
        type=corpus_store_url,
        default=env,
        help=f"the corpus store (docs/CORPUS.md): a postgresql://user@host/db URL shared by a team, or "
        f"sqlite:///path (default ${CORPUS_STORE_ENV}, else corpus.sqlite under the home)",
    )


def confinement(files: list[str], roots: list[Path]) -> dict[str, Any]:
    """Workspace `roots`/`files` of a server: --root DIR..., else exactly the FILEs it was started on,
    else the current folder."""
    if roots:
        return {"roots": [r.expanduser().resolve() for r in roots]}
    if files:
        return {"roots": [], "files": [Path(f).expanduser().resolve() for f in files]}
    return {"roots": [Path.cwd().resolve()]}


def permissions(args: argparse.Namespace) -> frozenset[str]:
    """The permissions the command line grants (`--allow-debug`: `debug`; `--allow-live-pid`: `live`)."""
    granted = set()
    if getattr(args, "allow_debug", False):
        granted.add("debug")
    if getattr(args, "allow_live_pid", None) is not None:
        granted.add("live")
    return frozenset(granted)


def pin_live_pid(args: argparse.Namespace, ws: Any, prog: Any, command: str) -> bool:
    """With `--allow-live-pid PID`: verify PID runs `prog`'s file and pin it (False, with the
    reason on stderr, when it does not: the server must not start)."""
    pid = getattr(args, "allow_live_pid", None)
    if pid is None:
        return True
    from binlens.api.live import pin_live
    from binlens.errors import BinlensError

    try:
        pin_live(ws, prog, pid)
    except BinlensError as err:
        sys.stderr.write(f"binlens {command}: error: --allow-live-pid {pid}: {err.message}\n")
        return False
    return True


def add_mcp_options(p: argparse.ArgumentParser, *, root_help: str, frame_help: str) -> None:
    """FILEs, tool naming, read-only, roots, concurrency and frame limit."""
    p.add_argument("files", nargs="*", metavar="FILE", help="programs to open at start")
    p.add_argument("--tool-prefix", metavar="PREFIX", type=tool_prefix, default="binlens", help="MCP tool name prefix")
    p.add_argument(
        "--tool-separator",
        type=separator,
        default=os.environ.get(SEPARATOR_ENV, "_"),
        help=f"between prefix and domain in tool names (default '_': binlens_help, accepted by every client; "
        f"'.' for Ghidra Bridge's binlens.help; ${SEPARATOR_ENV} sets the default)",
    )
    p.add_argument("--read-only", action="store_true", help="refuse every mutation (they stay listed)")
    p.add_argument(
        "--allow-debug",
        action="store_true",
        help="allow the debug methods to start and attach to processes (docs/DEBUGGING.md)",
    )
    p.add_argument(
        "--allow-live-pid",
        metavar="PID",
        type=positive,
        default=None,
        help="serve the live.* methods over process PID, verified to run the first FILE before serving",
    )
    p.add_argument("--root", metavar="DIR", action="append", type=Path, default=[], help=root_help)
    add_corpus_store_option(p)
    p.add_argument(
        "--max-concurrent", metavar="N", type=positive, default=4, help="calls running at once; more get busy"
    )
    p.add_argument("--max-frame-bytes", metavar="N", type=positive, default=1 << 20, help=frame_help)
    p.add_argument(
        "--max-response-bytes",
        metavar="N",
        type=response_bytes,
        default=None,
        help="the most bytes one response may take, measured on the whole frame (K, M, G suffixes; "
        "default $BINLENS_MAX_RESPONSE_BYTES or 32M); a bigger result answers response_too_large",
    )
