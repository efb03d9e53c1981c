"""The benchmark builds: real C programs from Debian source packages, built in a matrix of configurations.

Everything lives in a work folder outside git (default `bench/work/`): the source packages, the
unpacked trees, and one folder per binary with the unstripped build (ground truth), the stripped
build (the input every tool sees) and the ground truth as JSON.

Matrix: program x compiler (gcc, clang) x optimisation (-O0, -O2, -O3) x PIE/non-PIE x unwind
information kept (`eh`) or removed (`noeh`: compiled with -fno-asynchronous-unwind-tables
-fno-unwind-tables, and `.eh_frame`/`.eh_frame_hdr` stripped, since crt objects bring their own).

`--arch` picks the target: `x86-64` (the default: native gcc and clang, names without a prefix) or
one of the Debian cross toolchains (`aarch64`, `arm` (armhf, Thumb-2 by default), `mips` (mipsel),
`ppc` (32-bit big-endian), `ppc64le` (ELFv2), `riscv64`, `i386`): gcc only, names prefixed with the arch
(`aarch64-zlib-gcc-O2-pie-eh`), by default -O0/-O2 PIE with and without unwind information.
armhf's, mipsel's and riscv64's gcc emit no unwind tables for C by default, so their `eh` builds add
-fasynchronous-unwind-tables (ARM: `.ARM.exidx` entries; MIPS, RISC-V: `.eh_frame`), and ARM's `noeh`
builds also lose `.ARM.exidx`/`.ARM.extab`.
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
# Sections with linker-made call stubs (no FUNC symbol): predictions there are not scored.
STUB_SECTIONS = (".plt", ".MIPS.stubs", ".glink", ".iplt")


@dataclass(frozen=True)
class Arch:
    """A target architecture: its toolchain and the default subset of the matrix built for it."""

    triple: str | None  # Debian cross triple (`<triple>-gcc`, `<triple>-strip`); None: the native tools
    compilers: tuple[str, ...] = ("gcc",)
    opts: tuple[str, ...] = ("O0", "O2")
    pies: tuple[str, ...] = ("pie",)
    noeh_strip: tuple[str, ...] = ()  # further unwind sections removed in `noeh` builds
    eh_cflags: tuple[str, ...] = ()  # `eh` builds: where gcc emits no unwind tables for C by default

    def tool(self, name: str) -> str:
        """The toolchain program, e.g. `aarch64-linux-gnu-gcc` (or plain `gcc` natively)."""
        return f"{self.triple}-{name}" if self.triple else name


ARCHES: dict[str, Arch] = {
    "x86-64": Arch(None, compilers=COMPILERS, opts=OPTS, pies=PIES),
    "aarch64": Arch("aarch64-linux-gnu"),
    # armhf's gcc emits Thumb-2 by default. It (and mipsel's, riscv64's) emits no unwind tables for C unless asked:
    # `eh` asks, as x86-64's gcc does by default (ARM: .ARM.exidx/.ARM.extab entries; MIPS: .eh_frame).
    "arm": Arch(
        "arm-linux-gnueabihf",
        noeh_strip=("--remove-section=.ARM.exidx", "--remove-section=.ARM.extab"),
        eh_cflags=("-fasynchronous-unwind-tables",),
    ),
    "mips": Arch("mipsel-linux-gnu", eh_cflags=("-fasynchronous-unwind-tables",)),
    "ppc": Arch("powerpc-linux-gnu"),
    "ppc64le": Arch("powerpc64le-linux-gnu"),
    "i386": Arch("i686-linux-gnu"),
    "riscv64": Arch("riscv64-linux-gnu", eh_cflags=("-fasynchronous-unwind-tables",)),
}
NATIVE = "x86-64"


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
    arch: str = NATIVE

    @property
    def name(self) -> str:
        """Stable name, e.g. `zlib-gcc-O2-pie-eh`, or `aarch64-zlib-gcc-O2-pie-eh` off x86-64."""
        base = f"{self.program}-{self.compiler}-{self.opt}-{self.pie}-{self.unwind}"
        return base if self.arch == NATIVE else f"{self.arch}-{base}"


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
    arch: str = NATIVE,
) -> list[Variant]:
    """All variants of the chosen subset, in a stable order."""
    return [
        Variant(p, c, o, pi, u, arch) for p in programs for c in compilers for o in opts for pi in pies for u in unwinds
    ]


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
    arch = ARCHES[variant.arch]
    flags = [f"-{variant.opt}", "-w", *recipe.cflags]
    flags += ["-fPIE", "-pie"] if variant.pie == "pie" else ["-fno-pie", "-no-pie"]
    if variant.unwind == "noeh":
        flags += NOEH_CFLAGS
    else:
        flags += arch.eh_cflags
    out = folder / "unstripped"
    t0 = time.monotonic()
    _run([arch.tool(variant.compiler), *flags, *files, "-o", str(out), *recipe.libs], cwd=tree)
    strip = [arch.tool("strip"), "--strip-all"]
    if variant.unwind == "noeh":
        strip += [*NOEH_STRIP, *arch.noeh_strip]
    _run([*strip, "-o", str(folder / "stripped"), str(out)])
    truth = function_symbols(out)
    # Not scored: size-0 crt functions and the call stubs GNU ld writes into .text (PowerPC's plt_pic32).
    neutral = {a: n for a, n in function_symbols(out, sized=False).items() if a not in truth}
    neutral.update({a: n for a, n in function_symbols(out, stubs=True).items() if a not in truth})
    scope = executable_ranges(folder / "stripped", exclude_prefixes=STUB_SECTIONS)
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
    needed = sorted(
        {ARCHES[v.arch].tool(v.compiler) for v in variants} | {ARCHES[v.arch].tool("strip") for v in variants}
    )
    missing = [c for c in needed if not shutil.which(c)]
    if missing:
        raise RuntimeError(f"toolchain not found: {', '.join(missing)} (e.g. apt-get install gcc-aarch64-linux-gnu)")
    # Big programs first so the pool stays busy.
    order = sorted(variants, key=lambda v: PROGRAMS.index(v.program) if v.program in PROGRAMS else 0, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        built = {b.variant: b for b in pool.map(lambda v: build(workdir, v), order)}
    return [built[v] for v in variants]


def add_subset_args(parser) -> None:  # noqa: ANN001 - argparse.ArgumentParser
    """The subset flags shared by accuracy.py and speed.py."""
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("BINLENS_BENCH_WORK", DEFAULT_WORKDIR)))
    parser.add_argument(
        "--arch", default=NATIVE, choices=list(ARCHES), help="target architecture (default x86-64: the native corpus)"
    )
    parser.add_argument("--programs", default=",".join(PROGRAMS), help="comma list of " + ",".join(PROGRAMS))
    parser.add_argument("--compilers", help="comma list of gcc,clang (default: both on x86-64, gcc elsewhere)")
    parser.add_argument("--opts", help="comma list of O0,O2,O3 (default: all on x86-64, O0,O2 elsewhere)")
    parser.add_argument("--pie", help="comma list of pie,nopie (default: both on x86-64, pie elsewhere)")
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

    arch = ARCHES[args.arch]
    # Fill the arch's defaults back into args, so reports can print the subset actually built.
    args.compilers = args.compilers or ",".join(arch.compilers)
    args.opts = args.opts or ",".join(arch.opts)
    args.pie = args.pie or ",".join(arch.pies)
    return matrix(
        pick(args.programs, PROGRAMS, "program"),
        pick(args.compilers, arch.compilers, f"compiler for {args.arch}"),
        pick(args.opts, OPTS, "optimisation"),
        pick(args.pie, PIES, "PIE mode"),
        pick(args.unwind, UNWINDS, "unwind mode"),
        args.arch,
    )


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Build the benchmark corpus (all or a subset).")
    add_subset_args(ap)
    a = ap.parse_args()
    t = time.monotonic()
    bins = build_all(a.workdir, variants_from_args(a), a.jobs)
    log(f"{len(bins)} binaries ready in {a.workdir / 'bin'} ({time.monotonic() - t:.0f}s)")
