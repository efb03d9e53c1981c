"""Rules with one home that several layers share: a function's default name, address range sets,
permission and section-kind text, the JSON-RPC ids a transport echoes."""

from __future__ import annotations

import pytest

from binlens.analysis.intervals import IntervalSet
from binlens.analysis.model import Function, function_display_name
from binlens.loader.image import perms_text, section_kind
from binlens.server.wire import valid_id


def test_function_display_name_prefers_the_symbol_then_the_thunk() -> None:
    assert function_display_name(0x401000) == "sub_401000"
    assert function_display_name(0x401000, "main") == "main"
    assert function_display_name(0x401000, "_puts", "puts") == "_puts"
    assert function_display_name(0x401000, None, "puts") == "puts"


def test_engine_function_name_follows_the_same_rule() -> None:
    f = Function(address=0x1234, size=4, sources=("call",), symbol_name="_puts", thunk_name="puts")
    assert f.display_name() == function_display_name(0x1234, "_puts", "puts") == "_puts"
    assert Function(address=0x1234, size=4, sources=("call",)).display_name() == "sub_1234"


def test_interval_set_holds_each_range_half_open() -> None:
    s = IntervalSet([(0x2000, 0x10), (0x1000, 0x8)])
    assert [va for va in (0xFFF, 0x1000, 0x1007, 0x1008, 0x1FFF, 0x2000, 0x200F, 0x2010) if s(va)] == [
        0x1000,
        0x1007,
        0x2000,
        0x200F,
    ]
    assert s.ranges == [(0x2000, 0x10), (0x1000, 0x8)]
    assert not IntervalSet([])(0)


@pytest.mark.parametrize(
    ("bits", "nobits", "perms", "kind"),
    [
        ((True, False, True), False, "r-x", "code"),
        ((True, True, False), True, "rw-", "bss"),
        ((True, True, False), False, "rw-", "data"),
        ((False, False, False), False, "---", "other"),
    ],
)
def test_perms_and_section_kind(bits: tuple[bool, bool, bool], nobits: bool, perms: str, kind: str) -> None:
    assert perms_text(*bits) == perms
    assert section_kind(perms, nobits) == kind


def test_valid_id_is_a_string_or_an_integer_not_a_bool() -> None:
    assert valid_id("a") and valid_id(0) and valid_id(-3)
    assert not any(valid_id(v) for v in (True, False, None, 1.5, [], {}))
