"""The benchmark corpus: real C programs from Debian source packages, built in a matrix of configurations.

Everything lives in a work folder outside git (default `bench/work/`): the source packages, the
unpacked trees, and one folder per binary with the unstripped build (ground truth), the stripped
build (the input every tool sees) and the ground truth as JSON.

Matrix: program x compiler (gcc, clang) x optimisation (-O0, -O2, -O3) x PIE/non-PIE x unwind
information kept (`eh`) or removed (`noeh`: compiled with -fno-asynchronous-unwind-tables
-fno-unwind-tables, and `.eh_frame`/`.eh_frame_hdr` stripped, since crt objects bring their own).
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from elfsyms import executable_ranges, function_symbols

HERE = Path(__file__).resolve().parent
DEFAULT_WORKDIR = HERE / "work"

PROGRAMS = ("zlib", "bzip2", "lua5.4", "sqlite3")
COMPILERS = ("gcc", "clang")
OPTS = ("O0", "O2", "O3")
PIES = ("pie", "nopie")
UNWINDS = ("eh", "noeh")

NOEH_CFLAGS = ["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]
NOEH_STRIP = ["--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr"]


@dataclass(frozen=True)
class Recipe:
    """How to build one program's executable from its unpacked Debian source tree."""

    package: str  # Debian source package name
    tree_glob: str  # the unpacked folder, relative to src/
    sources: tuple[str, ...]  # globs relative to the tree
    exclude: tuple[str, ...] = ()
    cflags: tuple[str, ...] = ()
    libs: tuple[str, ...] = ()
    output: str = "a.out"


RECIPES: dict[str, Recipe] = {
    "zlib": Recipe(
        package="zlib",
        tree_glob="zlib-*",
        sources=(
            "adler32.c",
            "compress.c",
            "crc32.c",
            "deflate.c",
            "gzclose.c",
            "gzlib.c",
            "gzread.c",
            "gzwrite.c",
            "infback.c",
            "inffast.c",
            "inflate.c",
            "inftrees.c",
            "trees.c",
            "uncompr.c",
            "zutil.c",
            "test/minigzip.c",
        ),
        cflags=("-I.", "-D_LARGEFILE64_SOURCE=1", "-DHAVE_HIDDEN"),
        output="minigzip",
    ),
    "bzip2": Recipe(
        package="bzip2",
        tree_glob="bzip2-*",
        sources=(
            "blocksort.c",
            "huffman.c",
            "crctable.c",
            "randtable.c",
            "compress.c",
            "decompress.c",
            "bzlib.c",
            "bzip2.c",
        ),
        cflags=("-D_FILE_OFFSET_BITS=64",),
        output="bzip2",
    ),
    "lua5.4": Recipe(
        package="lua5.4",
        tree_glob="lua5.4-*",
        sources=("src/*.c",),
        exclude=("src/luac.c",),
        cflags=("-DLUA_COMPAT_5_3", "-DLUA_USE_LINUX"),
        libs=("-lm", "-ldl"),
        output="lua",
    ),
    "sqlite3": Recipe(
        package="sqlite3",
        tree_glob="sqlite3-*",
        sources=("bld/sqlite3.c", "bld/shell.c"),
        cflags=("-Ibld", "-DSQLITE_THREADSAFE=0", "-DSQLITE_OMIT_LOAD_EXTENSION"),
        libs=("-lm",),
        output="sqlite3",
    ),
}


@dataclass(frozen=True)
class Variant:
    """One cell of the build matrix."""

    program: str
    compiler: str
    opt: str
    pie: str
    unwind: str

    @property
    def name(self) -> str:
        """Stable name, e.g. `zlib-gcc-O2-pie-eh`."""
        return f"{self.program}-{self.compiler}-{self.opt}-{self.pie}-{self.unwind}"


@dataclass
class Binary:
    """A built corpus binary: the stripped input and its ground truth."""

    variant: Variant
    folder: Path

    @property
    def stripped(self) -> Path:
        """The stripped build every tool analyses."""
        return self.folder / "stripped"

    @property
    def unstripped(self) -> Path:
        """The build with its symbol table (ground truth source)."""
        return self.folder / "unstripped"

    def truth(self) -> dict[int, str]:
        """Ground-truth function starts: address -> one symbol name."""
        data = json.loads((self.folder / "truth.json").read_text())
        return {int(a, 16): n for a, n in data["functions"].items()}

    def neutral(self) -> set[int]:
        """Starts of FUNC symbols of size zero (crt assembly: `_init`, `frame_dummy`, ...): real functions
        the ground truth cannot size, so a prediction there is neither right nor wrong."""
        data = json.loads((self.folder / "truth.json").read_text())
        return {int(a, 16) for a in data.get("neutral", {})}

    def scope(self) -> list[tuple[int, int]]:
        """Address ranges where predicted starts are scored: executable sections except PLT sections."""
        data = json.loads((self.folder / "truth.json").read_text())
        return [(int(a, 16), int(b, 16)) for a, b in data["scope"]]


def matrix(
    programs: Iterable[str] = PROGRAMS,
    compilers: Iterable[str] = COMPILERS,
    opts: Iterable[str] = OPTS,
    pies: Iterable[str] = PIES,
    unwinds: Iterable[str] = UNWINDS,
) -> list[Variant]:
    """All variants of the chosen subset, in a stable order."""
    return [Variant(p, c, o, pi, u) for p in programs for c in compilers for o in opts for pi in pies for u in unwinds]


def log(msg: str) -> None:
    """Progress to stderr (tables go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def _enable_deb_src() -> None:
    """Add a deb-src entry mirroring the configured deb sources (Debian only; needs root)."""
    src_list = Path("/etc/apt/sources.list.d/binlens-bench-src.sources")
    have = any(
        "deb-src" in p.read_text(errors="replace")
        for p in [*Path("/etc/apt/sources.list.d").glob("*"), Path("/etc/apt/sources.list")]
        if p.is_file()
    )
    if have:
        return
    deb = Path("/etc/apt/sources.list.d/debian.sources")
    if not deb.is_file():
        raise RuntimeError("no deb-src entry and no /etc/apt/sources.list.d/debian.sources to mirror; add one by hand")
    text = deb.read_text().replace("Types: deb\n", "Types: deb-src\n")
    src_list.write_text(text)
    _run(["apt-get", "update", "-q"])


def fetch_sources(workdir: Path, programs: Iterable[str]) -> None:
    """Download (once) and unpack the Debian source packages of the chosen programs."""
    src = workdir / "src"
    src.mkdir(parents=True, exist_ok=True)
    for prog in programs:
        r = RECIPES[prog]
        if not list(src.glob(f"{r.package}_*.dsc")):
            _enable_deb_src()
            log(f"apt-get source {r.package}")
            _run(["apt-get", "source", "--download-only", r.package], cwd=src)
        if not _tree(workdir, prog, must=False):
            dsc = sorted(src.glob(f"{r.package}_*.dsc"))[-1]
            log(f"unpacking {dsc.name}")
            _run(["dpkg-source", "--no-check", "-x", dsc.name], cwd=src)
        if prog == "sqlite3":
            _prepare_sqlite(_tree(workdir, prog))
        if prog == "lua5.4":
            # Debian's path patch includes a header that debian/rules generates.
            header = _tree(workdir, prog) / "src" / "lua5.4-deb-multiarch.h"
            if not header.is_file():
                header.write_text('#ifndef DEB_HOST_MULTIARCH\n#define DEB_HOST_MULTIARCH "x86_64-linux-gnu"\n#endif\n')


def _tree(workdir: Path, prog: str, must: bool = True) -> Path | None:
    hits = sorted(p for p in (workdir / "src").glob(RECIPES[prog].tree_glob) if p.is_dir())
    if not hits and must:
        raise RuntimeError(f"source tree of {prog} not found under {workdir / 'src'}")
    return hits[-1] if hits else None


def _prepare_sqlite(tree: Path) -> None:
    """Generate the amalgamation (sqlite3.c, shell.c) from the full source tree (needs tclsh)."""
    bld = tree / "bld"
    if (bld / "sqlite3.c").is_file() and (bld / "shell.c").is_file():
        return
    if not shutil.which("tclsh"):
        raise RuntimeError("sqlite3's amalgamation needs tclsh: apt-get install tcl")
    bld.mkdir(exist_ok=True)
    log("sqlite3: configure + make sqlite3.c shell.c (amalgamation)")
    _run(["../configure", "--disable-tcl", "--disable-readline"], cwd=bld)
    _run(["make", "sqlite3.c", "shell.c"], cwd=bld)


def build(workdir: Path, variant: Variant) -> Binary:
    """Build one variant (cached: skipped when its truth.json exists; safe against concurrent builders)."""
    folder = workdir / "bin" / variant.name
    if (folder / "truth.json").is_file():
        return Binary(variant, folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(workdir, variant, folder)


def _build_locked(workdir: Path, variant: Variant, folder: Path) -> Binary:
    binary = Binary(variant, folder)
    if (folder / "truth.json").is_file():
        return binary
    recipe = RECIPES[variant.program]
    tree = _tree(workdir, variant.program)
    files: list[str] = []
    for pattern in recipe.sources:
        files += sorted(glob.glob(pattern, root_dir=tree))
    files = [f for f in files if f not in recipe.exclude]
    flags = [f"-{variant.opt}", "-w", *recipe.cflags]
    flags += ["-fPIE", "-pie"] if variant.pie == "pie" else ["-fno-pie", "-no-pie"]
    if variant.unwind == "noeh":
        flags += NOEH_CFLAGS
    out = folder / "unstripped"
    t0 = time.monotonic()
    _run([variant.compiler, *flags, *files, "-o", str(out), *recipe.libs], cwd=tree)
    strip = ["strip", "--strip-all"]
    if variant.unwind == "noeh":
        strip += NOEH_STRIP
    _run([*strip, "-o", str(folder / "stripped"), str(out)])
    truth = function_symbols(out)
    neutral = {a: n for a, n in function_symbols(out, sized=False).items() if a not in truth}
    scope = executable_ranges(folder / "stripped", exclude_prefixes=(".plt",))
    (folder / "truth.tmp").write_text(
        json.dumps(
            {
                "variant": variant.name,
                "build_seconds": round(time.monotonic() - t0, 1),
                "functions": {f"{a:#x}": n for a, n in sorted(truth.items())},
                "neutral": {f"{a:#x}": n for a, n in sorted(neutral.items())},
                "scope": [[f"{a:#x}", f"{b:#x}"] for a, b in scope],
            },
            indent=0,
        )
    )
    (folder / "truth.tmp").rename(folder / "truth.json")
    log(f"built {variant.name} ({len(truth)} functions, {time.monotonic() - t0:.0f}s)")
    return binary


def build_all(workdir: Path, variants: list[Variant], jobs: int = 2) -> list[Binary]:
    """Fetch what is missing and build every variant, `jobs` compilers at a time."""
    fetch_sources(workdir, sorted({v.program for v in variants}))
    missing = [c for c in ("gcc", "clang") if c in {v.compiler for v in variants} and not shutil.which(c)]
    if missing:
        raise RuntimeError(f"compiler not found: {', '.join(missing)} (apt-get install {' '.join(missing)})")
    # Big programs first so the pool stays busy.
    order = sorted(variants, key=lambda v: PROGRAMS.index(v.program) if v.program in PROGRAMS else 0, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        built = {b.variant: b for b in pool.map(lambda v: build(workdir, v), order)}
    return [built[v] for v in variants]


def add_subset_args(parser) -> None:  # noqa: ANN001 - argparse.ArgumentParser
    """The subset flags shared by accuracy.py and speed.py."""
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("BINLENS_BENCH_WORK", DEFAULT_WORKDIR)))
    parser.add_argument("--programs", default=",".join(PROGRAMS), help="comma list of " + ",".join(PROGRAMS))
    parser.add_argument("--compilers", default=",".join(COMPILERS), help="comma list of gcc,clang")
    parser.add_argument("--opts", default=",".join(OPTS), help="comma list of O0,O2,O3")
    parser.add_argument("--pie", default=",".join(PIES), help="comma list of pie,nopie")
    parser.add_argument("--unwind", default=",".join(UNWINDS), help="comma list of eh,noeh")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compiler runs while building the corpus")


def variants_from_args(args) -> list[Variant]:  # noqa: ANN001 - argparse.Namespace
    """The chosen subset of the matrix, validated."""

    def pick(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
        items = [x.strip() for x in value.split(",") if x.strip()]
        bad = [x for x in items if x not in allowed]
        if bad:
            raise SystemExit(f"unknown {what}: {', '.join(bad)} (choose from {', '.join(allowed)})")
        return items

    return matrix(
        pick(args.programs, PROGRAMS, "program"),
        pick(args.compilers, COMPILERS, "compiler"),
        pick(args.opts, OPTS, "optimisation"),
        pick(args.pie, PIES, "PIE mode"),
        pick(args.unwind, UNWINDS, "unwind mode"),
    )


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Build the benchmark corpus (all or a subset).")
    add_subset_args(ap)
    a = ap.parse_args()
    t = time.monotonic()
    bins = build_all(a.workdir, variants_from_args(a), a.jobs)
    log(f"{len(bins)} binaries ready in {a.workdir / 'bin'} ({time.monotonic() - t:.0f}s)")
