"""The explorer's walk and the block merge in C (`binlens/analysis/native/_descent.c`) against the
Python code they replace.

Same reached chunks, call targets and first-seen predecessors, in the same order, on synthetic
chunk graphs that use every terminator (and a progress callback that cancels), and the same
analyses (blocks, edges, calls, references) on real programs of several architectures.
"""

from __future__ import annotations

import random
from array import array

import pytest

from binlens.analysis import codemap as M
from binlens.analysis import engine as E
from binlens.analysis.discovery import explorer as D
from binlens.analysis.discovery import functions as F
from binlens.analysis.heuristics import gapmap as G
from binlens.analysis.model import T_BAD, T_CALL, T_COND, T_FALL, T_ICALL, T_IJUMP, T_JUMP, T_RET, T_STOP
from binlens.analysis.refs import xrefs as X
from conftest import assert_same_analysis_without, corpus_dir

C = pytest.importorskip("binlens.analysis.native._descent", reason="the C walk is not built (no C compiler?)")
R = pytest.importorskip("binlens.store._rows", reason="the C row packers are not built (no C compiler?)")


class _NoCode:
    """A code map with no regions: every chunk comes from the explorer's dict."""

    regions: list = []

    def region(self, va: int) -> None:
        return None

    def address_set(self) -> object:
        """The walks' reached set: bits for where the synthetic chunks lie (0xDEAD.... targets
        fall outside, into its side set)."""
        return C.AddrBits([(0x1000, 0x20000)])


class _Backend:
    def decode_chunk(self, va: int) -> None:
        return None


def _graph(seed: int, n: int = 400) -> dict[int, tuple[int, int, tuple[int, ...], int]]:
    """Random chunks at 0x1000, 0x1010, ...: every terminator kind, targets inside and outside."""
    rnd = random.Random(seed)
    addr = [0x1000 + 16 * i for i in range(n)]

    def pick() -> int:
        return rnd.choice(addr) if rnd.random() < 0.95 else 0xDEAD0000 + rnd.randrange(16)

    chunks = {}
    for i, a in enumerate(addr):
        nxt = addr[i + 1] if i + 1 < n else a + 16
        term = rnd.choice([T_FALL, T_JUMP, T_COND, T_CALL, T_RET, T_IJUMP, T_ICALL, T_STOP, T_BAD])
        targets: tuple[int, ...] = {
            T_FALL: (nxt,),
            T_JUMP: (pick(),),
            T_COND: (pick(), nxt),
            T_CALL: (pick(), nxt),
            T_ICALL: (rnd.choice([-1, pick()]), nxt),
            T_IJUMP: (-1, nxt) if rnd.random() < 0.3 else (-1,),
        }.get(term, ())
        chunks[a] = (a + 16, term, targets, a + 12)
    return chunks


def _chunk_map(chunks: dict) -> object:
    m = C.ChunkMap()
    for a, c in chunks.items():
        m[a] = c
    return m


def _walk(
    chunks: dict,
    use_c: bool,
    noret: set[int],
    starts: list[int],
    cond_preds: bool,
    fresh: bool,
    records: bool = False,
    dict_preds: bool = False,
) -> tuple:
    saved = D._c_traverse
    D._c_traverse = C.traverse if use_c else None
    try:
        ex = D.Explorer(_NoCode(), _Backend(), None, cond_preds=cond_preds)  # type: ignore[arg-type]
        ex.chunks = _chunk_map(chunks) if records else dict(chunks)  # type: ignore[assignment]
        if dict_preds:  # the predecessors in dicts, as without the C extension (else PredMaps)
            ex.pred, ex.jpred, ex.cpred = {}, {}, {} if cond_preds else None
        rnd = random.Random(7)
        ex.case_targets = lambda start, last: [rnd.choice(list(chunks)) for _ in range(rnd.randrange(4))]  # type: ignore[method-assign]
        ticks: list[int] = []
        ex.progress = lambda done, total, msg: ticks.append(done)  # type: ignore[assignment]
        new: list[int] | None = [] if fresh else None
        reached, calls = ex.traverse(starts, noret, new)
        cpred = None if ex.cpred is None else sorted(ex.cpred.items())
        return set(reached), calls, sorted(ex.pred.items()), sorted(ex.jpred.items()), cpred, new, ticks
    finally:
        D._c_traverse = saved


@pytest.mark.parametrize("seed", range(12))
def test_c_walk_is_the_python_walk(seed: int) -> None:
    chunks = _graph(seed, 400 + 600 * seed)  # the larger ones reach 4096 chunks: progress ticks
    rnd = random.Random(seed)
    starts = rnd.sample(sorted(chunks), len(chunks) // 3) + [0xBAD]  # (and one address with no chunk)
    noret = set(rnd.sample(sorted(chunks), 20))
    for cond_preds in (False, True):
        for fresh in (False, True):
            want = _walk(chunks, False, noret, starts, cond_preds, fresh, dict_preds=True)
            assert _walk(chunks, False, noret, starts, cond_preds, fresh) == want
            assert _walk(chunks, True, noret, starts, cond_preds, fresh, dict_preds=True) == want
            assert _walk(chunks, True, noret, starts, cond_preds, fresh) == want
            assert _walk(chunks, True, noret, starts, cond_preds, fresh, records=True) == want
            assert _walk(chunks, False, noret, starts, cond_preds, fresh, records=True) == want
    reached, calls, pred, jpred, cpred, _fresh, ticks = want
    assert len(reached) > len(chunks) // 2 and calls and pred and jpred and cpred
    assert ticks or len(reached) < 4096


def test_c_walk_stops_when_progress_raises() -> None:
    chunks = _graph(3, 9000)
    D_saved = D._c_traverse
    D._c_traverse = C.traverse
    try:
        ex = D.Explorer(_NoCode(), _Backend(), None)  # type: ignore[arg-type]
        ex.chunks = dict(chunks)
        ex.case_targets = lambda start, last: []  # type: ignore[method-assign]

        def cancel(done: float, total: float | None, msg: str | None) -> None:
            raise KeyboardInterrupt

        ex.progress = cancel  # type: ignore[assignment]
        with pytest.raises(KeyboardInterrupt):
            ex.traverse(sorted(chunks), set())
    finally:
        D._c_traverse = D_saved


def test_c_walk_refuses_what_is_not_a_chunk() -> None:
    with pytest.raises(TypeError, match="chunk is"):
        C.traverse([1], set(), set(), set(), {1: (2, 0)}, {}, {}, None, None, print, print, None, None)
    with pytest.raises(TypeError, match="noret"):
        C.traverse([1], set(), set(), [], {}, {}, {}, None, None, print, print, None, None)


CORPUS = [
    "jmptbl/test_msvc_1900_32.exe",
    "jmptbl/test_gcc_7.2.0_32.out",
    "elf/libarm.so",
    "elf/mips-mozi",
    "elf/ip-riscv",
    "mach0/swift-main",
]


PIECES = [
    (D, "_c_traverse"),
    (D, "_c_body"),
    (F, "_c_merge"),
    (G, "_descent"),
    (E, "_descent"),
    (D, "_ChunkMap"),
    (D, "_PredMap"),
    (X, "_descent"),
    (M, "_AddrBits"),
]


@pytest.mark.parametrize("module,attr", PIECES)
@pytest.mark.parametrize("name,opt,pie", [("sample.c", "-O2", True), ("gaps.c", "-O0", False)])
def test_analysis_is_the_same_with_the_python_code(compile_c, monkeypatch, module, attr, name, opt, pie) -> None:  # noqa: ANN001
    assert_same_analysis_without(monkeypatch, module, attr, compile_c(name, opt, pie, strip=True))


@pytest.mark.parametrize("module,attr", PIECES)
@pytest.mark.parametrize("name", CORPUS)
def test_corpus_analysis_is_the_same_with_the_python_code(monkeypatch, module, attr, name: str) -> None:  # noqa: ANN001
    path = corpus_dir() / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert_same_analysis_without(monkeypatch, module, attr, path)


# ------------------------------------------------------------------ pack_by_owner (the store's packing)
def _packs(monkeypatch, spans, xrefs, use_c: bool) -> list:  # noqa: ANN001
    from binlens.store import analysis_save as S

    monkeypatch.setattr(S, "_c_rows", R if use_c else None)
    return S._xref_packs(spans, xrefs, S.s64)


@pytest.mark.parametrize("name,opt,pie", [("sample.c", "-O2", True), ("gaps.c", "-O0", False)])
def test_c_packing_of_references_is_the_python_packing(compile_c, monkeypatch, name, opt, pie) -> None:  # noqa: ANN001
    from binlens.analysis import analyze
    from binlens.loader.parse_lief import parse_path
    from binlens.store.analysis_save import owner_spans

    for path in (compile_c(name, opt, pie, strip=True), *_libc()):
        a = analyze(parse_path(str(path)))
        spans = owner_spans(a.functions)
        packs = _packs(monkeypatch, spans, a.xrefs, True)
        assert packs == _packs(monkeypatch, spans, a.xrefs, False)
        assert packs == _packs(monkeypatch, tuple(list(c) for c in spans), a.xrefs, True)  # (lists of ints too)
        assert len(packs) > len(a.functions) // 2  # (most functions make a reference)
        refs = _packed(a.xrefs)  # the analysis process's packed references give the same rows
        assert _packs(monkeypatch, spans, refs, True) == packs == _packs(monkeypatch, spans, refs, False)


def _packed(xrefs: list) -> object:
    from binlens.analysis.model import XREF_KINDS, Refs

    code = XREF_KINDS.index
    return Refs(
        array("Q", [x.src for x in xrefs]), array("Q", [x.dst for x in xrefs]), bytearray(code(x.kind) for x in xrefs)
    )


def _libc() -> list:
    from pathlib import Path

    return [p for p in (Path("/lib/x86_64-linux-gnu/libc.so.6"),) if p.exists()][:1]


def test_c_packing_edges(monkeypatch) -> None:  # noqa: ANN001
    from binlens.analysis.model import Xref

    spans = ([0x10, 0x20, 0x40], [0x18, 0x30, 0x48], [0x10, 0x10, (1 << 64) - 8])  # one function in two spans
    xrefs = [Xref(a, 0x99, "read") for a in (0x8, 0x10, 0x17, 0x18, 0x20, 0x2F, 0x30, 0x40, 0x47, 0x48)]
    xrefs.append(Xref((1 << 64) - 1, 0, "call"))
    packs = _packs(monkeypatch, spans, xrefs, True)
    assert packs == _packs(monkeypatch, spans, xrefs, False)
    assert [owner for owner, _d, _k in packs] == [None, 0x10, -8]  # signed as SQLite stores it
    assert [len(k) for _o, _d, k in packs] == [5, 4, 2]
    assert _packs(monkeypatch, spans, _packed(xrefs), True) == packs
    assert _packs(monkeypatch, ([], [], []), [], True) == []
    assert _packs(monkeypatch, ([], [], []), _packed([]), True) == []
    with pytest.raises(ValueError, match="one length"):
        R.pack_by_owner([], [], [], (array("Q", [1]), array("Q"), b"\0"), {})
    with pytest.raises(TypeError, match="tuple"):
        R.pack_by_owner([], [], [], (array("Q"), array("Q")), {})
    with pytest.raises(ValueError, match="differ in length"):
        R.pack_by_owner([1], [], [], [], {})
    with pytest.raises(KeyError):
        R.pack_by_owner([], [], [], [Xref(1, 2, "no-such-kind")], {"read": 0})
    with pytest.raises(OverflowError):
        R.pack_by_owner([-1], [0], [0], [], {})


# ------------------------------------------------------------------ sort_refs (the references' order)
@pytest.mark.parametrize("seed", range(6))
def test_c_order_of_references_is_the_python_order(monkeypatch, seed: int) -> None:  # noqa: ANN001
    """Random packed references with repeats, every kind, and strings that a read, an offset and a
    pointer name (a read and an offset from one source: they stay two) name: the same arrays from both paths."""
    from binlens.analysis.model import XREF_KINDS, Refs

    rnd = random.Random(seed)
    n = rnd.choice([0, 1, 50, 3000])
    strings = {rnd.randrange(0, 64) * 8 for _ in range(12)}
    triples = [(rnd.randrange(0, 40), rnd.randrange(0, 64) * 8, rnd.randrange(len(XREF_KINDS))) for _ in range(n)]
    triples += triples[: n // 4]  # repeats
    s = min(strings)
    kind = XREF_KINDS.index
    triples += [(1000, s, kind("read")), (1000, s, kind("offset")), ((1 << 64) - 1, s, kind("pointer"))]

    def order(use_c: bool) -> tuple:
        refs = Refs(
            array("Q", [t[0] for t in triples]), array("Q", [t[1] for t in triples]), bytearray(t[2] for t in triples)
        )
        monkeypatch.setattr(X, "_descent", C if use_c else None)
        X._order(refs, strings)
        return list(refs.src), list(refs.dst), bytes(refs.kind)

    got = order(True)
    assert got == order(False)
    found = list(zip(got[0], got[1], [XREF_KINDS[k] for k in got[2]], strict=True))
    assert found == sorted(found)
    assert found.count((1000, s, "string")) == 2  # the read and the offset of one source: both name a string
    assert found[-1] == ((1 << 64) - 1, s, "string")
    with pytest.raises(ValueError, match="256 bytes"):
        C.sort_refs((array("Q"), array("Q"), bytearray()), b"", b"", b"")
    with pytest.raises(BufferError):  # (bytes: not writable)
        C.sort_refs((array("Q"), array("Q"), b""), X._RANK, X._RETAG_TO, b"")


# ------------------------------------------------------------------ AddrBits (the walks' reached set)
def test_addr_bits_behave_as_the_set_they_replace() -> None:
    """Random adds, discards and look-ups on an AddrBits and a set side by side, in and around three regions
    (the first and last byte of each, the byte past it) and far outside them, with values that are no
    address (kept in the side set): every answer agrees; region members iterate in ascending order."""
    rnd = random.Random(7)
    regions = [(0x1000, 0x40), (0x1040, 1), (0x7FFF_FFFF_FFFF_0000, 0x10000)]
    bits, plain = C.AddrBits(regions), set()
    edges = [a for lo, n in regions for a in (lo, lo + n - 1, lo + n, lo - 1)]
    odd = [-1, 2**64, 2**64 - 1, 0, "x", 1.5, (1, 2)]
    for step in range(20000):
        r = rnd.random()
        if r < 0.1:
            a = rnd.choice(odd)
        elif r < 0.3:
            a = rnd.choice(edges)
        else:
            lo, n = rnd.choice(regions)
            a = lo + rnd.randrange(n)
        op = rnd.random()
        if op < 0.4:
            bits.add(a)
            plain.add(a)
        elif op < 0.6:
            bits.discard(a)
            plain.discard(a)
        else:
            assert (a in bits) == (a in plain), a
        if step % 4000 == 0:
            assert len(bits) == len(plain)
            members = list(bits)
            assert set(members) == plain and len(members) == len(plain)
            inside = [a for a in members if isinstance(a, int) and any(lo <= a < lo + n for lo, n in regions)]
            assert inside == sorted(inside) and inside == members[: len(inside)]
    bits.add(0x1040)
    assert 0x1040 in bits and bits.nbytes() == (0x40 // 8 + 1) + 1 + (0x10000 // 8 + 1)
    bits.clear()
    assert len(bits) == 0 and list(bits) == [] and 0x1000 not in bits
    with pytest.raises(ValueError, match="ascending"):
        C.AddrBits([(0x2000, 16), (0x1000, 16)])
    with pytest.raises(ValueError, match="ascending"):
        C.AddrBits([(2**64 - 8, 16)])  # (past 2**64)
    with pytest.raises(TypeError):
        C.AddrBits([(0x1000,)])
    assert len(C.AddrBits([])) == 0 and 5 not in C.AddrBits([])
    top = C.AddrBits([(0, 0), (2**64 - 16, 16)])  # (an empty region; one that ends at 2**64)
    for a in (2**64 - 1, 2**64 - 16, 0):
        top.add(a)
    assert list(top) == [2**64 - 16, 2**64 - 1, 0] and top.nbytes() == 1 + 3
    with pytest.raises(ValueError, match="within"):
        C.AddrBits([(2**64 - 8, 9)])
    with pytest.raises(ValueError, match="overlapping"):
        C.AddrBits([(0x1000, 16), (0x100F, 1)])


def test_pred_map_behaves_as_the_dict_it_replaces() -> None:
    """Random assignments, setdefaults, look-ups and `in` on a PredMap and a dict side by side: keys
    near and far from their values (a distance over 32 bits, values that are no address, keys that
    are none, 0 and 2**64-1, the key that marks an empty slot) and values replaced by ones that no
    longer fit a slot; every answer agrees, and the contents at the end."""
    rnd = random.Random(3)
    m, d = C.PredMap(), {}
    keys = [rnd.randrange(0, 1 << 20) for _ in range(3000)] + [0, 2**64 - 1, 2**64 - 2, -1, 2**64, "x"]
    for _ in range(100_000):
        k = rnd.choice(keys)
        near = k - rnd.randrange(1, 64) if isinstance(k, int) else 5
        v = rnd.choice([near, near, near, rnd.randrange(0, 2**64), 2**40 + rnd.randrange(9), -3, "y"])
        op = rnd.random()
        if op < 0.4:
            m[k] = v
            d[k] = v
        elif op < 0.6:
            assert m.setdefault(k, v) == d.setdefault(k, v)
        elif op < 0.8:
            assert m.get(k) == d.get(k) and m.get(k, "none") == d.get(k, "none")
        else:
            assert (k in m) == (k in d)
    assert len(m) == len(d) and sorted(map(repr, m.items())) == sorted(map(repr, d.items()))
    assert all(m[k] == v for k, v in d.items()) and m.nbytes() > 0
    with pytest.raises(KeyError):
        m[2**70]
    with pytest.raises(TypeError, match="no deletion"):
        del m[keys[0]]


def test_the_walk_takes_a_set_or_addr_bits_and_nothing_else() -> None:
    chunks = {0x10: (0x14, T_RET, (), 0x10)}
    for reached in (set(), C.AddrBits([(0x10, 4)])):
        C.traverse([0x10, 0x10], reached, set(), set(), chunks, {}, {}, None, None, print, print, None, None)
        assert list(reached) == [0x10]
    with pytest.raises(TypeError, match="AddrBits"):
        C.traverse([0x10], [], set(), set(), chunks, {}, {}, None, None, print, print, None, None)


# ------------------------------------------------------------------ ChunkMap (the chunk cache's records)
def test_chunk_map_behaves_as_the_dict_it_replaces() -> None:
    """Random assignments, overwrites, deletions and pops on a ChunkMap and a dict side by side:
    every read agrees, including values that fit no record (kept as they are), keys past 2**63 and
    negative targets, and through the table's growth and its deleted slots."""
    rnd = random.Random(5)
    m, d = C.ChunkMap(), {}
    odd = [(3, 1), ("x", 0, (), 1), (5, True, (), 5), (1, 0, (2**64,), 1), (2, 300, (), 2), [1, 2, 3, 4]]

    def value(a: int) -> object:
        if rnd.random() < 0.03:
            return rnd.choice(odd)
        end = a + rnd.randrange(1, 64) if rnd.random() < 0.98 else a - 1  # (an end below the start)
        targets = tuple(rnd.choice([end, a + 7, -1, 2**63 - 1, 0]) for _ in range(rnd.randrange(4)))
        return (end, rnd.randrange(9), targets, a + rnd.randrange(0, 16))

    keys = [0x401000 + 16 * i for i in range(3000)] + [2**64 - 16, 0, -5, 1.5]
    for step in range(30000):
        a = rnd.choice(keys)
        r = rnd.random()
        if r < 0.6:
            v = value(a) if isinstance(a, int) else (1, 0, (), 1)
            m[a] = v
            d[a] = v
        elif r < 0.75:
            if a in d:
                del m[a]
                del d[a]
            else:
                with pytest.raises(KeyError):
                    del m[a]
        elif r < 0.85:
            assert m.pop(a, "none") == d.pop(a, "none")
        else:
            assert m.get(a) == d.get(a)
            assert (a in m) == (a in d)
        if step % 5000 == 0:
            assert len(m) == len(d)
            assert dict(m.items()) == d
            assert sorted(m, key=repr) == sorted(d, key=repr)
    assert dict(m.items()) == d and len(m) == len(d)
    with pytest.raises(KeyError):
        m[0x999]
    assert m.nbytes() > 0


def test_chunk_map_shares_one_int_per_chunk() -> None:
    """A target or an end naming a chunk in the map comes back as that chunk's own key object, so the
    walks' sets and lists hold one int per chunk (the memory the map saves would go to copies)."""
    m = C.ChunkMap()
    head, tail = 0x401000 + 0, 0x401000 + 32
    m[tail] = (tail + 4, T_RET, (), tail)
    m[head] = (tail, T_COND, (tail, tail), head + 30)
    c = m[head]
    assert c == (tail, T_COND, (tail, tail), head + 30)
    key = next(k for k in m if k == tail)
    assert c[0] is key and c[2][0] is key and c[2][1] is key


def test_chunk_map_gives_memory_back_as_chunks_are_consumed() -> None:
    """Building functions deletes their chunks: the table shrinks with them, and what is left reads
    back the same."""
    m = C.ChunkMap()
    for i in range(100_000):
        a = 0x400000 + 16 * i
        m[a] = (a + 16, T_FALL, (a + 16,), a + 12)
    full = m.nbytes()
    for i in range(99_000):
        del m[0x400000 + 16 * i]
    assert len(m) == 1000 and m.nbytes() < full / 4
    a = 0x400000 + 16 * 99_500
    assert m[a] == (a + 16, T_FALL, (a + 16,), a + 12)
    assert 0x400000 not in m
