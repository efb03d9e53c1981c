"""Why a tool misses: the false and missed function starts of one tool, sorted into categories.

Reads the cached results of accuracy.py (run it first) and looks at each miss in the *unstripped*
build with the target's binutils (`<triple>-objdump -d`, `readelf -r`), which the tool never saw:

false starts (predicted, not a true function start)
  misaligned            not on an instruction boundary of the architecture (a data word taken as a pointer)
  between functions     in no true function's [start, start+size): padding, crt code, literal pools
  label in data         inside a function, and the address (or its Thumb form) is stored in data or a
                        RELATIVE relocation: computed-goto tables, switch tables of absolute addresses
  after a call          inside a function, right after a call (after its delay slot on MIPS): the
                        callee was taken as not returning
  branch target         inside a function, target of a direct branch in the code (loop head, case label)
  other inside          inside a function, none of the above (e.g. a relative jump-table case)

missed starts (a true function start not predicted)
  called by a found fn  a direct call in a function the tool found targets it
  called by missed code direct calls target it, but only from code the tool did not find as functions
  tail-branched only    only direct (non-call) branches reach it: tail calls
  address in code       no direct call or branch, but code forms its address (AArch64 `adr`/`adrp`+`add`,
                        objdump's `# addr <sym>` comments: RISC-V `auipc`+`addi`): callbacks
  address in data       no direct call or branch, but its address is in data or a relocation (GOT,
                        function-pointer tables, callbacks)
  unreferenced          none of these: exported or dead code that nothing in the image reaches (or whose
                        address is formed in a way this script does not follow: ARM/PPC/MIPS PC-relative)

    .venv/bin/python bench/misses.py --arch aarch64 --unwind noeh [--examples 5]
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
from bisect import bisect_right
from collections import Counter, defaultdict
from pathlib import Path

import builds
import tools
from elfsyms import _sections
from metrics import Score, in_ranges, score

CALLS = {"bl", "blx", "blr", "jal", "jalr", "bal", "jalx", "call", "bla", "bctrl", "blrl"}
ALIGN = {"x86-64": 1, "i386": 1, "aarch64": 4, "arm": 2, "mips": 4, "ppc": 4, "ppc64le": 4, "riscv64": 2}
SHF_ALLOC, SHF_EXECINSTR, SHT_NOBITS = 0x2, 0x4, 8

FP_CATEGORIES = ("misaligned", "between functions", "label in data", "after a call", "branch target", "other inside")
FN_CATEGORIES = (
    "called by a found fn",
    "called by missed code",
    "tail-branched only",
    "address in code",
    "address in data",
    "unreferenced",
)


def _tool(arch: str, name: str) -> str:
    return builds.ARCHES[arch].tool(name)


def sized_functions(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, name) of the sized FUNC symbols (Thumb bit cleared), sorted."""
    text = subprocess.run(["readelf", "-sW", str(path)], capture_output=True, text=True, check=True).stdout
    thumb = (
        "ARM"
        in subprocess.run(["readelf", "-h", str(path)], capture_output=True, text=True)
        .stdout.split("Machine:")[1]
        .split("\n")[0]
    )
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*\d+:\s+([0-9a-f]+)\s+(\S+)\s+(?:FUNC|IFUNC)\s+\w+\s+\w+\s+(\d+)\s+(\S+)", line)
        if not m:
            continue
        start, size = int(m.group(1), 16), int(m.group(2), 0)
        if thumb:
            start &= ~1
        if size:
            out[start] = (start, start + size, m.group(4))
    return sorted(out.values())


def disassembly(arch: str, path: Path) -> tuple[list[int], dict[int, str], dict[int, list[tuple[int, bool]]], set[int]]:
    """Instruction addresses (sorted), mnemonic by address, direct branch targets (target -> [(source,
    is_call)]) and the addresses code forms without branching there."""
    proc = subprocess.run(
        [_tool(arch, "objdump"), "-d", "-w", "--no-show-raw-insn", str(path)], capture_output=True, text=True
    )
    addrs: list[int] = []
    mnem: dict[int, str] = {}
    targets: dict[int, list[tuple[int, bool]]] = defaultdict(list)
    line_re = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
    target_re = re.compile(r"(?:^|[\s,])([0-9a-f]+) <[^>]+>")
    formed: set[int] = set()
    pages: dict[str, int] = {}  # AArch64: register -> page from the last adrp
    for line in proc.stdout.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        addr, op, rest = int(m.group(1), 16), m.group(2), m.group(3)
        addrs.append(addr)
        mnem[addr] = op
        t = target_re.search(rest)
        ops = [x.strip() for x in rest.split("//")[0].split(",")]
        if op == "adrp" and t:
            pages[ops[0]] = int(t.group(1), 16)
            continue
        if op == "add" and len(ops) == 3 and ops[1] in pages and ops[2].startswith("#"):
            formed.add(pages[ops[1]] + int(ops[2][1:], 0))
            continue
        if t and (op == "adr" or "#" in rest[: t.start()]):
            formed.add(int(t.group(1), 16))
            continue
        if t:
            base = op.split(".")[0]
            is_call = base in CALLS or (op == "jal" and not rest.startswith("zero"))
            targets[int(t.group(1), 16)].append((addr, is_call))
    return addrs, mnem, targets, formed


def data_words(path: Path) -> set[int]:
    """Every aligned pointer-sized word of the allocated, non-executable sections, plus the addends of
    RELATIVE relocations (where RELA targets keep the pointer)."""
    data = path.read_bytes()
    secs, end, is64 = _sections(data)
    size, fmt = (8, "Q") if is64 else (4, "I")
    words: set[int] = set()
    for s in secs:
        if not s["flags"] & SHF_ALLOC or s["flags"] & SHF_EXECINSTR or s["type"] == SHT_NOBITS or not s["size"]:
            continue
        chunk = data[s["offset"] : s["offset"] + s["size"]]
        n = len(chunk) // size
        words.update(struct.unpack_from(f"{end}{n}{fmt}", chunk, 0))
    rel = subprocess.run(["readelf", "-rW", str(path)], capture_output=True, text=True).stdout
    for line in rel.splitlines():
        if "RELATIVE" in line:
            last = line.split()[-1]
            if re.fullmatch(r"[0-9a-f]+", last):
                words.add(int(last, 16))
    return words


def classify(arch: str, binary: builds.Binary, starts: list[int]) -> tuple[dict[str, list], dict[str, list]]:
    """Category -> [(address, description)] for the false and the missed starts of one run."""
    truth = binary.truth()
    neutral = binary.neutral()
    scope = sorted(binary.scope())
    funcs = sized_functions(binary.unstripped)
    fstarts = [f[0] for f in funcs]
    addrs, mnem, targets, formed = disassembly(arch, binary.unstripped)
    index = {a: i for i, a in enumerate(addrs)}
    words = data_words(binary.unstripped)
    align = ALIGN[arch]

    def containing(addr: int) -> tuple[int, int, str] | None:
        i = bisect_right(fstarts, addr) - 1
        return funcs[i] if i >= 0 and funcs[i][0] <= addr < funcs[i][1] else None

    def in_data(addr: int) -> bool:
        return addr in words or (arch == "arm" and addr | 1 in words)

    def after_call(addr: int) -> bool:
        i = index.get(addr)
        if i is None:
            return False
        back = (1, 2) if arch == "mips" else (1,)  # MIPS: the call, then its delay slot
        return any(i - k >= 0 and mnem[addrs[i - k]].split(".")[0] in CALLS for k in back)

    found = set(starts)
    fps: dict[str, list] = defaultdict(list)
    for a in sorted(found):
        if a in truth or a in neutral or not in_ranges(a, scope):
            continue
        f = containing(a)
        where = f"{f[2]}+{a - f[0]:#x}" if f else f"{a:#x}"
        if a % align:
            cat = "misaligned"
        elif f is None:
            cat = "between functions"
        elif in_data(a):
            cat = "label in data"
        elif after_call(a):
            cat = "after a call"
        elif any(f[0] <= src < f[1] for src, _ in targets.get(a, ())):
            cat = "branch target"
        else:
            cat = "other inside"
        fps[cat].append((a, where))
    fns: dict[str, list] = defaultdict(list)
    for a, name in sorted(truth.items()):
        if a in found:
            continue
        refs = targets.get(a, [])
        callers = [containing(src) for src, c in refs if c]
        if any(f is not None and f[0] in found for f in callers):
            cat = "called by a found fn"
        elif callers:
            cat = "called by missed code"
        elif refs:
            cat = "tail-branched only"
        elif a in formed or (arch == "arm" and a | 1 in formed):
            cat = "address in code"
        elif in_data(a):
            cat = "address in data"
        else:
            cat = "unreferenced"
        fns[cat].append((a, name))
    return fps, fns


def main() -> int:
    """Classify the misses of one tool over a subset of the corpus; print Markdown tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    builds.add_subset_args(ap)
    ap.add_argument("--tool", default="binlens")
    ap.add_argument("--examples", type=int, default=3, help="examples per category and binary group")
    args = ap.parse_args()
    variants = builds.variants_from_args(args)
    workdir = args.workdir.resolve()
    totals: dict[tuple[str, str], Counter] = defaultdict(Counter)
    examples: dict[tuple[str, str], list[str]] = defaultdict(list)
    current = tools.tool_version(args.tool, workdir)
    stale: list[str] = []
    for v in variants:
        binary = builds.build(workdir, v)
        cache = workdir / "results" / "accuracy" / args.tool / f"{v.name}.json"
        if not cache.is_file():
            builds.log(f"no cached {args.tool} result for {v.name}: run accuracy.py first")
            continue
        cached = json.loads(cache.read_text())
        if cached.get("version") != current:
            stale.append(v.name)
        starts = cached["run"]["starts"]
        fps, fns = classify(args.arch, binary, starts)
        for kind, cats in (("false", fps), ("missed", fns)):
            for cat, items in cats.items():
                totals[(kind, v.unwind)][cat] += len(items)
                ex = examples[(kind, cat)]
                for a, what in items[: args.examples]:
                    if len(ex) < args.examples * 4:
                        ex.append(f"{v.name} {a:#x} {what}")
    if stale:
        builds.log(
            f"{len(stale)} cached results are of another {args.tool} than {current} "
            f"(e.g. {stale[0]}): run accuracy.py again to classify this one's misses"
        )
    unwinds = sorted({v.unwind for v in variants})
    if args.arch == "arm":
        raw, even = Score(), Score()
        for v in variants:
            cache = workdir / "results" / "accuracy" / args.tool / f"{v.name}.json"
            if cache.is_file():
                b = builds.build(workdir, v)
                starts = json.loads(cache.read_text())["run"]["starts"]
                raw += score(b.truth(), starts, b.scope(), b.neutral())
                even += score(b.truth(), {a & ~1 for a in starts}, b.scope(), b.neutral())
        print(f"ARM, {args.tool} as reported: P/R/F1 {raw.precision:.3f} / {raw.recall:.3f} / {raw.f1:.3f}; ")
        print(f"with bit 0 (Thumb) of every start cleared: {even.precision:.3f} / {even.recall:.3f} / {even.f1:.3f}\n")
    for kind, cats in (("false", FP_CATEGORIES), ("missed", FN_CATEGORIES)):
        print(f"| {args.tool} {kind} starts ({args.arch}) | " + " | ".join(unwinds) + " |")
        print("|---|" + "---:|" * len(unwinds))
        for cat in cats:
            print(f"| {cat} | " + " | ".join(str(totals[(kind, u)][cat]) for u in unwinds) + " |")
        print()
    for (kind, cat), ex in sorted(examples.items()):
        print(f"{kind} / {cat}: " + "; ".join(ex))
    return 0


if __name__ == "__main__":
    sys.exit(main())
