"""Durability: a SIGKILL in the middle of a 1000-item batch, and two processes editing one program."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from binlens.api import invoke
from binlens.workspace import Config, Workspace
from conftest import ROOT


def child_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["BINLENS_HOME"] = str(home)
    return env


def start_query(home: Path, binary: Path, request: dict[str, Any]) -> subprocess.Popen[str]:
    """`binlens query -b BINARY -` in a real child process, the request on stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "binlens", "query", "-b", str(binary), "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(home),
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(request))
    proc.stdin.close()
    return proc


def file_backed_addresses(prog: Any, count: int) -> list[int]:
    out: list[int] = []
    for r in prog.image.regions:
        for va in range(r.va, r.va + r.fsize):
            out.append(va)
            if len(out) == count:
                return out
    raise AssertionError("not enough file-backed bytes")


def journal_count(db_path: Path) -> int:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute("SELECT count(*) FROM ann_journal").fetchone()[0]
    finally:
        conn.close()


def test_sigkill_mid_batch_loses_no_committed_item_and_half_applies_none(home, compile_c):
    binary = compile_c("sample.c", "-O0")
    ws = Workspace(Config(home=home))
    prog = ws.open(binary, check_roots=False)
    db_path = prog.db.path
    addrs = file_backed_addresses(prog, 1000)
    # each item writes two rows (a typed global and its name) in one journal entry
    items = [
        {
            "method": "global_variable.create",
            "params": {"selector": {"address": hex(va)}, "type": "unsigned char", "name": f"g_{i}"},
        }
        for i, va in enumerate(addrs)
    ]
    request = {"method": "batch.execute", "params": {"mode": "per_item", "include_results": False, "items": items}}
    proc = start_query(home, binary, request)
    deadline = time.monotonic() + 60
    threshold = random.randint(50, 500)  # somewhere in the middle of the batch
    while journal_count(db_path) < threshold:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the batch did not start"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # restart: a new workspace opens the database and reads it
    ws2 = Workspace(Config(home=home))
    prog2 = ws2.open(binary, check_roots=False)
    conn = prog2.db.connect()
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    journal = invoke(ws2, "journal.list", {"page": {"limit": 1000}})["items"]
    committed = len(journal)
    assert threshold <= committed < 1000, f"the kill landed after {committed} items"
    print(f"SIGKILL after {committed} committed items")
    globals_ = {int(k, 16) for k in (g["address"] for g in _all_globals(ws2))}
    names = dict(conn.execute("SELECT address, name FROM ann_name").fetchall())
    journaled = set()
    for entry in journal:
        assert entry["method"] == "global_variable.create" and entry["batch"] is not None
        kinds = sorted(c["kind"] for c in entry["changes"])
        assert kinds == ["global", "name"], entry  # never one row without the other
        va = entry["changes"][0]["key"][0]
        journaled.add(va)
        assert va in globals_ and names[va] == f"g_{addrs.index(va)}"
    # committed items are exactly a prefix of the batch: nothing else was written
    assert journaled == set(addrs[:committed])
    assert globals_ == journaled and set(names) == journaled
    assert prog2.user_names == names  # loaded on open


def _all_globals(ws: Workspace) -> list[dict[str, Any]]:
    out, cursor = [], None
    while True:
        page = invoke(ws, "global_variable.list", {"page": {"limit": 1000, **({"cursor": cursor} if cursor else {})}})
        out += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return out


def test_two_processes_edit_one_program(home, compile_c):
    binary = compile_c("sample.c", "-O0")
    ws = Workspace(Config(home=home))
    ws.open(binary, check_roots=False)
    shared = ["main", "fib", "classify", "apply", "checksum"]

    def request(tag: str) -> dict[str, Any]:
        items = []
        for round_ in range(15):
            for name in shared:  # both clients write the same keys: last writer wins per item
                items.append(
                    {
                        "method": "comment.upsert",
                        "params": {"selector": {"name": name}, "text": f"{tag} {round_}"},
                    }
                )
            items.append(
                {"method": "bookmark.create", "params": {"selector": {"name": "main"}, "category": f"{tag}{round_}"}}
            )
        return {"method": "batch.execute", "params": {"mode": "per_item", "include_results": False, "items": items}}

    a = start_query(home, binary, request("A"))
    b = start_query(home, binary, request("B"))
    outs = []
    for p in (a, b):
        assert p.stdout is not None
        outs.append(json.loads(p.stdout.read()))
        p.wait(timeout=120)
    for out in outs:
        assert out["result"]["failed"] == 0, out
    ws2 = Workspace(Config(home=home))
    prog = ws2.open(binary, check_roots=False)
    assert prog.db.connect().execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    journal = invoke(ws2, "journal.list", {"page": {"limit": 1000}})["items"]
    clients = {e["client"] for e in journal}
    assert len(clients) == 2
    for client in clients:
        mine = invoke(ws2, "journal.list", {"client": client, "method": "bookmark.create", "page": {"limit": 1000}})
        assert (
            len(mine["items"]) == 15
            and {e["client"] for e in mine["items"]} == {client}
            and {e["method"] for e in journal} == {"comment.upsert", "bookmark.create"}
        )
    assert len([e for e in journal if e["method"] == "bookmark.create"]) == 30
    # every comment's text is the `after` of the last journal entry that touched it
    last: dict[int, str] = {}
    for e in journal:
        for c in e["changes"]:
            if c["kind"] == "comment":
                last[c["key"][0]] = c["after"]["text"]
    comments = invoke(ws2, "comment.list", {})["items"]
    assert {int(c["address"], 16): c["text"] for c in comments} == last
    assert len(last) == len(shared)
    # each entry's `before` is what the entry before it on that key left behind: no lost update
    seen: dict[int, Any] = {}
    for e in journal:
        for c in e["changes"]:
            if c["kind"] == "comment":
                assert c["before"] == seen.get(c["key"][0])
                seen[c["key"][0]] = c["after"]


def test_two_threads_with_their_own_workspace(home, compile_c):
    import threading

    binary = compile_c("sample.c", "-O0")
    spaces = [Workspace(Config(home=home)) for _ in range(2)]
    for w in spaces:
        w.open(binary, check_roots=False)
    errors: list[BaseException] = []

    def work(w: Workspace, tag: str) -> None:
        try:
            for i in range(40):
                invoke(w, "comment.upsert", {"selector": {"name": "fib"}, "text": f"{tag}{i}"})
                invoke(w, "bookmark.create", {"selector": {"name": "fib"}, "category": f"{tag}{i}"})
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=work, args=(w, t)) for w, t in zip(spaces, "XY", strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    journal = invoke(spaces[0], "journal.list", {"page": {"limit": 1000}})["items"]
    assert len(journal) == 160
    final = invoke(spaces[1], "comment.get", {"selector": {"name": "fib"}})["text"]
    assert final == [c for e in journal for c in e["changes"] if c["kind"] == "comment"][-1]["after"]["text"]
    # a rename made through one workspace shows in the other
    invoke(spaces[0], "symbol.patch", {"selector": {"name": "fib"}, "name": "fibonacci"})
    assert invoke(spaces[1], "comment.get", {"selector": {"name": "fibonacci"}})["name"] == "fibonacci"


if sys.platform != "linux":  # SIGKILL semantics
    pytestmark = pytest.mark.skip("POSIX signals")
