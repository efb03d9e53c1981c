"""Header-table mutants: corrupt section and segment tables of a few files, load and analyse each.

For every input file (ELF, PE or thin Mach-O) it finds the header fields that place sections and
segments (addresses, sizes, file offsets, permissions, counts) and writes seeded mutants, each with
one to three fields (`--most`) set to an odd value: zero, all ones, just below 2**64 (or 2**32),
past the end of the file, or a neighbour's value (overlaps); one in twenty is also truncated.
Each mutant is parsed and analysed in a forked child, as the analysis process does
(`jobs.child.analyse_and_save`, saved to a scratch database), under a time and memory limit.
The outcome of each is one of:

- `ok`: analysed and saved;
- `error:CODE`: refused with a clean error (a `BinlensError` that is not `internal`);
- `crash:TYPE`: any other exception, or an `internal` error (the traceback goes to the log);
- `hang` / `died`: past the time limit / killed (memory limit, signal).

Usage: `python bench/header_mutants.py [--seed N] [--count N] [--timeout S] [--log FILE] [--keep DIR] FILE...`
(default: 100 mutants a file, seed 1; `--keep` copies the failing mutants to DIR, and `--as-is`
runs such files again, unmutated). Prints one summary line a file and the totals; exits 1 when
any mutant crashed, hung or died.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import resource
import select
import signal
import struct
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


@dataclass(frozen=True)
class Field:
    """One header field: where it is, how wide, and which table entry and role it has."""

    offset: int
    size: int  # bytes: 2, 4 or 8
    entry: str  # "shdr3", "phdr1", "sect2", ...: fields of one entry share it
    role: str  # "addr", "size", "off", "fsize", "flags", "count", ...


def elf_fields(data: bytes) -> tuple[list[Field], str]:
    """The placement fields of an ELF file's header, program and section headers."""
    is64, order = data[4] == 2, "<" if data[5] == 1 else ">"
    w = 8 if is64 else 4
    hdr = struct.unpack_from(order + ("HHIQQQIHHHHHH" if is64 else "HHIIIIIHHHHHH"), data, 16)
    _t, _m, _v, _entry, phoff, shoff, _fl, _eh, phentsize, phnum, shentsize, shnum, _shstr = hdr
    out = []
    base = 0x18 if is64 else 0x18
    out.append(Field(base + w, w, "ehdr", "phoff"))
    out.append(Field(base + 2 * w, w, "ehdr", "shoff"))
    tail = base + 3 * w + 4 + 2  # e_flags, e_ehsize
    out += [Field(tail + 2, 2, "ehdr", "count"), Field(tail + 6, 2, "ehdr", "count")]  # e_phnum, e_shnum
    ph = {"type": (0, 4), "flags": (4, 4), "off": (8, 8), "addr": (16, 8), "fsize": (32, 8), "size": (40, 8)}
    if not is64:
        ph = {"type": (0, 4), "off": (4, 4), "addr": (8, 4), "fsize": (16, 4), "size": (20, 4), "flags": (24, 4)}
    for i in range(min(phnum, 64)):
        at = phoff + i * phentsize
        if at + phentsize > len(data):
            break
        out += [Field(at + o, n, f"phdr{i}", role) for role, (o, n) in ph.items()]
    sh = {"type": (4, 4), "flags": (8, w), "addr": (8 + w, w), "off": (8 + 2 * w, w), "size": (8 + 3 * w, w)}
    for i in range(min(shnum, 256)):
        at = shoff + i * shentsize
        if at + shentsize > len(data) or shentsize < 8 + 4 * w:
            break
        out += [Field(at + o, n, f"shdr{i}", role) for role, (o, n) in sh.items()]
    return out, order


def pe_fields(data: bytes) -> tuple[list[Field], str]:
    """The placement fields of a PE file's headers and section table."""
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    coff = pe + 4
    nsec, optsize = struct.unpack_from("<H", data, coff + 2)[0], struct.unpack_from("<H", data, coff + 16)[0]
    opt = coff + 20
    plus = struct.unpack_from("<H", data, opt)[0] == 0x20B
    out = [Field(coff + 2, 2, "coff", "count"), Field(opt + 16, 4, "opt", "addr")]  # sections, entry point
    out += [Field(opt + 24, 8, "opt", "addr")] if plus else [Field(opt + 28, 4, "opt", "addr")]  # image base
    out += [Field(opt + 56, 4, "opt", "size"), Field(opt + 60, 4, "opt", "size")]  # SizeOfImage, SizeOfHeaders
    dirs = opt + (112 if plus else 96)
    for i in range(16):
        if dirs + 8 * i + 8 <= opt + optsize:
            out += [Field(dirs + 8 * i, 4, f"dir{i}", "addr"), Field(dirs + 8 * i + 4, 4, f"dir{i}", "size")]
    table = opt + optsize
    roles = {"size": 8, "addr": 12, "fsize": 16, "off": 20, "flags": 36}
    for i in range(min(nsec, 96)):
        at = table + 40 * i
        if at + 40 > len(data):
            break
        out += [Field(at + o, 4, f"sect{i}", role) for role, o in roles.items()]
    return out, "<"


def macho_fields(data: bytes) -> tuple[list[Field], str]:
    """The placement fields of a thin Mach-O file's segment and section commands."""
    magic = struct.unpack_from("<I", data, 0)[0]
    order = "<" if magic in (0xFEEDFACE, 0xFEEDFACF) else ">"
    is64 = struct.unpack_from(order + "I", data, 0)[0] == 0xFEEDFACF
    ncmds = struct.unpack_from(order + "I", data, 16)[0]
    at = 32 if is64 else 28
    out = [Field(16, 4, "mach", "count")]
    for i in range(min(ncmds, 256)):
        if at + 8 > len(data):
            break
        cmd, size = struct.unpack_from(order + "II", data, at)
        if cmd in (0x19, 0x1):
            w = 8 if cmd == 0x19 else 4
            seg = {"addr": 24, "size": 24 + w, "off": 24 + 2 * w, "fsize": 24 + 3 * w}
            out += [Field(at + o, w, f"seg{i}", role) for role, o in seg.items()]
            out += [Field(at + 24 + 4 * w + 4, 4, f"seg{i}", "flags")]  # initprot
            nsects = struct.unpack_from(order + "I", data, at + 24 + 4 * w + 8)[0]
            sec_at = at + 24 + 4 * w + 16
            for j in range(min(nsects, 64)):
                s = sec_at + j * (80 if w == 8 else 68)
                if s + 48 > len(data):
                    break
                out += [
                    Field(s + 32, w, f"sec{i}.{j}", "addr"),
                    Field(s + 32 + w, w, f"sec{i}.{j}", "size"),
                    Field(s + 32 + 2 * w, 4, f"sec{i}.{j}", "off"),
                ]
        if size < 8:
            break
        at += size
    return out, order


def fields_of(data: bytes) -> tuple[list[Field], str]:
    """The placement fields of `data`, by its format."""
    if data[:4] == b"\x7fELF":
        return elf_fields(data)
    if data[:2] == b"MZ":
        return pe_fields(data)
    if data[:4] in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xfe\xed\xfa\xce"):
        return macho_fields(data)
    raise SystemExit("not an ELF, PE or thin Mach-O file")


def odd_value(rng: random.Random, f: Field, fields: list[Field], data: bytes, order: str) -> int:
    """An odd value for `f`: an edge, past the file, or a neighbour's (an overlap)."""
    top = (1 << (8 * f.size)) - 1
    cur = int.from_bytes(data[f.offset : f.offset + f.size], "little" if order == "<" else "big")
    same = [g for g in fields if g.role == f.role and g.entry != f.entry and g.size == f.size]
    pick = rng.randrange(12)
    if pick == 0:
        return 0
    if pick == 1:
        return top
    if pick == 2:
        return top - rng.randrange(1, 0x2000)
    if pick == 3:
        return 1 << (8 * f.size - 1)
    if pick == 4:
        return min(top, len(data) + rng.randrange(0, 0x100000))
    if pick == 5:
        return min(top, cur * rng.choice((2, 16, 4096)) + 1)
    if pick == 6:
        return max(0, cur - rng.randrange(1, 0x1000))
    if pick == 7:
        return min(top, cur + rng.randrange(1, 0x1000))
    if pick in (8, 9) and same:
        g = rng.choice(same)
        other = int.from_bytes(data[g.offset : g.offset + g.size], "little" if order == "<" else "big")
        return max(0, min(top, other + rng.choice((0, 0, 1, -1, 0x10, -0x10))))
    if pick == 10:
        return rng.randrange(0, 0x100)
    return rng.getrandbits(8 * f.size)


def mutant(rng: random.Random, data: bytes, fields: list[Field], order: str, most: int = 3) -> tuple[bytes, list[str]]:
    """`data` with one to `most` fields set to odd values (one most often), and what was changed."""
    out = bytearray(data)
    what = []
    for f in rng.sample(fields, min(len(fields), rng.choice((1, *range(1, most + 1))))):
        v = odd_value(rng, f, fields, bytes(out), order)
        out[f.offset : f.offset + f.size] = v.to_bytes(f.size, "little" if order == "<" else "big")
        what.append(f"{f.entry}.{f.role}@{f.offset:#x}={v:#x}")
    if rng.randrange(20) == 0:  # a truncation now and then
        cut = rng.randrange(len(out) // 2, len(out))
        del out[cut:]
        what.append(f"truncated@{cut:#x}")
    return bytes(out), what


def _child(path: str, db: str, wfd: int, memory: int) -> None:
    """Analyse `path` as the analysis process does; write (outcome, detail) to `wfd`."""
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    from binlens.errors import BinlensError
    from binlens.jobs.child import analyse_and_save
    from binlens.jobs.request import AnalysisRequest

    try:
        with open(path, "rb") as fh:
            data = fh.read()
        analyse_and_save(AnalysisRequest(path, "", db, data=data), lambda frame: None)
        result = ("ok", "")
    except BinlensError as err:
        result = ("crash:internal", err.message) if err.code == "internal" else (f"error:{err.code}", err.message)
    except BaseException as err:  # noqa: BLE001 - what the bench counts
        result = (f"crash:{type(err).__name__}", traceback.format_exc(limit=-6))
    os.write(wfd, pickle.dumps(result))
    os.close(wfd)


def run_one(path: str, db: str, timeout: float, memory: int) -> tuple[str, str]:
    """(outcome, detail) of one mutant, in a forked child."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        os.setsid()  # (the parser's children go with it when it is killed)
        try:
            _child(path, db, wfd, memory)
        finally:
            os._exit(0)
    os.close(wfd)
    deadline = time.monotonic() + timeout
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rfd)
            return "hang", f"past {timeout:g} s"
        ready, _, _ = select.select([rfd], [], [], left)
        if ready:
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return "died", f"status {status}"
    return pickle.loads(b"".join(chunks))  # noqa: S301 - our own child's answer


def main() -> int:
    """Run the mutants; print a line per file and the totals."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100, help="mutants per file")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant")
    ap.add_argument("--memory-mib", type=int, default=4096, help="address-space limit per mutant")
    ap.add_argument("--log", default=None, help="write every mutant's outcome and traceback here")
    ap.add_argument("--keep", default=None, help="copy the failing mutants into this folder")
    ap.add_argument("--most", type=int, default=3, help="fields changed in a mutant at most")
    ap.add_argument("--as-is", action="store_true", help="run the files themselves (kept mutants, say), unmutated")
    args = ap.parse_args()
    os.environ["BINLENS_SERIAL"] = "1"
    import binlens.analysis  # noqa: F401 - once, before the forks
    import binlens.jobs.child  # noqa: F401
    import binlens.loader.parse_lief  # noqa: F401

    log = open(args.log, "w") if args.log else None  # noqa: SIM115 - closed at the end
    totals: dict[str, int] = {}
    bad = 0
    with tempfile.TemporaryDirectory(prefix="binlens-mutants-") as tmp:
        for path in args.files:
            data = Path(path).read_bytes()
            fields, order = ([], "<") if args.as_is else fields_of(data)
            rng = random.Random(f"{args.seed}:{Path(path).name}")
            counts: dict[str, int] = {}
            for k in range(1 if args.as_is else args.count):
                blob, what = (data, ["as is"]) if args.as_is else mutant(rng, data, fields, order, args.most)
                name = f"{Path(path).name}.m{k}"
                mpath = os.path.join(tmp, name)
                Path(mpath).write_bytes(blob)
                db = os.path.join(tmp, "db.sqlite")
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(db + suffix):
                        os.unlink(db + suffix)
                t = time.monotonic()
                outcome, detail = run_one(mpath, db, args.timeout, args.memory_mib << 20)
                took = time.monotonic() - t
                kind = outcome.split(":")[0]
                counts[kind] = counts.get(kind, 0) + 1
                totals[kind] = totals.get(kind, 0) + 1
                if kind in ("crash", "hang", "died"):
                    bad += 1
                    if args.keep:
                        Path(args.keep).mkdir(parents=True, exist_ok=True)
                        Path(args.keep, name).write_bytes(blob)
                if log:
                    print(f"{name}\t{outcome}\t{took:.1f}s\t{' '.join(what)}", file=log)
                    if kind != "ok" and detail:
                        print("    " + detail.strip().replace("\n", "\n    "), file=log)
                    log.flush()
            if not args.as_is:
                print(f"{Path(path).name}: {args.count} mutants, {len(fields)} fields: {counts}", flush=True)
    print(f"total: {sum(totals.values())} mutants: {totals}")
    if log:
        log.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
