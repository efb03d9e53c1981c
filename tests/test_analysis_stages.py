"""The engine's structure: the heuristic stages come from one table, the explorer changes only
through its own methods, and `explore`'s result is built from named parts."""

from __future__ import annotations

import re
from pathlib import Path

from binlens.analysis import engine as E
from binlens.analysis.heuristics import starts as S
from binlens.loader.parse_lief import parse_path

SRC = Path(E.__file__).resolve().parents[1]  # the binlens package under test
# an explorer attribute assigned, augmented or changed by a container method, outside explorer.py
_MUTATION = re.compile(
    r"\b(?:explorer|ex|self\.explorer)\.[a-z_]+(?:\[[^\]]*\])?\s*(?:[-+|&]?=(?!=))"
    r"|\b(?:explorer|ex|self\.explorer)\.[a-z_]+\.(?:append|extend|add|update|pop|clear|discard|setdefault|remove)\("
)


def test_the_schedule_runs_only_stages_of_the_table() -> None:
    names = [name for name, _rounds in S.SCHEDULE]
    assert set(names) == set(S.STAGES), "every stage is scheduled, and only stages of the table"
    assert set(S.DATA_STAGES) <= set(S.STAGES)
    assert S.schedule() == [name for name, rounds in S.SCHEDULE for _ in range(rounds)]
    assert names.index("gaps") < names.index("data_prologues") < names.index("data_pointers")


def test_no_module_changes_the_explorer_from_outside() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "explorer.py" and path.parent.name == "discovery":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _MUTATION.search(line.split("#", 1)[0]):
                found.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_explored_parts(compile_c) -> None:  # noqa: ANN001
    image = parse_path(str(compile_c("sample.c", "-O2", True, strip=True)))
    with E.gc_paused():
        explored = E.explore(image)
        bodies = explored.found.bodies
        assert bodies and set(bodies) <= set(explored.found.starts)
        assert explored.reader.explorer.chunks and explored.reader.image.identity.arch == "x86-64"
        assert explored.covered > 0 and explored.chunk_count >= len(explored.reader.explorer.chunks)
        order = sorted(bodies)
        kept = {a for f in order[1:] for a in bodies[f].chunks}
        gone = set(bodies[order[0]].chunks) - kept
        explored.drop((0, 1))  # the first function's body, and the chunks only it holds
        chunks = explored.reader.explorer.chunks
        assert order[0] not in bodies and all(a in chunks for a in kept)
        assert not any(a in chunks for a in gone)
        functions = explored.functions()
    assert [f.address for f in functions] == order[1:]
