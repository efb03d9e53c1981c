"""compare.* and signature.apply against ground truth from symbols (docs/BENCHMARKS.md, "Compare").

The benchmark builds everything itself from PyPI sdists that bundle a C library (lz4, Brotli,
zstd; fetched once with `pip download` into --cache) and from the system's libc.a:

  (a) two releases of each library, same compiler and flags (gcc -O2 -fPIC, shared): the old build
      with symbols against the new one stripped;
  (b) one release against itself built -O3, and built by clang (each side stripped on the right);
  (c) a statically linked stripped executable (a driver + the new library + libc.a) named by
      signature.apply against the unstripped library and an unstripped static hello world (libc).

Truth: the unstripped build's function symbols at the same addresses (stripping moves no code).
A matched pair counts when both sides have a symbol (PLT thunks and unnamed code are left out):
precision = right pairs / counted pairs; recall = right pairs / names that are functions of both
builds. Port: the names compare.port_annotations copies to the stripped build, checked the same
way. Time: compare.programs after both analyses (fingerprints included, computed on first use).

    PYTHONPATH=src python bench/compare.py [--cache DIR] [--only lz4,brotli,zstd] [--mismatches]
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Library:
    name: str
    pypi: str
    releases: tuple[str, str]
    sources: tuple[str, ...]  # globs under the sdist's folder
    includes: tuple[str, ...]
    driver: str  # C code that calls into it (for the static executable)


LIBRARIES = (
    Library(
        "lz4",
        "lz4",
        ("4.0.0", "4.3.3"),
        ("lz4libs/*.c",),
        ("lz4libs",),
        '#include "lz4.h"\n#include "lz4hc.h"\n#include "lz4frame.h"\n'
        "int main(int c, char **v) { char o[4096]; int n = LZ4_compress_HC(v[0], o, 5, 4096, 9);"
        " size_t f = LZ4F_compressFrameBound(c, 0); return n + LZ4_compress_default(v[0], o, 5, 4096) + (int)f; }\n",
    ),
    Library(
        "brotli",
        "Brotli",
        ("1.0.9", "1.1.0"),
        ("c/common/*.c", "c/dec/*.c", "c/enc/*.c"),
        ("c/include",),
        "#include <brotli/encode.h>\n#include <brotli/decode.h>\n"
        "int main(int c, char **v) { unsigned char o[4096]; size_t n = sizeof o;"
        " BrotliEncoderCompress(5, 22, 0, 5, (const unsigned char *)v[0], &n, o); size_t m = 4096;"
        " unsigned char d[4096]; return (int)BrotliDecoderDecompress(n, o, &m, d) + c; }\n",
    ),
    Library(
        "zstd",
        "zstandard",
        ("0.19.0", "0.22.0"),
        ("zstd/zstdlib.c", "zstd/zstd.c"),  # (the sdists bundle zstd as one file)
        ("zstd",),
        '#include "zstd.h"\n'
        "int main(int c, char **v) { char o[4096]; size_t n = ZSTD_compress(o, 4096, v[0], 5, c);"
        " char d[64]; return (int)ZSTD_decompress(d, 64, o, n); }\n",
    ),
)


def sh(*args: str, cwd: Path | None = None) -> None:
    subprocess.run(args, check=True, cwd=cwd, capture_output=True)


def fetch(lib: Library, release: str, cache: Path) -> Path:
    """The unpacked sdist of one release (downloaded with pip once)."""
    folder = cache / f"{lib.pypi}-{release}"
    if folder.is_dir():
        return folder
    cache.mkdir(parents=True, exist_ok=True)

    def archives() -> list[str]:
        return [
            f
            for f in glob.glob(str(cache / f"*-{release}.*"))
            if Path(f).name.lower().startswith(lib.pypi.lower() + "-") and f.endswith((".tar.gz", ".zip"))
        ]

    found = archives()
    if not found:
        spec = f"{lib.pypi}=={release}"
        sh(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", spec, "-d", str(cache))
        found = archives()
    if found[0].endswith(".zip"):
        with zipfile.ZipFile(found[0]) as z:
            z.extractall(cache)
    else:
        with tarfile.open(found[0]) as tar:
            tar.extractall(cache, filter="data")
    return folder if folder.is_dir() else Path(glob.glob(str(cache / f"{lib.pypi.lower()}-{release}"))[0])


def sources(root: Path, lib: Library) -> list[str]:
    return sorted(f for pattern in lib.sources for f in glob.glob(str(root / pattern)))


def build_shared(root: Path, lib: Library, out: Path, cc: str = "gcc", opt: str = "-O2") -> tuple[Path, Path]:
    """(unstripped, stripped) shared library of the sdist's C sources."""
    if not out.exists():
        incs = [f"-I{root / i}" for i in lib.includes]
        sh(cc, opt, "-shared", "-fPIC", "-w", "-DXXH_NAMESPACE=LZ4_", *incs, "-o", str(out), *sources(root, lib))
    stripped = out.with_name(out.name + "-stripped")
    if not stripped.exists():
        sh("strip", "-s", "-o", str(stripped), str(out))
    return out, stripped


def build_static(root: Path, lib: Library, out: Path) -> tuple[Path, Path]:
    """(unstripped, stripped) static executable: the driver, every object of the library, libc.a."""
    if not out.exists():
        driver = out.with_name(out.name + ".c")
        driver.write_text(lib.driver)
        incs = [f"-I{root / i}" for i in lib.includes]
        sh(
            "gcc",
            "-O2",
            "-static",
            "-w",
            "-DXXH_NAMESPACE=LZ4_",
            *incs,
            "-o",
            str(out),
            str(driver),
            *sources(root, lib),
            "-lm",
        )
    stripped = out.with_name(out.name + "-stripped")
    if not stripped.exists():
        sh("strip", "-s", "-o", str(stripped), str(out))
    return out, stripped


def symbols(path: Path) -> dict[int, set[str]]:
    """Function symbols by address (every alias), without gcc's clone suffixes (`.constprop.0`,
    `.isra.0`, `.part.0`, `.cold`): a clone is its source function, whatever the compiler made of it."""
    out: dict[int, set[str]] = {}
    text = subprocess.run(["nm", "--defined-only", str(path)], capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWi":
            out.setdefault(int(parts[0], 16), set()).add(parts[2].split(".", 1)[0])
    return out


class Bench:
    def __init__(self, home: Path) -> None:
        from binlens.api import invoke
        from binlens.workspace import Config, Workspace

        self.ws = Workspace(Config(home=home))
        self.invoke: Callable[..., Any] = lambda m, p: invoke(self.ws, m, p, max_response_bytes=1 << 30)
        self.mismatches: list[str] = []  # the last case's wrong and missed names (--mismatches)

    def analysed(self, path: Path) -> str:
        h = self.invoke("program.open", {"path": str(path)})["identity"]["program"]
        self.invoke("analysis.start", {"program": h, "wait": True, "timeout_ms": 3600000})
        return str(h)

    def functions(self, handle: str) -> set[int]:
        out: set[int] = set()
        cursor = None
        while True:
            page = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
            r = self.invoke("function.list", {"program": handle, "page": page})
            out |= {int(f["address"], 16) for f in r["items"]}
            cursor = r["next_cursor"]
            if not cursor:
                return out

    def compare(self, old: Path, new_truth: Path, new: Path, old_truth: Path | None = None) -> dict[str, Any]:
        """Match `old` (truth: `old_truth` or its own symbols) against stripped `new` (truth: `new_truth`)."""
        lh, rh = self.analysed(old), self.analysed(new)
        t0 = time.monotonic()
        matched: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
            r = self.invoke("compare.programs", {"left": lh, "right": rh, "page": page})
            matched += r["matched"]
            cursor = r["next_cursor"]
            if not cursor:
                break
        seconds = time.monotonic() - t0
        lt, rt = symbols(old_truth or old), symbols(new_truth)
        lf, rf = self.functions(lh), self.functions(rh)
        lnames = {n: a for a, ns in lt.items() if a in lf for n in ns}
        rnames = {n: a for a, ns in rt.items() if a in rf for n in ns}
        common = {n for n in lnames if n in rnames}
        counted = right = 0
        wrong = []
        for m in matched:
            la, ra = int(m["left"]["address"], 16), int(m["right"]["address"], 16)
            if la in lt and ra in rt:
                counted += 1
                right += bool(lt[la] & rt[ra])
                if not lt[la] & rt[ra]:
                    wrong.append(f"wrong {sorted(lt[la])} -> {sorted(rt[ra])} {m['step']} {m['similarity']:.3f}")
        pairs = {(lnames[n], rnames[n]) for n in common}
        found = {(int(m["left"]["address"], 16), int(m["right"]["address"], 16)) for m in matched}
        wrong += [f"missed {n}" for n in sorted(common) if (lnames[n], rnames[n]) not in found]
        self.mismatches = wrong
        return {
            "left_functions": len(lf),
            "right_functions": len(rf),
            "matched": len(matched),
            "changed": sum(1 for m in matched if m["kind"] == "changed"),
            "precision": right / counted if counted else 1.0,
            "recall": right / len(pairs) if pairs else 1.0,
            "seconds": seconds,
            "handles": (lh, rh),
            "truth": (lt, rt),
        }

    def port(self, lh: str, rh: str, rt: dict[int, set[str]]) -> tuple[int, float]:
        r = self.invoke("compare.port_annotations", {"from": lh, "to": rh, "kinds": ["names"]})
        names = [e for e in r["copied"] if e["kind"] == "name"]
        right = sum(1 for e in names if e["value"].split(".", 1)[0] in rt.get(int(e["target"], 16), ()))
        self.invoke("journal.undo", {"program": rh, "count": 1})
        return len(names), right / len(names) if names else 1.0

    def signature(self, target: Path, truth: Path, references: list[Path]) -> dict[str, Any]:
        th = self.analysed(target)
        refs = [self.analysed(p) for p in references]
        t0 = time.monotonic()
        r = self.invoke("signature.apply", {"program": th, "references": refs})
        seconds = time.monotonic() - t0
        self.invoke("journal.undo", {"program": th, "count": 1})
        tt = symbols(truth)
        ref_names = {n for p in references for ns in symbols(p).values() for n in ns} | {"main"}
        tf = self.functions(th)
        nameable = {a for a, ns in tt.items() if a in tf and ns & ref_names}
        right = sum(1 for n in r["named"] if n["name"].split(".", 1)[0] in tt.get(int(n["address"], 16), ()))
        got = {int(n["address"], 16) for n in r["named"]}
        self.mismatches = [
            f"wrong {n['name']} at {n['address']} (is {sorted(tt.get(int(n['address'], 16), ()))}) {n['step']}"
            for n in r["named"]
            if n["name"].split(".", 1)[0] not in tt.get(int(n["address"], 16), ())
        ] + [f"missed {sorted(tt[a] & ref_names)} at {a:#x}" for a in sorted(nameable - got)]
        named = len(r["named"])
        main = next((a for a, ns in tt.items() if "main" in ns), None)
        got_main = any(n["name"] == "main" and int(n["address"], 16) == main for n in r["named"])
        return {
            "functions": len(tf),
            "nameable": len(nameable),
            "named": named,
            "precision": right / named if named else 1.0,
            "recall": right / len(nameable) if nameable else 1.0,
            "main": got_main,
            "seconds": seconds,
        }


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "binlens-bench-compare",
    )
    ap.add_argument("--only", default="", help="comma-separated library names")
    ap.add_argument("--mismatches", action="store_true", help="list each case's wrong and missed names on stderr")
    ap.add_argument(
        "--libc", action="store_true", help="also time compare.programs of libc.so.6 against a static executable"
    )
    args = ap.parse_args()
    only = {x for x in args.only.split(",") if x}
    home = Path(tempfile.mkdtemp(prefix="binlens-bench-compare-"))
    bench = Bench(home)
    build = args.cache / "build"
    build.mkdir(parents=True, exist_ok=True)
    has_clang = shutil.which("clang") is not None
    print(
        row(
            [
                "case",
                "functions (old/new)",
                "matched",
                "changed",
                "precision",
                "recall",
                "port names",
                "port precision",
                "compare s",
            ]
        )
    )
    print(row(["---"] * 9))
    sig_rows = []
    try:
        for lib in LIBRARIES:
            if only and lib.name not in only:
                continue
            old_root, new_root = (fetch(lib, r, args.cache) for r in lib.releases)
            old, _ = build_shared(old_root, lib, build / f"{lib.name}-{lib.releases[0]}-gcc-O2.so")
            new, new_s = build_shared(new_root, lib, build / f"{lib.name}-{lib.releases[1]}-gcc-O2.so")
            cases = [(f"(a) {lib.name} {lib.releases[0]} → {lib.releases[1]}", old, new, new_s)]
            o3, o3_s = build_shared(new_root, lib, build / f"{lib.name}-{lib.releases[1]}-gcc-O3.so", opt="-O3")
            cases.append((f"(b) {lib.name} {lib.releases[1]} -O2 → -O3", new, o3, o3_s))
            if has_clang:
                cl, cl_s = build_shared(new_root, lib, build / f"{lib.name}-{lib.releases[1]}-clang-O2.so", cc="clang")
                cases.append((f"(b) {lib.name} {lib.releases[1]} gcc → clang", new, cl, cl_s))
            for label, left, truth, right in cases:
                r = bench.compare(left, truth, right)
                if args.mismatches:
                    print(f"-- {label}", *bench.mismatches, sep="\n  ", file=sys.stderr)
                ported, port_p = bench.port(*r["handles"], r["truth"][1])
                print(
                    row(
                        [
                            label,
                            f"{r['left_functions']}/{r['right_functions']}",
                            str(r["matched"]),
                            str(r["changed"]),
                            f"{r['precision']:.3f}",
                            f"{r['recall']:.3f}",
                            str(ported),
                            f"{port_p:.3f}",
                            f"{r['seconds']:.2f}",
                        ]
                    ),
                    flush=True,
                )
            exe, exe_s = build_static(new_root, lib, build / f"{lib.name}-{lib.releases[1]}-static")
            hello = build / "hello-static"
            if not hello.exists():
                src = hello.with_suffix(".c")
                src.write_text(
                    "#include <stdio.h>\n#include <string.h>\n#include <stdlib.h>\n"
                    'int main(int c, char **v) { printf("%s %zu\\n", v[0], strlen(v[0])); return atoi(v[c - 1]); }\n'
                )
                sh("gcc", "-O2", "-static", "-o", str(hello), str(src))
            sig_rows.append((lib.name, bench.signature(exe_s, exe, [new, hello])))
            if args.mismatches:
                print(f"-- (c) {lib.name}", *bench.mismatches, sep="\n  ", file=sys.stderr)
        print()
        print(
            row(
                [
                    "(c) static stripped executable",
                    "functions",
                    "nameable",
                    "named",
                    "precision",
                    "recall",
                    "main",
                    "seconds",
                ]
            )
        )
        print(row(["---"] * 8))
        for name, s in sig_rows:
            print(
                row(
                    [
                        f"driver + {name} + libc.a vs lib{name}.so + static hello",
                        str(s["functions"]),
                        str(s["nameable"]),
                        str(s["named"]),
                        f"{s['precision']:.3f}",
                        f"{s['recall']:.3f}",
                        "yes" if s["main"] else "no",
                        f"{s['seconds']:.2f}",
                    ]
                )
            )
        if args.libc:
            libc = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
            hello = build / "hello-static"
            lh, rh = bench.analysed(libc), bench.analysed(hello)
            t0 = time.monotonic()
            bench.invoke("compare.programs", {"left": lh, "right": rh, "page": {"limit": 1}})
            first = time.monotonic() - t0
            prog = bench.ws.program(lh)
            prog.extensions.pop("compare.matches", None)
            t0 = time.monotonic()
            bench.invoke("compare.programs", {"left": lh, "right": rh, "page": {"limit": 1}})
            again = time.monotonic() - t0
            print(
                f"\nlibc.so.6 vs static hello: compare.programs {first:.2f} s with the fingerprints computed, "
                f"{again:.2f} s matching alone"
            )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
