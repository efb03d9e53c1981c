"""A program's function fingerprints: the stored ones while they match its analysis, else computed
from the stored analysis (`analysis/fingerprint/`) and stored (`store/fingerprints.py`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from binlens.analysis.fingerprint.insns import ModelInstruction
from binlens.analysis.fingerprint.model import Fingerprint
from binlens.analysis.fingerprint.program import StoredFunction, address_test, insn_source, program_fingerprints
from binlens.api.instruction import decoder
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
from binlens.workspace import Program

_lock = threading.Lock()


def fingerprints(prog: Program, view: AnalysisView) -> list[Fingerprint]:
    """Every function's fingerprint, by address (computed and stored on first use per analysis)."""
    key = analysis_key(prog.db, view)
    cached = prog.extensions.get("fingerprints")
    if cached is not None and cached[0] == key:
        return list(cached[1])
    with _lock:
        if stored_key(prog.db) == key:
            fps = load_fingerprints(prog.db)
        else:
            t0 = time.monotonic()
            fps = compute(prog, view)
            save_fingerprints(prog.db, key, fps, time.monotonic() - t0)
        prog.extensions["fingerprints"] = (key, fps)
    return list(fps)


def compute(prog: Program, view: AnalysisView) -> list[Fingerprint]:
    """Every function's fingerprint from the stored analysis (nothing stored)."""
    img = prog.image
    ident = img.identity
    dec = decoder(prog)

    def decode(start: int, end: int) -> Sequence[ModelInstruction]:
        return dec.instructions(start, end)

    is_address = address_test(ident.image_base, img.is_mapped)
    insns = insn_source(ident.arch, ident.bits, img.read, is_address, decode)
    blocks, edges = all_blocks(prog.db), all_edges(prog.db)
    calls, refs = all_calls(prog.db), all_function_refs(prog.db)
    strings = {a: text for a, _n, _e, text, _s, _r in view.strings()}
    slots = {i.slot: _text(i.name) for i in img.imports if i.slot}
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


def _text(name: object) -> str:
    if isinstance(name, str):
        return name
    return bytes(name).decode("latin-1")  # type: ignore[call-overload]
