"""The analysis of an image as the rows to store (`binlens.store.analysis_save`).

`analyse` explores the image, then builds the functions' rows and the references' rows, in this
process alone or with a forked function builder beside it (`jobs/fork.py`). The engine's state
goes once the functions' rows are built, as they have consumed most of it (~9 ms on libc); the
rows are kept to the end (`retained`): freeing the whole analysis object by object on return
takes ~60 ms.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

from binlens.jobs.fork import in_two_processes, parallel
from binlens.jobs.request import Progress

retained: list[Any] = []  # the rows (and the engine's state until they are built), kept until the process exits


@dataclass
class Rows:
    """An analysis as the rows to store (`binlens.store.analysis_save`)."""

    figures: tuple[str, int, int, float]
    functions: Any  # FunctionRows
    references: Any  # ReferenceRows
    warnings: list[str] = field(default_factory=list)  # what of the image was not analysed, and why


def analyse(
    image: Any, progress: Progress, extra: list[int], excluded: list[int], overrides: dict[int, str] | None = None
) -> Rows:
    """The analysis of `image` as rows to store.

    Once every function's code is found (`explore`), what remains splits into independent parts:
    the references with the strings, and each function's blocks; with two CPUs they run side by
    side (`fork.in_two_processes`).
    """
    from binlens.analysis.engine import explore, gc_paused
    from binlens.store.analysis_save import reference_rows, streamed_function_rows

    retained.clear()  # (an earlier analysis in this process, whose user starts were not the caller's)
    with gc_paused():  # the rows are acyclic tuples; collections would re-scan the whole analysis
        explored = explore(image, progress, extra, excluded, overrides)
        retained.append(explored)
        if parallel():
            strings, refs, frows = in_two_processes(explored, retained.append)
        else:
            strings, refs = explored.references()
            frows = streamed_function_rows(explored.iter_functions())
        retained.append(refs)
        # The functions' rows are built: the engine's state can go, and the references' rows and
        # the save then fit in the memory it frees, lowering this process's peak for ~9 ms of work
        # (libc). One collection: the explorer and its backend hold each other.
        facts = (explored.reader.codemap.total_bytes, explored.covered, explored.t0)
        warnings = explored.warnings
        retained.remove(explored)
        del explored
        gc.collect()
        rrows = reference_rows(refs, strings, frows.spans)
        frows.spans = ([], [], [])  # (three arrays of ~70k entries for libc, of no further use)
        return Rows(_figures(facts, frows, progress), frows, rrows, warnings)


def _figures(facts: tuple[int, int, float], frows: Any, progress: Progress) -> tuple[str, int, int, float]:
    """The run's figures (`store.analysis_save.run_figures` of the analysis) from (code bytes,
    covered bytes, start time), once it is done."""
    from binlens.analysis.engine import ENGINE_VERSION

    code_bytes, covered, t0 = facts
    progress(1.0, 1.0, f"{frows.counts[0]} functions")
    return ENGINE_VERSION, code_bytes, covered, time.perf_counter() - t0
