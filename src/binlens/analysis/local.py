"""Local re-analysis: the functions around a start a user defined or removed, not the program.

`analyze_functions` walks only the given entries, with every other known start as a boundary,
and returns their functions and the references from their code; the caller
(`binlens.jobs.state`) replaces those rows in the stored analysis (`store.analysis.replace_functions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from binlens.analysis.codemap import CodeMap
from binlens.analysis.decode.backend import make_backend
from binlens.analysis.discovery.explorer import NORETURN_NAMES
from binlens.analysis.discovery.functions import iter_functions
from binlens.analysis.engine import gc_paused, make_explorer
from binlens.analysis.intervals import IntervalSet
from binlens.analysis.metadata.ehframe import parse_eh_frame
from binlens.analysis.metadata.names import text_names
from binlens.analysis.metadata.seeds import Seeds
from binlens.analysis.metadata.thunks import find_thunks
from binlens.analysis.model import Function, Xref
from binlens.analysis.refs.xrefs import collect_refs
from binlens.loader.image import Image


def analyze_functions(
    image: Image,
    entries: list[int],
    starts: set[int],
    noreturn: set[int],
    string_starts: AbstractSet[int] = frozenset(),
    overrides: Mapping[int, str] | None = None,
) -> tuple[list[Function], list[Xref]]:
    """Local analysis: the bodies of `entries` alone, with `starts` as every other known entry.

    Used when a user defines or undefines a function or overrides an instruction's flow (`overrides`:
    {instruction address: kind}, `discovery/overrides.py`): only the functions around it change.
    Returns those functions and the references made from their code (no data pointers).
    """
    with gc_paused():
        return _analyze_functions(image, entries, starts, noreturn, string_starts, overrides or {})


def _analyze_functions(
    image: Image,
    entries: list[int],
    starts: set[int],
    noreturn: set[int],
    string_starts: AbstractSet[int],
    overrides: Mapping[int, str],
) -> tuple[list[Function], list[Xref]]:
    image = text_names(image)
    codemap = CodeMap(image)
    backend = make_backend(image, codemap)
    seeds = Seeds(image, codemap, backend)
    thunks = {va: name for va, name in find_thunks(image, codemap).items() if codemap.contains(va)}
    extents: dict[int, int] = {}
    fragments = []
    for fde in parse_eh_frame(image):
        if fde.entry and fde.size:
            extents[fde.start] = fde.size
        elif not fde.entry:
            fragments.append((fde.start, fde.size))
    for s in image.symbols:
        if s.kind == "function" and s.size and codemap.contains(s.address):
            extents.setdefault(s.address, s.size)
    entries = [va for va in (seeds.add(e, "user") for e in entries) if va is not None]
    noret = set(noreturn) | {imp.slot for imp in image.imports if imp.name in NORETURN_NAMES}
    jt_tables: dict[int, int] = {}
    explorer = make_explorer(image, codemap, backend, jt_tables)
    explorer.override_flows(overrides)
    explorer.traverse(entries, noret)
    for _ in range(4):
        more = explorer.retry_tables()
        if not more:
            break
        explorer.traverse(entries + more, noret)
    everything = set(starts) | set(entries)
    bodies, _new = explorer.partition(everything, extents, IntervalSet(fragments), noret)
    explorer.finish()
    mine = {f: bodies[f] for f in entries if f in bodies}
    no_sources: dict[int, frozenset[str]] = {f: frozenset() for f in mine}
    functions = list(iter_functions(image, codemap, explorer, mine, no_sources, extents, thunks, noret))
    xrefs = collect_refs(image, codemap, backend, explorer, mine, set(string_starts), jt_tables, data=False).xrefs()
    return functions, xrefs
