"""Computed-goto dispatch tables: a table of label addresses in data that one function reads.

gcc's "labels as values" (`static void *disptab[] = {&&L_MOVE, ...}; goto *disptab[op];`, lua's
`luaV_execute` built with `LUA_USE_JUMPTABLE`) leaves a table of code addresses in data and an
indirect jump no jump-table resolver bounds. Without an unwind entry nothing says those addresses
lie inside one function, so the data-pointer heuristic took every label for a function start
(83 false starts in lua -O0 on each architecture). `goto_tables` finds such tables after the data
pointers have been looked at; the engine drops their labels as starts and lets the explorer use
the table as the case targets of the function's unresolved indirect jumps (`Explorer.gotos`).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Set

from binlens.analysis.arch.profiles import profile
from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode.backend import Backend, is_capstone
from binlens.analysis.discovery.explorer import Explorer
from binlens.analysis.model import XREF_KINDS, Body
from binlens.analysis.refs.xrefs import data_pointer_words, pointers_in_data
from binlens.loader.image import Image

# starts that are guesses: a data pointer, or a gap that starts like a function (AArch64 takes the
# label after a `br` for one when its code returns)
_GUESSES = frozenset(("pointer", "prologue"))
MIN_ENTRIES = 8  # a dispatch table names at least this many labels (lua 5.4 has 83 opcodes)


def goto_tables(
    image: Image,
    codemap: CodeMap,
    explorer: Explorer,
    backend: Backend,
    bodies: dict[int, Body],
    starts: Mapping[int, Set[str]],
) -> tuple[set[int], list[tuple[int, int, list[int]]]]:
    """(labels to drop as starts, [(function, end of its range, label addresses)]) of the computed-goto
    tables: a run of at least `MIN_ENTRIES` consecutive code pointers in data whose first word's
    address something takes (code, or a data word holding it); whose addresses all lie in the
    range of one function F (from its start to the next start with better evidence than a guess or
    a jump); whose address no code outside that range takes; where an indirect jump is left
    unresolved; and at least three quarters of whose labels taken for functions (guesses) do not
    return (handlers do; labels jump on)."""
    guessed = {va for va, src in starts.items() if src <= _GUESSES}
    if not guessed or not explorer.unresolved:
        return set(), []
    ptr = 8 if image.identity.bits == 64 else 4
    thumb_bit = profile(image.identity.arch).thumb_bit
    # A table begins at a word whose address something takes: code (directly, or by loading it from
    # a data word holding it), or at least such a word (a GOT slot: the PowerPC PIC load `lwz r9,
    # off(r30)` chunks after r30 was set is followed by no pair evaluation); it runs on over the
    # code pointers that follow. A run of function pointers inside a struct (an SQLite VFS: its
    # methods after a name and sizes) is taken by the struct's address, not its first pointer's.
    # Only a word with at least MIN_ENTRIES - 1 code pointers after it, each the next word, can begin
    # one: the others are not looked at (a dict of every code pointer in data, and a scan for the
    # words naming any of them, would be the largest transient of the analysis of gcc's cc1: ~36 MiB).
    flat = data_pointer_words(image, codemap)  # (data word, the code address it holds), by address
    words, values = flat[0::2], flat[1::2]
    n, span = len(words), (MIN_ENTRIES - 1) * ptr
    firsts = {words[k] for k in range(n - MIN_ENTRIES + 1) if words[k + MIN_ENTRIES - 1] == words[k] + span}

    def is_word(va: int) -> bool:
        k = bisect.bisect_left(words, va)
        return k < n and words[k] == va

    holder = dict(pointers_in_data(image, codemap, firsts, code=False))  # a data word naming a first word
    takers: dict[int, list[int]] = {t: [] for t in holder.values()}
    holder = {src: dst for src, dst in holder.items() if not is_word(src)}  # (a word holds itself)
    through = {XREF_KINDS.index("call"), XREF_KINDS.index("jump")}  # a call through a GOT slot takes no table
    xs = zip(backend.x_src, backend.x_dst, backend.x_kind, strict=True)
    for src, dst, kind in xs:
        table = dst if dst in firsts else holder.get(dst)
        if table is not None and kind not in through:
            takers.setdefault(table, []).append(src)
    del firsts
    runs: dict[int, list[int]] = {}  # first word -> targets
    for table in takers:
        lo = hi = bisect.bisect_left(words, table)
        while hi + 1 < n and words[hi + 1] == words[hi] + ptr:
            hi += 1
        runs[table] = [v & ~thumb_bit for v in values[lo : hi + 1]]
    # the function a table's labels lie in: the last start before them with better evidence than a
    # guess or a jump (the labels' code jumps back into its function: tail calls, while the labels
    # are taken for functions)
    trusted = sorted(va for va, src in starts.items() if not src <= _GUESSES | {"tail_call"})
    jumps = sorted(explorer.unresolved)
    drop: set[int] = set()
    out: list[tuple[int, int, list[int]]] = []
    for table, targets_run in runs.items():
        srcs = takers[table]
        targets = sorted(set(targets_run))
        i = bisect.bisect_right(trusted, targets[0]) - 1
        if i < 0 or trusted[i] == targets[0]:
            continue
        f = trusted[i]
        if i + 1 < len(trusted):
            end = trusted[i + 1]
        else:
            region = codemap.region(f)
            if region is None:
                continue  # (a start outside code: no range to hold labels)
            end = region.end
        if targets[-1] >= end or not all(f <= s < end for s in srcs):
            continue  # labels past the function, or code elsewhere takes the table (function pointers)
        k = bisect.bisect_left(jumps, f)
        if k == len(jumps) or jumps[k] >= end:
            continue  # no indirect jump left open in the function
        labels = guessed.intersection(targets)
        if not labels or sum(bodies[t].has_ret for t in labels if t in bodies) * 4 > len(labels):
            continue  # (handlers a tail-called table dispatches to return; a label's code jumps on)
        if thumb_bit and is_capstone(backend):  # ARM32: labels decoded in another state than their function's stay so
            state = backend.decoded_thumb
            if any(state.get(t, state.get(f)) != state.get(f) for t in targets):
                continue  # (gcc stores Thumb labels without bit 0: a data pointer names the ARM state)
        drop.update(labels)
        out.append((f, end, targets))
    return drop, out
