"""Every function's fingerprint from a finished analysis as plain data (`program_fingerprints`),
and the instruction features of the image's architecture (`insn_source`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from binlens.analysis.fingerprint.features import InsnSource, fingerprint
from binlens.analysis.fingerprint.insns import ModelFeatures, ModelInstruction, X86Features
from binlens.analysis.fingerprint.model import Fingerprint, FunctionFacts

_MIN_ADDRESS = 0x10000  # immediates below this are numbers, whatever is mapped there


@dataclass(frozen=True, slots=True)
class StoredFunction:
    """One function of a stored analysis: what `program_fingerprints` reads of it."""

    address: int
    size: int
    name: str | None
    blocks: Sequence[tuple[int, int]]
    edges: Sequence[tuple[int, int]]
    callees: Sequence[int]
    refs: Sequence[tuple[int, int, str]]  # (src, dst, kind)


def address_test(image_base: int | None, is_mapped: Callable[[int], bool]) -> Callable[[int], bool]:
    """Whether an immediate or an absolute displacement is an address: in a program loaded at 0
    (position-independent) none is (its addresses are PC-relative); otherwise a mapped value
    from 0x10000 up."""
    if not image_base:
        return lambda _v: False
    return lambda v: v >= _MIN_ADDRESS and is_mapped(v)


def insn_source(
    arch: str,
    bits: int,
    read: Callable[[int, int], bytes | None],
    is_address: Callable[[int], bool],
    decode: Callable[[int, int], Sequence[ModelInstruction]],
) -> InsnSource:
    """The instruction features of the image's code: x86 from its bytes, the rest from `decode`."""
    if arch in ("x86", "x86-64"):
        return X86Features(bits, read, is_address)
    return ModelFeatures(decode, is_address)


def program_fingerprints(
    functions: Iterable[StoredFunction],
    insns: InsnSource,
    strings: Mapping[int, str],
    import_slots: Mapping[int, str],
    thunks: Mapping[int, str],
) -> list[Fingerprint]:
    """The fingerprint of every function: its imports are the thunks it calls and the import slots
    it reads; its strings those its references point at."""
    out = []
    for f in functions:
        imports = [thunks[c] for c in f.callees if c in thunks]
        texts = []
        for _s, d, kind in f.refs:
            if d in import_slots:
                imports.append(import_slots[d])
            elif kind == "string" or d in strings:
                text = strings.get(d)
                if text is not None:
                    texts.append(text)
        facts = FunctionFacts(f.address, f.size, f.name, f.blocks, f.edges, f.callees, imports, texts)
        out.append(fingerprint(facts, insns))
    return out
