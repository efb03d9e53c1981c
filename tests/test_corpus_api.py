"""corpus.* (docs/CORPUS.md): the methods in process over the SQLite store, errors and read-only,
and two `binlens serve` processes on two homes sharing one real PostgreSQL corpus store."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from binlens.api import invoke
from binlens.corpus.records import BinaryRecord, FileFailure
from binlens.corpus.store import open_store
from binlens.errors import BinlensError
from conftest import run_cli
from corpus_support import record_of
from serve_support import ServerProcess, env_for, ws_reply


def _workspace(home: Path, **kw: Any):
    from binlens.api import REGISTRY  # noqa: F401 - registers the domains
    from binlens.workspace import Config, Workspace

    return Workspace(Config(home=home, **kw))


@pytest.fixture(scope="module")
def built(compile_c, tmp_path_factory) -> dict[str, tuple[Path, BinaryRecord]]:
    """cmp_v1.c at -O2 and -O3, sample.c and strings.c at -O2: their files and corpus records."""
    ws = _workspace(tmp_path_factory.mktemp("records-home"))
    out = {}
    for key, src, opt in (("v1", "cmp_v1.c", "-O2"), ("v1o3", "cmp_v1.c", "-O3"), ("sample", "sample.c", "-O2")):
        path = compile_c(src, opt=opt)
        out[key] = (path, record_of(ws, path))
    out["strings"] = (compile_c("strings.c"), record_of(ws, compile_c("strings.c")))
    return out


def _error(ws: Any, name: str, params: dict[str, Any]) -> BinlensError:
    with pytest.raises(BinlensError) as e:
        invoke(ws, name, params)
    return e.value


def test_methods_over_the_sqlite_store(tmp_path, built):
    home = tmp_path / "home"
    with open_store(None, home) as store:
        for key in ("v1", "sample"):
            store.add_binary("lab", built[key][1])
        store.add_failure("lab", FileFailure("/x/broken", None, "unsupported_format", "not a binary"))
    ws = _workspace(home)
    listed = invoke(ws, "corpus.list", {})
    assert listed["store"]["kind"] == "sqlite" and listed["store"]["location"] == str(home / "corpus.sqlite")
    assert [(c["name"], c["binaries"]) for c in listed["items"]] == [("lab", 2)]
    got = invoke(ws, "corpus.get", {"corpus": "lab"})
    assert got["state"] == "indexed_with_failures" and got["failures"] == 1
    assert got["functions"] == len(built["v1"][1].functions) + len(built["sample"][1].functions)
    assert got["failed_files"] == [
        {"path": "/x/broken", "sha256": None, "code": "unsupported_format", "message": "not a binary"}
    ]
    hits = invoke(ws, "corpus.search_string", {"corpus": "lab", "text": "bad header"})["items"]
    assert [h["file"] for h in hits] == [str(built["v1"][0])]
    hits = invoke(ws, "corpus.search_import", {"corpus": "lab", "name": "fprintf"})["items"]
    assert {h["sha256"] for h in hits} == {
        r.sha256 for _p, r in (built["v1"], built["sample"]) if "fprintf" in r.imports
    }
    # a function of the -O3 build, searched by selector on the served program
    prog = invoke(ws, "program.open", {"path": str(built["v1o3"][0])})["identity"]["program"]
    found = invoke(
        ws, "corpus.search_function", {"corpus": "lab", "program": prog, "selector": {"name": "parse_header"}}
    )
    assert found["query"]["name"] == "parse_header"
    top = found["items"][0]
    assert (top["function"], top["sha256"], top["file"]) == ("parse_header", built["v1"][1].sha256, str(built["v1"][0]))
    assert top["similarity"] > 0.5
    assert all(0.0 <= h["similarity"] <= 1.0 for h in found["items"])
    removed = invoke(ws, "corpus.remove", {"corpus": "lab"})["removed"]
    assert removed["binaries"] == 2
    assert invoke(ws, "corpus.list", {})["items"] == []


def test_search_function_by_function_evidence(tmp_path, built):
    home = tmp_path / "home"
    with open_store(None, home) as store:
        store.add_binary("lab", built["v1"][1])
    ws = _workspace(home)
    invoke(ws, "program.open", {"path": str(built["v1o3"][0])})
    rec = invoke(ws, "evidence.record", {"method": "function.get", "params": {"selector": {"name": "classify"}}})
    found = invoke(ws, "corpus.search_function", {"corpus": "lab", "evidence_id": rec["evidence_id"]})
    assert found["items"][0]["function"] == "classify"
    other = invoke(ws, "evidence.record", {"method": "program.list", "params": {}})
    err = _error(ws, "corpus.search_function", {"corpus": "lab", "evidence_id": other["evidence_id"]})
    assert (err.code, err.target) == ("invalid_argument", "/params/evidence_id")
    missing = "ev_" + "0" * 64
    err = _error(ws, "corpus.search_function", {"corpus": "lab", "evidence_id": missing})
    assert (err.code, err.target) == ("not_found", "/params/evidence_id")


def test_bad_input_is_a_clear_error(tmp_path, built):
    home = tmp_path / "home"
    with open_store(None, home) as store:
        store.add_binary("lab", built["v1"][1])
    ws = _workspace(home)
    err = _error(ws, "corpus.get", {"corpus": "nope"})
    assert (err.code, err.target) == ("not_found", "/params/corpus")
    err = _error(ws, "corpus.search_string", {"corpus": "lab", "text": "x", "limit": 0})
    assert (err.code, err.target) == ("invalid_argument", "/params/limit")
    err = _error(ws, "corpus.search_string", {"corpus": "lab", "text": "x", "mode": "regex"})
    assert (err.code, err.target) == ("invalid_argument", "/params/mode")
    err = _error(ws, "corpus.search_import", {"corpus": "../etc", "name": "x"})
    assert (err.code, err.target) == ("invalid_argument", "/params/corpus")
    invoke(ws, "program.open", {"path": str(built["v1"][0])})
    err = _error(ws, "corpus.search_function", {"corpus": "lab"})
    assert err.code == "invalid_argument"
    err = _error(ws, "corpus.search_function", {"corpus": "lab", "selector": {"name": "no_such_function"}})
    assert (err.code, err.target) == ("not_found", "/params/selector/name")
    # a PostgreSQL store nobody listens on: unavailable, then usable once it is (the next call connects again)
    down = _workspace(home, corpus_store="postgresql://binlens@127.0.0.1:1/postgres?connect_timeout=3")
    err = _error(down, "corpus.list", {})
    assert (err.code, err.target) == ("unavailable", "/params/corpus")
    assert "could not reach the PostgreSQL corpus store" in err.message


def test_remove_is_refused_on_a_read_only_server(tmp_path, built):
    home = tmp_path / "home"
    with open_store(None, home) as store:
        store.add_binary("lab", built["v1"][1])
    ws = _workspace(home, read_only=True)
    err = _error(ws, "corpus.remove", {"corpus": "lab"})
    assert err.code == "unavailable" and "read-only" in str(err.details), err.details
    from binlens.api.registry import REGISTRY

    assert REGISTRY["corpus.remove"].mutates  # (listed, marked as a mutation)
    assert invoke(ws, "corpus.get", {"corpus": "lab"})["binaries"] == 1


def _result(reply: dict[str, Any]) -> Any:
    assert "result" in reply, reply
    return reply["result"]


def test_two_servers_on_two_homes_share_one_postgresql_corpus(tmp_path, built, postgres_server):
    url = postgres_server.database("shared" + uuid.uuid4().hex[:8])
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    path_a, rec_a = built["v1"]
    path_b, rec_b = built["v1o3"]
    store_args = ("--corpus-store", url)
    with (
        ServerProcess(home_a, str(path_a), *store_args, env=env_for(home_a)) as srv_a,
        ServerProcess(home_b, str(path_b), *store_args, env=env_for(home_b)) as srv_b,
    ):
        # A's binary, written with home A; B sees it
        with open_store(url, home_a) as store:
            assert store.add_binary("team", rec_a)
        got = _result(ws_reply(srv_b.ws_url, "corpus.get", {"corpus": "team"}))
        assert (got["binaries"], got["store"]["kind"]) == (1, "postgresql")
        assert "@" in got["store"]["location"]
        found = _result(
            ws_reply(srv_b.ws_url, "corpus.search_function", {"corpus": "team", "selector": {"name": "checksum"}})
        )
        assert found["items"][0]["function"] == "checksum" and found["items"][0]["sha256"] == rec_a.sha256
        # and B's binary, written with home B; A sees it
        with open_store(url, home_b) as store:
            assert store.add_binary("team", rec_b)
        listed = _result(ws_reply(srv_a.ws_url, "corpus.list", {}))
        assert [(c["name"], c["binaries"]) for c in listed["items"]] == [("team", 2)]
        found = _result(
            ws_reply(
                srv_a.ws_url, "corpus.search_function", {"corpus": "team", "selector": {"name": "classify"}, "limit": 5}
            )
        )
        assert {h["sha256"] for h in found["items"] if h["function"] == "classify"} == {rec_a.sha256, rec_b.sha256}
        hits = _result(ws_reply(srv_a.ws_url, "corpus.search_string", {"corpus": "team", "text": "bad header"}))[
            "items"
        ]
        assert {h["sha256"] for h in hits} == {rec_a.sha256, rec_b.sha256}
        reply = ws_reply(srv_a.ws_url, "corpus.get", {"corpus": "nope"})
        assert reply["error"]["data"]["code"] == "not_found" and reply["error"]["data"]["target"] == "/params/corpus"
    assert not (home_a / "corpus.sqlite").exists() and not (home_b / "corpus.sqlite").exists()


def test_the_corpus_command_reads_the_store(tmp_path, built, postgres_server):
    url = postgres_server.database("cli" + uuid.uuid4().hex[:8])
    home = tmp_path / "home"
    with open_store(url, tmp_path / "elsewhere") as store:
        store.add_binary("lab", built["v1"][1])
    done = run_cli("corpus", "list", "--json", "--corpus-store", url, home=home)
    assert done.returncode == 0, done.stderr
    assert [c["name"] for c in json.loads(done.stdout)["items"]] == ["lab"]
    done = run_cli("corpus", "--corpus-store", url, "search-string", "bad header", "--corpus", "lab", home=home)
    assert done.returncode == 0 and str(built["v1"][0]) in done.stdout, done.stderr
    path = str(built["v1o3"][0])
    done = run_cli("corpus", "search-function", path, "checksum", "--corpus", "lab", "--json", "--corpus-store", url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["items"][0]["function"] == "checksum"
    done = run_cli("corpus", "get", "nope", "--corpus-store", url, home=home)
    assert done.returncode == 1 and "no corpus named 'nope'" in done.stderr
    for command in (("corpus", "list"), ("serve", "--port", "0"), ("mcp",)):
        done = run_cli(*command, "--corpus-store", "mysql://x", home=home)
        assert done.returncode == 2 and "--corpus-store" in done.stderr, command
    done = run_cli("corpus", "remove", "lab", "--corpus-store", url, home=home)
    assert done.returncode == 0 and "removed corpus lab: 1 binaries" in done.stdout
    assert not (home / "corpus.sqlite").exists()


def test_search_function_brings_the_query_programs_inlining_context(tmp_path, compile_c):
    """corpus.search_function hands the store the served program's functions: a small function
    whose helper the stored build inlined is found through its own inlined view."""
    ws = _workspace(tmp_path / "home")
    stored = compile_c("inline_ctx.c", opt="-O3")
    with open_store(None, tmp_path / "home") as store:
        store.add_binary("lab", record_of(ws, stored))
        for src in ("cmp_v1.c", "sample.c", "strings.c"):
            store.add_binary("lab", record_of(ws, compile_c(src)))
    served = compile_c("inline_ctx.c", opt="-O2", extra=("-fno-inline",))
    prog = invoke(ws, "program.open", {"path": str(served)})["identity"]["program"]
    for name in ("read_record", "checksum_block", "densest_row", "total_weight"):
        found = invoke(ws, "corpus.search_function", {"corpus": "lab", "program": prog, "selector": {"name": name}})
        top = found["items"][0]
        assert (top["function"], top["file"]) == (name, str(stored)), found["items"][:3]
