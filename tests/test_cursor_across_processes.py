"""Page cursors are signed with a key kept under BINLENS_HOME, so one-shot CLI runs can page."""

from __future__ import annotations

import base64
import json
import multiprocessing
import stat
import sys
from pathlib import Path

from conftest import ROOT, run_cli


def query(home: Path, binary: Path, request: dict[str, object]) -> dict:
    """One real `binlens query` process; its parsed JSON answer."""
    r = run_cli("query", "-b", str(binary), json.dumps(request), home=home)
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def functions(page: dict[str, object]) -> dict[str, object]:
    """A function.list request for one page."""
    return {"method": "function.list", "params": {"page": page}}


def test_a_cursor_from_one_query_process_pages_on_in_the_next(home: Path, compile_c) -> None:  # noqa: ANN001
    sample = compile_c("sample.c", "-O2")
    whole = query(home, sample, functions({"limit": 1000}))["result"]["items"]
    assert len(whole) >= 4
    first = query(home, sample, functions({"limit": 2}))["result"]
    assert first["next_cursor"], first
    second = query(home, sample, functions({"limit": 2, "cursor": first["next_cursor"]}))
    assert "error" not in second, second
    assert [f["address"] for f in first["items"] + second["result"]["items"]] == [f["address"] for f in whole[:4]]
    key = home / "cursor.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.stat().st_size == 32


def test_a_tampered_cursor_is_refused_by_the_next_process(home: Path, compile_c) -> None:  # noqa: ANN001
    sample = compile_c("sample.c", "-O2")
    cursor = query(home, sample, functions({"limit": 1}))["result"]["next_cursor"]
    raw = bytearray(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    raw[-3] ^= 0x01  # one bit of the signed body
    tampered = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    for bad in (tampered, "bogus"):
        err = query(home, sample, functions({"limit": 1, "cursor": bad}))["error"]
        assert err["code"] == "invalid_argument", err
        assert err["target"] == "/params/page/cursor", err


def test_a_cursor_stays_bound_to_its_query(home: Path, compile_c) -> None:  # noqa: ANN001
    sample = compile_c("sample.c", "-O2")
    cursor = query(home, sample, functions({"limit": 1}))["result"]["next_cursor"]
    other = {"method": "function.list", "params": {"name": "*", "page": {"limit": 1, "cursor": cursor}}}
    err = query(home, sample, other)["error"]
    assert err["code"] == "invalid_argument" and err["target"] == "/params/page/cursor", err
    assert "different query" in err["message"]


def _key_in_child(home: str, out: multiprocessing.Queue[bytes]) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from binlens.store.secret import home_key

    out.put(home_key(Path(home), "cursor.key"))


def test_processes_creating_the_key_at_once_agree(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(3):
        home = tmp_path / f"h{round_}"
        out: multiprocessing.Queue[bytes] = ctx.Queue()
        procs = [ctx.Process(target=_key_in_child, args=(str(home), out)) for _ in range(6)]
        for p in procs:
            p.start()
        keys = {out.get(timeout=120) for _ in procs}
        for p in procs:
            p.join(timeout=120)
        assert len(keys) == 1
        assert keys == {(home / "cursor.key").read_bytes()}
        assert [p.name for p in home.iterdir()] == ["cursor.key"]  # no temporary file left behind
