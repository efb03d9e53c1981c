"""Data inside a PE's executable sections, from what the file itself says.

MSVC's linker merges read-only data (`.rdata`, `.idata`, `.edata`, `.xdata`, string literals) into
`.text` on many Windows system files (`/MERGE:.rdata=.text`): decoded as code, strings and tables
become "functions" and the string scanner, which reads data sections, misses them. The ranges
found here are data with evidence:

- `directory`: every data directory (exports, imports, IAT, delay imports, debug, load config,
  TLS, exceptions, relocations, resources, CLR header), and the structures they point to: import
  lookup and address tables, hint/name entries and library names; delay-import name, address,
  bound and unload tables and handles; debug payloads (the CodeView record); load config tables
  (guard CF functions, SEH handlers, guard IAT/longjmp/EH-continuation tables); TLS callback
  arrays, index and template.
- `unwind`: x64 `UNWIND_INFO` records that `.pdata` names (with their chained entry or handler
  address), merged with the handler data between neighbours where no function lies between.
- `pointer`: every 64-bit (`DIR64`) relocated word (x64 and AArch64 code holds no absolute
  address); `table`: runs of three or more 32-bit (`HIGHLOW`) relocated words four bytes apart (no
  x86 instruction holds more than two addresses, so such a run is a table). MSVC puts an i386
  function's switch tables inside the function, after its code: the analysis refuses starts in a
  `table` but decodes around it as code (`CodeMap`), so that a gap trial sees the function whole.
- `string`: NUL-terminated strings that a relocated word points to (8 ASCII or 4 UTF-16LE
  characters at least; in an x64 file with `.pdata`, where the target lies outside every function
  `.pdata` describes, 2 ASCII or 1 UTF-16 character: code without unwind data there is a small
  leaf, none of which starts with two printable bytes and a zero in the corpus); and in an x64
  file with `.pdata`, strings outside its functions found by their shape (after a NUL, 5 ASCII or
  4 UTF-16 characters at least: inside the functions of the corpus's x64 files such a run occurs
  at most once per file).

The file's claims of code win over its claims of data: no range overlaps a function `.pdata`
describes or the first 15 bytes at the entry point, an export or a TLS callback (hand-made files
lay code over their import and header structures), nor the delay-load thunks a delay-import
address table holds. On x64 with `.pdata`, the bytes between two ranges that no function or
claimed code separates are data too when they are fewer than 16 or lie before the first function
or after the last (`_close_gaps`).

Every range is cut to the file-backed part of the executable sections (data elsewhere is data
already); the result is sorted and has no overlaps (`merge`).
"""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Callable, Iterable
from typing import Any

DataRange = tuple[int, int, str]  # [va, end) and the kind of evidence
Reader = Callable[[int, int], bytes | None]  # (va, size) -> bytes, or None where unmapped

_ASCII_IN = rb"[\x20-\x7e\t\n\r]"
_SHAPE_ASCII = re.compile(rb"(?<=\x00)" + _ASCII_IN + rb"{5,}\x00")
_SHAPE_UTF16 = re.compile(rb"(?<=\x00)(?:" + _ASCII_IN + rb"\x00){4,}\x00\x00")
# (8 ASCII characters: i386 code holds shorter runs before a zero, `push offset x` being "h" and
# three bytes of an address, `cmp ecx, [abs]` five, `push 0x41; push offset x` six)
_AT_ASCII = re.compile(_ASCII_IN + rb"{8,}\x00")
_AT_UTF16 = re.compile(rb"(?:" + _ASCII_IN + rb"\x00){4,}\x00\x00")
# at a relocated word's target outside every function `.pdata` describes (x64): any string
_AT_ASCII_SHORT = re.compile(_ASCII_IN + rb"{2,}\x00")
_AT_UTF16_SHORT = re.compile(rb"(?:" + _ASCII_IN + rb"\x00)+\x00\x00")
_MAX_STRING = 4096  # bytes read at a pointer's target to test for a string
_UNWIND_GAP = 4096  # handler data between two unwind records that no function separates
SMALL_GAP = 16  # bytes between two data items outside every function that are taken as data too
UNW_FLAG_EHANDLER, UNW_FLAG_UHANDLER, UNW_FLAG_CHAININFO = 1, 2, 4


def merge(ranges: Iterable[DataRange], gap: int = 0) -> list[DataRange]:
    """`ranges` sorted, with overlapping or touching ranges, or those less than `gap` bytes apart,
    joined (the first one's kind stays)."""
    out: list[DataRange] = []
    for lo, hi, kind in sorted(r for r in ranges if r[1] > r[0]):
        if out and lo < out[-1][1] + max(1, gap):
            plo, phi, pkind = out[-1]
            if hi > phi:
                out[-1] = (plo, hi, pkind)
            continue
        out.append((lo, hi, kind))
    return out


def clip(ranges: Iterable[DataRange], spans: list[tuple[int, int]]) -> list[DataRange]:
    """The parts of `ranges` inside the sorted, disjoint `spans`."""
    starts = [lo for lo, _hi in spans]
    out = []
    for lo, hi, kind in ranges:
        i = max(0, bisect.bisect_right(starts, lo) - 1)
        while i < len(spans) and spans[i][0] < hi:
            a, b = max(lo, spans[i][0]), min(hi, spans[i][1])
            if a < b:
                out.append((a, b, kind))
            i += 1
    return out


def in_spans(spans: list[tuple[int, int]], starts: list[int], va: int) -> bool:
    """Is `va` inside one of the sorted, disjoint `spans` (`starts`: their first addresses)?"""
    i = bisect.bisect_right(starts, va) - 1
    return i >= 0 and va < spans[i][1]


def unwind_ranges(
    records: Iterable[tuple[int, int, int]], read: Reader, functions: list[tuple[int, int]]
) -> list[DataRange]:
    """x64 `UNWIND_INFO` records of the `.pdata` rows (begin, end, unwind info address): each
    record's header, codes and chained entry or handler address; two records are joined when
    no function of `functions` (sorted (begin, end)) starts between them (the handler data, such
    as `__C_specific_handler`'s scope table, lies there)."""
    found = []
    for _begin, _end, at in records:
        head = read(at, 4)
        if head is None or len(head) < 4:
            continue
        flags = head[0] >> 3
        size = 4 + 2 * ((head[2] + 1) & ~1)
        if flags & UNW_FLAG_CHAININFO:
            size += 12
        elif flags & (UNW_FLAG_EHANDLER | UNW_FLAG_UHANDLER):
            size += 4
        found.append((at, at + size))
    found = sorted(set(found))
    begins = sorted(b for b, _e in functions)
    out: list[DataRange] = []
    for lo, hi in found:
        if out:
            plo, phi, _k = out[-1]
            if lo <= phi or lo - phi <= _UNWIND_GAP and _none_between(begins, phi, lo):
                out[-1] = (plo, max(phi, hi), "unwind")
                continue
        out.append((lo, hi, "unwind"))
    return out


def _none_between(begins: list[int], lo: int, hi: int) -> bool:
    i = bisect.bisect_left(begins, lo)
    return i >= len(begins) or begins[i] >= hi


def relocation_ranges(places: Iterable[tuple[int, str]]) -> list[DataRange]:
    """Relocated words that are data: each `DIR64` place (8 bytes, `pointer`), and runs of three or
    more `HIGHLOW` places four bytes apart (`table`)."""
    out: list[DataRange] = []
    low: list[int] = []
    for at, kind in places:
        if kind == "DIR64":
            out.append((at, at + 8, "pointer"))
        elif kind == "HIGHLOW":
            low.append(at)
    low.sort()
    i = 0
    while i < len(low):
        j = i
        while j + 1 < len(low) and low[j + 1] == low[j] + 4:
            j += 1
        if j - i >= 2:
            out.append((low[i], low[j] + 4, "table"))
        i = j + 1
    return out


def string_at(read: Reader, va: int, short: bool = False) -> int:
    """The size (terminator included) of the ASCII string of 8 characters or more or UTF-16LE string
    of 4 or more at `va` (`short`: of 2 ASCII characters or 1 UTF-16 character or more), or 0."""
    raw = read(va, 16)
    if not raw:
        return 0
    probe = _MAX_STRING if raw[1:2] == b"\x00" or raw.find(b"\x00") < 0 else len(raw)
    raw = read(va, probe) or raw
    if short:
        m = _AT_UTF16_SHORT.match(raw) if raw[1:2] == b"\x00" else _AT_ASCII_SHORT.match(raw)
    else:
        m = _AT_UTF16.match(raw) if raw[1:2] == b"\x00" else _AT_ASCII.match(raw)
    return m.end() if m else 0


def looks_like_data(read: Reader, va: int, short: bool) -> bool:
    """Do the bytes at `va` read as data rather than as a function's first instruction: eight zero
    bytes, or a string (`string_at`; `short` as outside the functions of an x64 `.pdata`)?"""
    raw = read(va, 8)
    if raw is None:
        return False
    return raw == bytes(8) or bool(string_at(read, va, short))


def shape_strings(data: bytes, va: int) -> list[DataRange]:
    """Strings in `data` (at `va`) that start after a NUL: 5 ASCII characters at least, or 4 UTF-16LE
    (at an even address)."""
    out = [(va + m.start(), va + m.end(), "string") for m in _SHAPE_ASCII.finditer(data)]
    out += [(va + m.start(), va + m.end(), "string") for m in _SHAPE_UTF16.finditer(data) if not (va + m.start()) % 2]
    return out


def _enum(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1]


def pe_data_ranges(b: Any, base: int, sections: list[Any], read: Reader, bits: int, arch: str) -> list[DataRange]:
    """Data ranges inside the executable sections of the LIEF PE binary `b` (see the module's
    docstring); `sections`: the Image's sections; `read(va, size)`: the image's bytes."""
    # (the file-backed part of each code section: the code map decodes no more, and a range in a
    # virtual tail would be zeros that a hostile size could make gigabytes of)
    spans = sorted((s.va, s.va + min(s.size, s.fsize)) for s in sections if s.kind == "code" and s.size and s.fsize)
    if not spans:
        return []
    starts = [lo for lo, _hi in spans]
    ptr = 8 if bits == 64 else 4
    word = struct.Struct("<Q" if ptr == 8 else "<I")
    found: list[DataRange] = []

    def add(va: int, size: int, kind: str = "directory") -> None:
        if va > base and 0 < size < 1 << 28:
            found.append((va, va + size, kind))

    def rva(value: int) -> int:
        return base + value if value else 0

    def words(va: int, limit: int = 1 << 16) -> int:
        """Bytes in the zero-terminated array of pointer-sized words at `va` (terminator included)."""
        n = 0
        while n < limit:
            raw = read(va + n * ptr, ptr)
            if raw is None or len(raw) < ptr:
                return n * ptr
            n += 1
            if not word.unpack(raw)[0]:
                break
        return n * ptr

    def cstring(va: int) -> int:
        raw = read(va, 512)
        if not raw:
            return 0
        end = raw.find(b"\x00")
        return end + 1 if end >= 0 else 0

    for d in b.data_directories:
        kind = _enum(d.type)
        if kind != "CERTIFICATE_TABLE" and d.rva and d.size:  # (the certificate table is at a file offset)
            add(base + d.rva, d.size)
    for lib in b.imports:
        for table in (lib.import_lookup_table_rva, lib.import_address_table_rva):
            if table:
                add(base + table, words(base + table))
        if lib.name_rva:
            add(base + lib.name_rva, cstring(base + lib.name_rva))
        for e in lib.entries:
            if not e.is_ordinal and e.ilt_value:
                at = base + (e.ilt_value & 0x7FFFFFFF)
                add(at, 2 + cstring(at + 2))
    if b.has_delay_imports:
        for di in b.delay_imports:
            by_rva = bool(di.attribute & 1)  # (Visual C++ 6 delay imports hold addresses, not RVAs)

            def at(value: int, by_rva: bool = by_rva) -> int:
                return rva(value) if by_rva else value

            for table in (di.names_table, di.iat, di.biat, di.uiat):
                if table:
                    add(at(table), words(at(table)))
            if di.handle:
                add(at(di.handle), ptr)
            names = at(di.names_table)
            for i in range(words(names) // ptr if names else 0):
                raw = read(names + i * ptr, ptr)
                value = word.unpack(raw)[0] if raw and len(raw) == ptr else 0
                if value and not value >> (ptr * 8 - 1):  # (the top bit marks an import by ordinal)
                    hint = at(value & 0x7FFFFFFF)
                    add(hint, 2 + cstring(hint + 2))
    if b.has_exports:
        e = b.get_export()
        add(rva(e.name_rva), cstring(rva(e.name_rva)))
        add(rva(e.export_addr_table_rva), 4 * e.export_addr_table_cnt)
        add(rva(e.names_addr_table_rva), 4 * e.names_addr_table_cnt)
        add(rva(e.ord_addr_table_rva), 2 * e.names_addr_table_cnt)
    for dbg in b.debug:
        add(rva(dbg.addressof_rawdata), dbg.sizeof_data)
    if b.has_configuration:
        lc = b.load_configuration
        stride = 4 + (((lc.guard_flags or 0) >> 28) & 0xF)
        for table, count, size in (
            (lc.guard_cf_function_table, lc.guard_cf_function_count, stride),
            (lc.se_handler_table, lc.se_handler_count, 4),
            (lc.guard_address_taken_iat_entry_table, lc.guard_address_taken_iat_entry_count, stride),
            (lc.guard_long_jump_target_table, lc.guard_long_jump_target_count, stride),
            (lc.guard_eh_continuation_table, lc.guard_eh_continuation_count, stride),
        ):
            if table and count:
                add(table, count * size)
    if b.has_tls:
        tls = b.tls
        if tls.addressof_callbacks:
            add(tls.addressof_callbacks, words(tls.addressof_callbacks))
        lo, hi = tls.addressof_raw_data
        add(lo, hi - lo)
        add(tls.addressof_index, 4)
    functions: list[tuple[int, int]] = []
    if arch == "x86-64" and b.has_exceptions:
        rows = [(base + f.rva_start, base + f.rva_end, base + f.unwind_rva) for f in b.exceptions]
        functions = sorted((lo, hi) for lo, hi, _u in rows if hi > lo)
        found += unwind_ranges(rows, read, functions)
    places = [(base + e.address, _enum(e.type)) for rb in b.relocations for e in rb.entries]
    if bits == 32:
        places = [(at, kind) for at, kind in places if kind != "DIR64"]
    pointer_ranges = relocation_ranges(places)
    found += pointer_ranges
    # strings a relocated word points to (outside the functions `.pdata` describes)
    fstarts = [lo for lo, _hi in functions]
    for at, kind in places:
        if kind not in ("DIR64", "HIGHLOW"):
            continue
        raw = read(at, 8 if kind == "DIR64" else 4)
        if raw is None or len(raw) < 4:
            continue
        value = struct.unpack("<Q" if len(raw) == 8 else "<I", raw)[0]
        if in_spans(spans, starts, value) and not in_spans(functions, fstarts, value):
            size = string_at(read, value, short=bool(functions))
            if size:
                found.append((value, value + size, "string"))
    if functions:  # x64 with `.pdata`: strings by their shape outside its functions
        for lo, hi in spans:
            raw = read(lo, hi - lo) or b""
            for s in shape_strings(raw, lo):
                if not in_spans(functions, fstarts, s[0]) and not in_spans(functions, fstarts, s[1] - 1):
                    found.append(s)
    # the file's claims of code win over its claims of data: hand-made files lay their entry point
    # and code over import and header structures, and x64 code may hold a relocated `mov r64, imm64`
    # (a claimed start's first instruction, up to 15 bytes, is code: hand-made files put the TLS
    # index slot in the operand of the entry point's `call`)
    claims = _code_claims(b, base, read, ptr) | set(fstarts)
    code = merge([(lo, hi, "code") for lo, hi in functions] + [(va, va + 15, "code") for va in claims])
    code_starts = [lo for lo, _hi, _k in code]
    found = [r for r in found if not _claimed(r, code, code_starts)]
    ranges = merge(found)
    if functions:  # (the bytes between two data items that no function separates are data too)
        ranges = merge(_close_gaps(ranges, functions, fstarts, code, code_starts))
    ranges = [r for r in ranges if not _claimed(r, code, code_starts)]
    return merge(clip(ranges, spans))


def _code_claims(b: Any, base: int, read: Reader, ptr: int) -> set[int]:
    """Addresses the file names as code: its entry point, exports, TLS callbacks, and the delay-load
    thunks a delay-import address table holds before the first call binds it."""
    out = set()
    word = struct.Struct("<Q" if ptr == 8 else "<I")
    if b.has_delay_imports:
        for di in b.delay_imports:
            iat = (base + di.iat if di.attribute & 1 else di.iat) if di.iat else 0  # (VC6: addresses)
            for i in range(len(di.entries) if iat else 0):
                raw = read(iat + i * ptr, ptr)
                if raw is not None and len(raw) == ptr and word.unpack(raw)[0]:
                    out.add(word.unpack(raw)[0])
    if b.optional_header.addressof_entrypoint:
        out.add(base + b.optional_header.addressof_entrypoint)
    if b.has_exports:
        out.update(base + e.address for e in b.get_export().entries if e.address and not e.is_extern)
    if b.has_tls:
        out.update(va for va in b.tls.callbacks if va)
    return out


def _claimed(r: DataRange, code: list[DataRange], code_starts: list[int]) -> bool:
    """Does the range overlap a range of `code` (sorted, disjoint; `code_starts`: their first addresses)?"""
    lo, hi, _k = r
    j = bisect.bisect_right(code_starts, lo) - 1
    return any(code[k][0] < hi and lo < code[k][1] for k in (j, j + 1) if 0 <= k < len(code))


def _close_gaps(
    ranges: list[DataRange],
    functions: list[tuple[int, int]],
    fstarts: list[int],
    code: list[DataRange],
    code_starts: list[int],
) -> list[DataRange]:
    """`ranges` with the gap to the next range filled where no function of `functions` (sorted
    (begin, end), `fstarts` their begins) and no claimed code (`code`, `_claimed`) lies in it, and
    the gap is less than `SMALL_GAP` bytes (padding and small fields between the data items found:
    lengths, flags, GUID parts, which would otherwise be left as islands of "code" a few bytes
    long) or lies before the first function or after the last one (MSVC lays out the merged data
    around the code: dhcpssvc's constant tables between its strings, before its first function)."""
    first = functions[0][0]
    last = max(hi for _lo, hi in functions)
    out = list(ranges)
    for (_lo, hi, kind), (nlo, _nhi, _k) in zip(ranges, ranges[1:], strict=False):
        if not 0 < nlo - hi < SMALL_GAP and not (nlo <= first or hi >= last):
            continue
        gap = (hi, nlo, kind)
        if (
            _none_between(fstarts, hi, nlo)
            and not in_spans(functions, fstarts, hi)
            and not _claimed(gap, code, code_starts)
        ):
            out.append(gap)
    return out
