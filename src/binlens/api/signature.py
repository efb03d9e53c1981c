"""signature.*: name the functions of a stripped program from reference binaries that have symbols."""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Callable
from typing import Literal

from pydantic import Field

from binlens.analysis.fingerprint.entry import START_ROUTINES, main_from_crt, main_from_entry
from binlens.analysis.fingerprint.insns import ModelInstruction
from binlens.analysis.fingerprint.matching import match_functions
from binlens.api.compare_sides import NeedsTwo, ProgramSpec, open_side, side_view
from binlens.api.edits import check_name, edit, name_conflict, store
from binlens.api.fingerprints import fingerprints
from binlens.api.instruction import decoder
from binlens.api.models import ProgramRef, Result
from binlens.api.registry import MUTATION, CallContext, method
from binlens.errors import BinlensError
from binlens.store.analysis import AnalysisView
from binlens.store.annotations import Change
from binlens.workspace import Program, Workspace

_LIST_CAP = 2000
_FUZZY_LEAST = 12  # instructions a function needs to be named from a match that is not exact


class SignatureApplyParams(NeedsTwo):
    program: ProgramRef | None = Field(None, description="The program to name (a handle; omitted: the only one).")
    references: list[ProgramSpec] = Field(
        min_length=1, max_length=32, description="Binaries with symbols: handles or {path} opened under the roots."
    )
    min_similarity: float = Field(
        0.9, ge=0.0, le=1.0, description="Only matches at least this similar (1.0: identical code only)."
    )
    main: bool = Field(
        True, description="Name `main` (a PE's `WinMain`) from the entry's call into the C runtime's start code."
    )


class SignatureNamed(Result):
    address: str
    name: str
    score: float
    reference: str
    step: str = Field(description="How the match was found (exact, callgraph, fuzzy, ...; `entry` for main).")


class SignatureSkipped(Result):
    address: str
    name: str
    reason: str


class SignatureApplyResult(Result):
    journal_id: int | None = Field(description="The one journal entry that undoes every name; null: none given.")
    named: list[SignatureNamed]
    skipped: list[SignatureSkipped]
    named_count: int
    skipped_count: int


def _has_name(prog: Program, view: AnalysisView, va: int) -> bool:
    f = view.by_address.get(va)
    return bool(prog.user_names.get(va) or (f is not None and (f.symbol or f.thunk)))


def _function_insns(prog: Program, view: AnalysisView, fn: int) -> list[ModelInstruction]:
    """A function's instructions in address order."""
    dec = decoder(prog)
    insns: list[ModelInstruction] = []
    for start, end, _n, _t in sorted(view.blocks(fn)):
        insns += dec.instructions(start, end)
    return insns


def _pc_thunk(prog: Program, va: int) -> str | None:
    """The register a function loads with its return address (`mov ebx, [esp]; ret`), or None."""
    insns = list(decoder(prog).instructions(va, va + 8))
    if len(insns) < 2 or insns[0].mnemonic.lower() != "mov" or insns[1].mnemonic.lower() != "ret":
        return None
    dest, _, src = insns[0].operands.lower().partition(",")
    return dest.strip() if src.strip() in ("dword ptr [esp]", "[esp]") else None


def _word_reader(prog: Program) -> Callable[[int], int | None]:
    img = prog.image
    size = img.identity.bits // 8
    order: Literal["little", "big"] = "big" if img.identity.endian == "big" else "little"

    def read(va: int) -> int | None:
        data = img.read(va, size)
        return None if data is None else int.from_bytes(data, order)

    return read


def find_main(prog: Program, view: AnalysisView) -> tuple[int, str] | None:
    """`(address, name)` of `main` from the entry code: an ELF executable's call to the C runtime's
    start routine (`fingerprint.entry.main_from_entry`), a PE's C runtime start function
    (`main_from_crt`: `main` or `WinMain`)."""
    img = prog.image
    ident = img.identity
    if not ident.entry or ident.entry not in view.by_address:
        return None
    if ident.format == "PE":
        return _main_of_pe(prog, view)
    if ident.format != "ELF":
        return None
    insns = _function_insns(prog, view, ident.entry)
    routines = {f.address for f in view.functions if (f.symbol or f.thunk) in START_ROUTINES}
    slots = {i.slot for i in img.imports if i.name in START_ROUTINES}

    def is_start_routine(ins: ModelInstruction, via: int | None) -> bool:
        return bool(routines.intersection(ins.targets) or slots.intersection(ins.refs) or via in slots)

    found = main_from_entry(
        ident.arch,
        insns,
        is_start_routine,
        lambda va: va in view.by_address,
        read_word=_word_reader(prog),
        pc_thunk=lambda va: _pc_thunk(prog, va),
    )
    return None if found is None else (found, "main")


_CRT_DEPTH = 3  # calls and jumps from the entry to the C runtime's start function (MSVC: 2, mingw: 1)


def _main_of_pe(prog: Program, view: AnalysisView) -> tuple[int, str] | None:
    """`main`/`WinMain` from the C runtime start function the entry reaches, breadth first."""
    img = prog.image
    slots = {i.slot: str(i.name) for i in img.imports if i.slot}

    def callee(ins: ModelInstruction) -> tuple[int | None, str | None]:
        for t in ins.targets:
            f = view.by_address.get(t)
            if f is not None:
                return (None, f.thunk) if f.thunk else (t, None)
        via = next((slots[r] for r in ins.refs if r in slots), None)
        return None, via

    seen = {img.identity.entry}
    level = [img.identity.entry]
    for _depth in range(_CRT_DEPTH):
        following: list[int] = []
        for fn in level:
            insns = _function_insns(prog, view, fn)
            found = main_from_crt(insns, callee, img.identity.image_base)
            if found is not None:
                return found
            ends = insns[-1:]
            if ends and ends[0].flow == "fallthrough":  # cut short by a label: it runs into the next one
                following += [t for t in (fn + view.by_address[fn].size,) if t in view.by_address and t not in seen]
                seen.update(following)
            for ins in insns:
                if ins.flow in ("call", "jump", "tail_call") or ins.mnemonic.lower() in ("call", "jmp"):
                    for t in ins.targets:
                        f = view.by_address.get(t)
                        if f is not None and not f.thunk and t not in seen:
                            seen.add(t)
                            following.append(t)
        level = following
    return None


def _callees_agree(mine: tuple[int, ...], theirs: set[int], l2r: dict[int, int]) -> bool:
    """Whether a function calls something, and every callee of it that is matched is matched to a
    callee of its partner (what tells apart wrappers whose code differs only in whom they call)."""
    mapped = [l2r[c] for c in mine if c in l2r]
    return bool(mapped) and all(c in theirs for c in mapped)


@method("signature.apply", effect=MUTATION, long_running=True)
def signature_apply(ws: Workspace, p: SignatureApplyParams, ctx: CallContext) -> SignatureApplyResult:
    """Name a stripped program's functions from reference binaries with symbols, as one undoable edit."""
    prog = ws.program(p.program)
    view = side_view(prog, p, ctx)
    fps = fingerprints(prog, view)
    size_of = {f.address: f.instructions for f in fps}
    callees_of = {f.address: f.callees for f in fps}
    best: dict[int, tuple[float, str, str, str]] = {}  # address -> (score, name, reference, step)
    for i, spec in enumerate(p.references):
        ref = open_side(ws, spec, f"/params/references/{i}")
        if ref is prog:
            raise BinlensError(
                "invalid_argument", "a reference is the program itself", target=f"/params/references/{i}"
            )
        rview = side_view(ref, p, ctx)
        rfps = fingerprints(ref, rview)
        # the same code with the same strings under several names: which one a copy is stays open
        names_of: dict[tuple[bytes, tuple[str, ...]], set[str | None]] = defaultdict(set)
        code_of = {f.address: (f.exact, f.strings) for f in rfps}
        for f in rfps:
            names_of[f.exact, f.strings].add(f.name)
        found = match_functions(fps, rfps)
        l2r = {m.left: m.right for m in found}
        # a shared library calls its own exports through their PLT thunks: the callee is the export
        own = {f.symbol: f.address for f in rview.functions if f.symbol}
        thunk_of = {f.address: own[f.thunk] for f in rview.functions if f.thunk and f.thunk in own}
        ref_callees = {f.address: {thunk_of.get(c, c) for c in f.callees} for f in rfps}
        for m in found:
            rf = rview.by_address[m.right]
            name = rf.symbol
            if not name or m.similarity < p.min_similarity or _has_name(prog, view, m.left):
                continue
            if m.similarity < 1.0 and size_of[m.left] < _FUZZY_LEAST:
                continue  # a few instructions nearly alike say little of which function it is
            if len(names_of[code_of[m.right]]) > 1 and (
                size_of[m.left] < _FUZZY_LEAST or not _callees_agree(callees_of[m.left], ref_callees[m.right], l2r)
            ):
                continue  # the same code goes by several names there, and its calls do not tell which
            if m.left not in best or m.similarity > best[m.left][0]:
                best[m.left] = (m.similarity, name, ref.identity["file_name"], m.step)
    if p.main:
        entry_main = find_main(prog, view)
        if entry_main is not None and not _has_name(prog, view, entry_main[0]):
            best[entry_main[0]] = (1.0, entry_main[1], prog.identity["file_name"], "entry")
    by_name: dict[str, list[int]] = defaultdict(list)
    for va, (_s, name, _r, _st) in best.items():
        by_name[name].append(va)
    named: list[SignatureNamed] = []
    skipped: list[SignatureSkipped] = []
    for name, vas in by_name.items():
        if len(vas) > 1:  # one name for several functions: keep the best scored, unless tied
            vas.sort(key=lambda va: -best[va][0])
            top = best[vas[0]][0]
            for va in vas[1:]:
                skipped.append(SignatureSkipped(address=hex(va), name=name, reason="another function took the name"))
            if best[vas[1]][0] == top:
                skipped.append(SignatureSkipped(address=hex(vas[0]), name=name, reason="tied with another function"))
                continue
        va = vas[0]
        score, _n, reference, step = best[va]
        named.append(SignatureNamed(address=hex(va), name=name, score=round(score, 4), reference=reference, step=step))
    named.sort(key=lambda n: int(n.address, 16))
    given: list[SignatureNamed] = []

    def plan(conn: sqlite3.Connection) -> list[Change]:
        given.clear()
        changes: list[Change] = []
        st = store(prog)
        for n in named:
            va = int(n.address, 16)
            try:
                check_name(n.name, "/params/references")
                name_conflict(prog, conn, va, n.name, "/params/references")
            except BinlensError as err:
                skipped.append(SignatureSkipped(address=n.address, name=n.name, reason=err.message))
                continue
            if st.get(conn, "name", (va,)) is not None:
                continue
            changes.append(("name", (va,), {"name": n.name}))
            changes.append(("signature", (va,), {"name": n.name, "score": n.score, "reference": n.reference}))
            given.append(n)
        return changes

    summary = f"name {len(named)} functions from signatures"
    entry = edit(prog, ctx, "signature.apply", summary, plan) if named else None
    return SignatureApplyResult(
        journal_id=entry,
        named=given[:_LIST_CAP],
        skipped=skipped[:_LIST_CAP],
        named_count=len(given),
        skipped_count=len(skipped),
    )
