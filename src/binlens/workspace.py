"""Open programs (handles), limits, roots and the read-only switch: the state every method sees."""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from binlens import __version__, components
from binlens.errors import BinlensError
from binlens.loader import Image
from binlens.loader.image import Symbol
from binlens.loader.input_file import DEFAULT_MAX_FILE_BYTES, check_within, read_input, resolved_roots
from binlens.loader.isolate import parse_bytes
from binlens.store import ProgramDatabase, database_path, default_home
from binlens.store.secret import home_key

CURSOR_KEY_FILE = "cursor.key"  # under the home: the key that signs page cursors, shared by its processes

_ADDR_RE = re.compile(r"^\s*(0[xX][0-9a-fA-F]+)\s*$")
_OFFSET_RE = re.compile(r"^(.+?)\s*([+-])\s*(0[xX][0-9a-fA-F]+|\d+)$")


DEFAULT_MAX_RESPONSE_BYTES = 32 << 20  # a 9 MiB result is ~19 MiB as an MCP frame (text + structured)
MAX_RESPONSE_ENV = "BINLENS_MAX_RESPONSE_BYTES"


@dataclass
class Limits:
    """Server-wide limits (all configurable from the command line)."""

    # the most bytes one response may take on the wire, measured on the whole frame (MCP: the text
    # and the structured content and the envelope); $BINLENS_MAX_RESPONSE_BYTES or
    # --max-response-bytes set it for a server
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_concurrent: int = 4
    parse_timeout_s: float = 8.0
    max_read_bytes: int = 64 * 1024
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # input files above this are refused before being read


@dataclass
class Config:
    """How this workspace was started."""

    home: Path = field(default_factory=default_home)
    roots: list[Path] = field(default_factory=list)  # empty: see `files`
    # With no roots: None lets program.open read any path (the one-shot CLI, library use); a list
    # (a server started on FILEs) lets it open exactly those files and confines exports to
    # `export_dir` beside the program's database.
    files: list[Path] | None = None
    read_only: bool = False
    # what the server was started allowing beyond reading (`debug`: --allow-debug); methods
    # declare what they need with `@method(requires=("permission:debug",))`
    permissions: frozenset[str] = frozenset()
    limits: Limits = field(default_factory=Limits)
    server_name: str = "binlens"
    # the corpus store (`--corpus-store`): a postgresql:// or sqlite:/// URL; None: SQLite under `home`
    corpus_store: str | None = None


class NameMap(dict[int, str]):
    """Names by address, with the reverse index kept in step (name -> addresses, oldest first)."""

    def __init__(self) -> None:
        super().__init__()
        self._rev: dict[str, list[int]] = {}

    def __setitem__(self, va: int, name: str) -> None:
        if va in self:
            self._unindex(va)
        super().__setitem__(va, name)
        self._rev.setdefault(name, []).append(va)

    def __delitem__(self, va: int) -> None:
        self._unindex(va)
        super().__delitem__(va)

    def pop(self, va: int, *default: Any) -> Any:
        """Remove `va`'s name and return it (or the default)."""
        if va in self:
            self._unindex(va)
        return super().pop(va, *default)

    def clear(self) -> None:
        """Forget every name."""
        super().clear()
        self._rev.clear()

    def update(self, other: Any = (), **kw: str) -> None:
        """Set many names (through `__setitem__`, so the index follows)."""
        for va, name in dict(other, **kw).items():
            self[va] = name

    def setdefault(self, va: int, name: str) -> str:
        """`va`'s name, giving it `name` first when it has none."""
        if va not in self:
            self[va] = name
        return self[va]

    def address_of(self, name: str) -> int | None:
        """The address that carries `name` (the first given it), else None."""
        vas = self._rev.get(name)
        return vas[0] if vas else None

    def addresses_of(self, name: str) -> list[int]:
        """Every address that carries `name`, oldest first."""
        return list(self._rev.get(name, ()))

    def _unindex(self, va: int) -> None:
        old = super().__getitem__(va)
        vas = self._rev.get(old)
        if vas is not None:
            vas.remove(va)
            if not vas:
                del self._rev[old]


class Program:
    """One open program: its Image, database, and name index."""

    def __init__(self, handle: str, path: Path, image: Image, db: ProgramDatabase, cursor_key: bytes) -> None:
        self.handle = handle
        self.path = path
        self.image = image
        self.db = db
        self.cursor_key = cursor_key  # signs this program's page cursors (see binlens.api.cursor)
        self.lock = threading.RLock()
        self.extensions: dict[str, Any] = {}  # per-program state owned by other layers (analysis, ...)
        self.name_resolvers: list[Callable[[str], int | None]] = []
        # what other layers release when the program closes (provider sessions, the analysis
        # process, ...), in order; each returns what it could not release in time (or None)
        self.on_close: list[Callable[[], list[str] | None]] = []
        # User-given names by address (kept by the annotations layer); they win everywhere.
        self.user_names = NameMap()
        self._by_name: dict[str, int] = {}
        for s in image.symbols:
            self._by_name.setdefault(s.name, s.address)
            self._by_name.setdefault(s.raw_name, s.address)
        for e in image.exports:
            self._by_name.setdefault(e.name, e.address)
            self._by_name.setdefault(e.raw_name, e.address)
        for imp in image.imports:
            self._by_name.setdefault(imp.name, imp.stub if imp.stub is not None else imp.slot)
        self._name_by_addr: dict[int, str] = {}
        for s in sorted(image.symbols, key=lambda s: (s.kind != "function", s.binding == "local", s.name)):
            self._name_by_addr.setdefault(s.address, s.name)
        for e in image.exports:
            self._name_by_addr.setdefault(e.address, e.name)
        self._sym_sorted: list[Symbol] = sorted(
            (s for s in image.symbols if s.kind != "other" or s.source != "symtab"), key=lambda s: s.address
        )
        self._sym_addrs = [s.address for s in self._sym_sorted]

    @property
    def identity(self) -> dict[str, Any]:
        """The identity object every response about this program carries."""
        i = self.image.identity
        out = {
            "program": self.handle,
            "sha256": i.sha256,
            "size": i.size,
            "format": i.format,
            "arch": i.arch,
            "bits": i.bits,
            "endian": i.endian,
            "image_base": None if i.image_base is None else hex(i.image_base),
            "entry": hex(i.entry),
            "file_name": i.file_name,
        }
        if i.slice:
            out["slice"] = i.slice
        return out

    def name_at(self, va: int) -> str | None:
        """The name shown for `va`: a user name, else a symbol/export exactly at `va`, else None."""
        user = self.user_names.get(va)
        if user is not None:
            return user
        return self._name_by_addr.get(va)

    def lookup_name(self, name: str) -> int | None:
        """Address of a name: user and analysis names first, then symbols, exports, imports."""
        va = self.user_names.address_of(name)
        if va is not None:
            return va
        for resolver in self.name_resolvers:
            hit = resolver(name)
            if hit is not None:
                return hit
        return self._by_name.get(name)

    def resolve(self, text: str, target: str) -> int:
        """Turn '0x401000', 'name' or 'name+0x10' into an address, or fail pointing at `target`."""
        m = _ADDR_RE.match(text)
        if m:
            value = int(m.group(1), 16)
            if value >= 1 << 64:
                raise BinlensError("invalid_argument", f"address {text} does not fit in 64 bits", target=target)
            return value
        addr = self.lookup_name(text.strip())
        if addr is not None:
            return addr
        m = _OFFSET_RE.match(text.strip())
        if m:
            base = self.lookup_name(m.group(1))
            if base is not None:
                delta = int(m.group(3), 0)
                return base + delta if m.group(2) == "+" else base - delta
        raise BinlensError(
            "not_found",
            f"{text!r} is neither a hex address like '0x401000' nor a known name",
            target=target,
        )

    def nearest_symbol(self, va: int) -> tuple[Symbol, int] | None:
        """The closest symbol at or below `va`, with the offset of `va` from it."""
        i = bisect.bisect_right(self._sym_addrs, va) - 1
        if i < 0:
            return None
        sym = self._sym_sorted[i]
        return sym, va - sym.address


class Workspace:
    """All open programs and the server's configuration."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        self.programs: dict[str, Program] = {}
        self._lock = threading.RLock()
        self._slots = threading.BoundedSemaphore(self.config.limits.max_concurrent)
        self.version = __version__
        self.extensions: dict[str, Any] = {}  # workspace-wide state owned by other layers (the server's slots)

    @property
    def read_only(self) -> bool:
        return self.config.read_only

    @property
    def limits(self) -> Limits:
        return self.config.limits

    # --- handles --------------------------------------------------------------------------
    def program(self, ref: str | None, target: str = "/params/program") -> Program:
        """The program named by `ref`, or the only open one when `ref` is None."""
        with self._lock:
            if ref is None:
                if len(self.programs) == 1:
                    return next(iter(self.programs.values()))
                if not self.programs:
                    raise BinlensError("not_found", "no program is open; call program.open first", target=target)
                raise BinlensError(
                    "invalid_argument",
                    f"{len(self.programs)} programs are open: say which one with 'program'",
                    target=target,
                    details={"programs": sorted(self.programs)},
                )
            prog = self.programs.get(ref)
            if prog is None:
                raise BinlensError(
                    "not_found", f"no open program {ref!r}", target=target, details={"programs": sorted(self.programs)}
                )
            return prog

    def check_root(self, path: Path, target: str = "/params/path") -> Path:
        """Refuse a path outside the configured roots or started files (symlinks resolved first)."""
        roots = self.config.roots
        real = check_within(path, roots, target)
        if not roots and self.config.files is not None and real not in set(resolved_roots(self.config.files)):
            raise BinlensError(
                "invalid_argument",
                f"{path} is not one of the files this server was started on (start it with --root DIR "
                "to let clients open other files)",
                target=target,
                details={"files": [str(f) for f in self.config.files]},
            )
        return real

    def export_dir(self, prog: Program) -> Path:
        """Where a server started on files (no roots) writes exports: a folder beside the database."""
        return prog.db.path.parent / "exports"

    def check_export(self, path: Path, prog: Program, target: str = "/params/path") -> Path:
        """The real path an export of `prog` may write: under the roots, or in `export_dir` when
        the server is confined to its started files (a relative path is taken from there)."""
        if self.config.roots or self.config.files is None:
            return self.check_root(path, target)
        folder = self.export_dir(prog)
        folder.mkdir(parents=True, exist_ok=True)
        base = folder.resolve()
        p = path.expanduser()
        real = (p if p.is_absolute() else base / p).resolve()
        if base not in real.parents:
            raise BinlensError(
                "invalid_argument",
                f"{path} is outside {base}: a server started on files without --root writes exports "
                "only there (give a file name)",
                target=target,
                details={"export_dir": str(base)},
            )
        return real

    def open(self, path: str | Path, slice_name: str | None = None, *, check_roots: bool = True) -> Program:
        """Open (or return the already open) program for the file at `path` (`input_file.read_input`:
        a regular file, under the roots unless `check_roots` is off, of at most `max_file_bytes`)."""
        confine: Sequence[Path] = ()
        if check_roots:
            self.check_root(Path(path))  # (the clearer refusal, before anything is opened)
            # the opened file is checked again: a started file is a root with nothing inside it
            confine = self.config.roots or (self.config.files or ())
        opened = read_input(path, max_bytes=self.limits.max_file_bytes, roots=confine)
        real = opened.path
        try:
            image = parse_bytes(opened.data, real.name, slice_name, timeout=self.limits.parse_timeout_s)
        except BinlensError as err:
            if err.target is not None:
                raise
            # what is wrong is the file the path names (not an executable, malformed, ...)
            raise BinlensError(err.code, err.message, target="/params/path", details=err.details) from None
        ident = image.identity
        handle = "p" + ident.sha256[:8] + (f"-{ident.slice}" if ident.slice else "")
        with self._lock:
            existing = self.programs.get(handle)
            if existing is not None:
                return existing
            db = ProgramDatabase(database_path(self.config.home, ident.sha256, ident.slice), ident.size)
            db.record_image(ident.sha256, ident.file_name, ident.size, ident.format, ident.arch, ident.slice)
            prog = Program(handle, real, image, db, home_key(self.config.home, CURSOR_KEY_FILE))
            self.programs[handle] = prog
            for hook in open_hooks():
                hook(self, prog)
            return prog

    def close(self, handle: str) -> list[str]:
        """Close a program: drain its work (each `on_close` release, in order) and close its
        database. What could not be released in time, as lines naming it (empty: all of it)."""
        with self._lock:
            prog = self.programs.pop(handle, None)
        if prog is None:
            raise BinlensError("not_found", f"no open program {handle!r}", target="/params/program")
        remaining: list[str] = []
        for release in prog.on_close:
            remaining += release() or []
        prog.db.close()
        return remaining

    # --- concurrency ----------------------------------------------------------------------
    @contextmanager
    def work_slot(self) -> Iterator[None]:
        """Hold one of the N analysis slots, or fail with `busy` at once (no unbounded queue)."""
        if not self._slots.acquire(blocking=False):
            raise BinlensError(
                "busy",
                f"{self.limits.max_concurrent} requests are already doing analysis work; retry shortly",
                details={"max_concurrent": self.limits.max_concurrent},
            )
        try:
            yield
        finally:
            self._slots.release()


_open_hooks: tuple[Callable[[Workspace, Program], None], ...] | None = None
_open_hooks_lock = threading.Lock()


def open_hooks() -> tuple[Callable[[Workspace, Program], None], ...]:
    """The hooks that attach per-program state when a program opens (`components.OPEN_HOOKS`, in
    its order), imported by the first open."""
    global _open_hooks
    if _open_hooks is None:
        with _open_hooks_lock:
            if _open_hooks is None:  # (set whole, once every hook is imported: no thread sees a part)
                _open_hooks = tuple(components.load(ref) for ref in components.OPEN_HOOKS)
    return _open_hooks
