"""Edits show everywhere: renames in references and the call graph; comments, prototypes and typed
globals in the listing (issue 5, "Edits show everywhere")."""

from __future__ import annotations

import pytest

from binlens.api import invoke


@pytest.fixture()
def opened(workspace, compile_c):
    workspace.open(compile_c("sample.c", "-O0"), check_roots=False)
    return workspace


def test_rename_shows_in_references_and_call_graph(opened):
    ws = opened
    invoke(ws, "function.patch", {"selector": {"name": "add_numbers"}, "name": "sum_with_counter"})
    refs = invoke(ws, "reference.list", {"address": "sum_with_counter", "direction": "to"})["items"]
    assert refs and {r["to_name"] for r in refs} == {"sum_with_counter"}
    assert "classify" in {r["function_name"] for r in refs}
    graph = invoke(ws, "callgraph.get", {"selector": {"name": "classify"}, "depth": 1})
    assert "sum_with_counter" in {n["name"] for n in graph["nodes"]}
    assert "add_numbers" not in {n["name"] for n in graph["nodes"]}
    # the renamed function's own references to strings and globals still name their targets
    invoke(ws, "journal.undo", {})
    graph = invoke(ws, "callgraph.get", {"selector": {"name": "classify"}, "depth": 1})
    assert "add_numbers" in {n["name"] for n in graph["nodes"]}


def test_comments_and_prototype_show_in_listing(opened):
    ws = opened
    fib = invoke(ws, "function.get", {"selector": {"name": "fib"}})
    start = fib["address"]
    second = invoke(ws, "instruction.list", {"scan": {"range": {"start": start, "end": hex(int(start, 16) + 64)}}})
    inner = second["items"][2]["address"]
    invoke(ws, "comment.create", {"selector": {"address": start}, "kind": "plate", "text": "Fibonacci, naively"})
    invoke(ws, "comment.create", {"selector": {"address": inner}, "kind": "pre", "text": "before the third one"})
    invoke(ws, "comment.create", {"selector": {"address": inner}, "kind": "eol", "text": "look here"})
    invoke(ws, "function.patch", {"selector": {"name": "fib"}, "prototype": "unsigned long fib(unsigned n)"})
    listing = invoke(ws, "listing.get", {"selector": {"name": "fib"}, "format": "both"})
    lines = listing["lines"]
    kinds = [(ln["kind"], ln["text"]) for ln in lines[:3]]
    assert kinds[0] == ("comment", "Fibonacci, naively")
    assert kinds[1][0] == "comment" and "fib(unsigned int n)" in kinds[1][1].replace("unsigned n", "unsigned int n")
    assert kinds[2] == ("label", "fib:")
    at_inner = [ln for ln in lines if ln["address"] == inner]
    assert [ln["kind"] for ln in at_inner] == ["comment", "instruction"]
    assert at_inner[0]["text"] == "before the third one"
    assert at_inner[1]["comment"].startswith("look here")
    assert "; Fibonacci, naively" in listing["text"] and "look here" in listing["text"]


def test_global_type_changes_how_listing_shows_data(opened):
    ws = opened
    before = invoke(ws, "listing.get", {"selector": {"name": "add_numbers"}})["text"]
    assert "counter: int = 7" not in before
    invoke(ws, "global_variable.create", {"selector": {"name": "counter"}, "type": "int"})
    after = invoke(ws, "listing.get", {"selector": {"name": "add_numbers"}})["text"]
    assert "counter: int = 7" in after
    invoke(ws, "global_variable.patch", {"selector": {"name": "counter"}, "type": "unsigned char"})
    retyped = invoke(ws, "listing.get", {"selector": {"name": "add_numbers"}})["text"]
    assert "counter: unsigned char = 7" in retyped
    invoke(ws, "memory.write", {"address": "counter", "data": "2a000000"})
    patched = invoke(ws, "listing.get", {"selector": {"name": "add_numbers"}})["text"]
    assert "counter: unsigned char = 42" in patched
