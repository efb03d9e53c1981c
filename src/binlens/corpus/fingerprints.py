"""A program's function fingerprints from its stored analysis: shared by the compare domain
(`api/fingerprints.py`, which caches them per open program) and the corpus indexer's workers,
which have an image and its database but no open program."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from binlens.analysis.fingerprint.insns import ModelInstruction
from binlens.analysis.fingerprint.model import Fingerprint
from binlens.analysis.fingerprint.program import StoredFunction, address_test, insn_source, program_fingerprints
from binlens.loader import Image
from binlens.store import ProgramDatabase
from binlens.store.analysis import AnalysisView, unpack_blocks, unpack_edges
from binlens.store.fingerprints import (
    all_blocks,
    all_calls,
    all_edges,
    all_function_refs,
    analysis_key,
    load_fingerprints,
    save_fingerprints,
    stored_key,
)


def new_decoder(image: Image) -> Any:
    """A decoder of `image`'s code (the engine's backend over its code map)."""
    from binlens.analysis import make_backend
    from binlens.analysis.codemap import CodeMap

    return make_backend(image, CodeMap(image))


def compute(image: Image, db: ProgramDatabase, view: AnalysisView, dec: Any) -> list[Fingerprint]:
    """Every function's fingerprint from the stored analysis, decoding with `dec` (nothing stored)."""
    ident = image.identity

    def decode(start: int, end: int) -> Sequence[ModelInstruction]:
        return dec.instructions(start, end)

    is_address = address_test(ident.image_base, image.is_mapped)
    insns = insn_source(ident.arch, ident.bits, image.read, is_address, decode)
    blocks, edges = all_blocks(db), all_edges(db)
    calls, refs = all_calls(db), all_function_refs(db)
    strings = {a: text for a, _n, _e, text, _s, _r in view.strings()}
    slots = {i.slot: _text(i.name) for i in image.imports if i.slot}
    thunks = {f.address: f.thunk for f in view.functions if f.thunk}

    def stored() -> list[StoredFunction]:
        out = []
        for f in view.functions:
            b = blocks.get(f.address)
            spans = sorted({(s, e) for s, e, _n, _t in unpack_blocks(*b)}) if b else []
            es = edges.get(f.address)
            out.append(
                StoredFunction(
                    f.address,
                    f.size,
                    f.symbol or (f"{f.thunk}@plt" if f.thunk else None),
                    spans,
                    [(s, d) for s, d, _k in unpack_edges(*es)] if es else [],
                    calls.get(f.address, []),
                    refs.get(f.address, []),
                )
            )
        return out

    return program_fingerprints(stored(), insns, strings, slots, thunks)


def stored_or_computed(image: Image, db: ProgramDatabase, view: AnalysisView, dec: Any) -> list[Fingerprint]:
    """The fingerprints stored in `db` while they match its analysis, else computed and stored."""
    key = analysis_key(db, view)
    if stored_key(db) == key:
        return load_fingerprints(db)
    t0 = time.monotonic()
    fps = compute(image, db, view, dec)
    save_fingerprints(db, key, fps, time.monotonic() - t0)
    return fps


def tail_calls(db: ProgramDatabase, view: AnalysisView) -> dict[int, list[int]]:
    """Each function's tail jumps to other functions, by function (the corpus's inlining context
    counts them with its calls)."""
    entries = {f.address for f in view.functions}
    out: dict[int, list[int]] = {}
    for fn, refs in all_function_refs(db).items():
        targets = [d for _s, d, kind in refs if kind == "tail_call" and d in entries and d != fn]
        if targets:
            out[fn] = targets
    return out


def _text(name: object) -> str:
    if isinstance(name, str):
        return name
    return bytes(name).decode("latin-1")  # type: ignore[call-overload]
