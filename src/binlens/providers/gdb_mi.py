"""GDB/MI records as pygdbmi parses them, with a fast path for the common shape.

pygdbmi's parser reads a record a character at a time in Python: about 0.5 ms for a register
list or a 4 KiB memory read, most of a debug call's time beyond gdb's own. Result, exec and
notify records without a backslash (no C escapes to undo: registers, memory, frames, stops) are
tokenised here by one regular expression and built into the very structure pygdbmi builds
(tuples as dicts, a repeated key's values gathered in a list, a list of results as the list of
its values); anything else (stream records, escaped strings, a line of another shape) goes to
pygdbmi. tests/test_gdb_mi.py holds the two to the same answers on real gdb output.
"""

from __future__ import annotations

import json
import re
from typing import Any

_RECORD = re.compile(r"(\d+)?([\^*=])([^,\s]+?)(,.*)?")
_KEY = re.compile(r"([A-Za-z_][\w-]*)=")
_PUNCTUATION = re.compile(r"[{}\[\],\x01]*")
_LIST_OF_RESULTS = re.compile(r"\[[A-Za-z_][\w-]*=")
_TOKEN = re.compile(r'"([^"\\]*)"|([A-Za-z_][\w-]*)=|([{}\[\],])')


class _Shape(Exception):
    """The line is not in the fast path's shape (pygdbmi parses it)."""


def parse_record(line: str) -> dict[str, Any]:
    """One MI output line as pygdbmi's `parse_response` answers it."""
    record = fast_record(line)
    if record is not None:
        return record
    from pygdbmi.gdbmiparser import parse_response

    return parse_response(line)


def fast_record(line: str) -> dict[str, Any] | None:
    """A result, exec or notify record without a backslash, parsed here; None for any other line."""
    if "\\" in line:
        return None
    m = _RECORD.fullmatch(line)
    if m is None:
        return None
    try:
        payload = _payload(m.group(4)[1:]) if m.group(4) else None
    except _Shape:
        return None
    return {
        "type": "result" if m.group(2) == "^" else "notify",
        "message": m.group(3),
        "payload": payload,
        "token": int(m.group(1)) if m.group(1) else None,
    }


def _tokens(text: str) -> list[tuple[str, str]]:
    """("s", string) | ("k", key) | ("p", punctuation), covering `text` whole."""
    out: list[tuple[str, str]] = []
    at = 0
    for m in _TOKEN.finditer(text):
        if m.start() != at:
            raise _Shape
        at = m.end()
        if m.group(1) is not None:
            out.append(("s", m.group(1)))
        elif m.group(2) is not None:
            out.append(("k", m.group(2)))
        else:
            out.append(("p", m.group(3)))
    if at != len(text):
        raise _Shape
    return out


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    obj = {}
    for key, val in pairs:  # a repeated key, as `_results` gathers it
        if key in obj:
            if isinstance(obj[key], list):
                obj[key].append(val)
            else:
                obj[key] = [obj[key], val]
        else:
            obj[key] = val
    return obj


def _quote_keys(outside: str) -> str:
    """`key=` as `"key":` in MI's text outside its strings (each string is one \\x01 here): a key
    starts a result, after `{`, after a comma that is not before a value, or at the start."""
    o = outside.replace("=", '":').replace("{}", "\x02").replace("{", '{"').replace(",", ',"')
    o = o.replace(',"{', ",{").replace(',"[', ",[").replace(',"\x01', ",\x01").replace("\x02", "{}")
    return o if o[:1] in ("", "{", "[", "\x01") else '"' + o


def _payload(text: str) -> dict[str, Any]:
    """The results after a record's first comma. Outside its strings (which hold no quote here:
    no backslash, no escaped quote) MI is JSON with `key=` for `"key":`, so it is read by the json
    module; a list of results (`[frame={...},...]`, not JSON's shape) is read token by token."""
    parts = text.split('"')
    if len(parts) % 2 == 0:
        raise _Shape
    outside = "\x01".join(parts[0::2])
    plain = _PUNCTUATION.fullmatch(_KEY.sub("", outside)) is not None  # (no numbers, words, spaces)
    if plain and _LIST_OF_RESULTS.search(outside) is None and "\x01" not in text:
        parts[0::2] = _quote_keys(outside).split("\x01")
        try:
            value = json.loads("{" + '"'.join(parts) + "}", strict=False, object_pairs_hook=_pairs)
        except ValueError:
            raise _Shape from None
        if isinstance(value, dict):
            return value
        raise _Shape
    toks = _tokens(text)
    value, at = _results(toks, 0, None)
    if at != len(toks):
        raise _Shape
    return value


def _results(toks: list[tuple[str, str]], at: int, close: str | None) -> tuple[dict[str, Any], int]:
    """`key=value` pairs separated by commas up to `close` (or the end); a repeated key's values
    are gathered in a list (pygdbmi's way, appending to a list the first value already is)."""
    obj: dict[str, Any] = {}
    n = len(toks)
    while at < n:
        kind, text = toks[at]
        if kind == "p" and text == close:
            return obj, at + 1
        if kind != "k":
            raise _Shape
        val, at = _value(toks, at + 1)
        if text in obj:
            if isinstance(obj[text], list):
                obj[text].append(val)
            else:
                obj[text] = [obj[text], val]
        else:
            obj[text] = val
        if at < n and toks[at] == ("p", ","):
            at += 1
        elif not (at < n and toks[at] == ("p", close)) and not (close is None and at == n):
            raise _Shape
    if close is not None:
        raise _Shape
    return obj, at


def _value(toks: list[tuple[str, str]], at: int) -> tuple[Any, int]:
    if at >= len(toks):
        raise _Shape
    kind, text = toks[at]
    if kind == "s":
        return text, at + 1
    if text == "{":
        return _results(toks, at + 1, "}")
    if text == "[":
        return _list(toks, at + 1)
    raise _Shape


def _list(toks: list[tuple[str, str]], at: int) -> tuple[list[Any], int]:
    """Values (or `key=value` results, whose keys pygdbmi drops) separated by commas up to `]`."""
    arr: list[Any] = []
    n = len(toks)
    while at < n:
        kind, text = toks[at]
        if kind == "p" and text == "]":
            return arr, at + 1
        if kind == "k":
            at += 1
        val, at = _value(toks, at)
        arr.append(val)
        if at < n and toks[at] == ("p", ","):
            at += 1
        elif not (at < n and toks[at] == ("p", "]")):
            raise _Shape
    raise _Shape
