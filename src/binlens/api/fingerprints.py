"""A program's function fingerprints: the stored ones while they match its analysis, else computed
from the stored analysis (`corpus/fingerprints.py`) and stored (`store/fingerprints.py`)."""

from __future__ import annotations

import threading
import time

from binlens.analysis.fingerprint.model import Fingerprint
from binlens.api.instruction import decoder
from binlens.corpus.fingerprints import compute as fingerprint_compute
from binlens.store.analysis import AnalysisView
from binlens.store.fingerprints import analysis_key, load_fingerprints, save_fingerprints, stored_key
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
    return fingerprint_compute(prog.image, prog.db, view, decoder(prog))
