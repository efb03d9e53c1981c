"""Decompilation through the angr provider (SPEC §7): real angr on a binary the test compiles.

One workspace (so one warm angr process) serves the module's tests in order; each test that edits
annotations undoes its edits. Needs the `decompile` extra (`make test` installs it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from binlens.api import invoke
from binlens.errors import BinlensError
from binlens.providers import registry as providers
from binlens.workspace import Config, Workspace
from conftest import run_cli

pytestmark = pytest.mark.timeout(300)
if importlib.util.find_spec("angr") is None:  # (not imported here: the provider imports it in its own process)
    pytest.skip("the angr provider needs `pip install 'binlens[decompile]'`", allow_module_level=True)

FN = {"name": "score_items"}


@pytest.fixture(scope="module")
def binary(compile_c: Any) -> Path:
    return compile_c("decompile.c", "-O2")


@pytest.fixture(scope="module")
def ws(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    from binlens.api import REGISTRY  # noqa: F401 - registers the domains

    home = tmp_path_factory.mktemp("decompile-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BINLENS_HOME", str(home))
        workspace = Workspace(Config(home=home))
        prog = workspace.open(binary, check_roots=False)
        yield workspace
        workspace.close(prog.handle)  # (its angr process exits with it)


def get(ws: Workspace, **params: Any) -> dict[str, Any]:
    return invoke(ws, "decompilation.get", {"selector": FN, "timeout_ms": 120000, **params})


def fails(code: str, ws: Workspace, method: str, params: dict[str, Any]) -> BinlensError:
    with pytest.raises(BinlensError) as info:
        invoke(ws, method, params)
    assert info.value.code == code, info.value.to_dict()
    return info.value


def undo(ws: Workspace, count: int = 1) -> None:
    invoke(ws, "journal.undo", {"count": count})


def test_provider_list_reports_angr(ws: Workspace) -> None:
    (item,) = invoke(ws, "provider.list", {"kind": "decompiler"})["items"]
    assert item["id"] == "angr" and item["available"] is True and item["version"].startswith("9.2.")


def test_a_loop_and_a_switch_decompile_and_the_second_call_is_cached(ws: Workspace) -> None:
    first = get(ws)
    code = first["code"]
    assert first["provider"]["id"] == "angr" and first["cached"] is False
    assert "score_items(" in code and re.search(r"mix_value\(\w", code)  # the callee by name, with its argument
    assert "12648430" in code or "0xc0ffee" in code.lower()  # the default case's constant
    assert "switch" in code and ("while" in code or "for" in code)
    assert any("approximate" in w for w in first["warnings"])
    # the lines map covers the function's instructions: every mapped address is inside it
    listing = invoke(ws, "listing.get", {"selector": FN, "format": "lines"})
    instructions = {int(ln["address"], 16) for ln in listing["lines"] if ln["kind"] == "instruction"}
    mapped = {int(a, 16) for ln in first["lines"] for a in ln["addresses"]}
    assert mapped <= instructions and len(mapped) >= len(instructions) // 2
    assert {v["storage"] for v in first["variables"]} >= {"arg:0", "arg:1", "arg:2"}
    again = get(ws)
    assert again["cached"] is True and again["code"] == code


def test_renaming_a_callee_shows_and_undo_restores(ws: Workspace) -> None:
    get(ws)
    invoke(ws, "symbol.patch", {"selector": {"name": "mix_value"}, "name": "hash_step"})
    renamed = get(ws)
    assert renamed["cached"] is False and "hash_step(" in renamed["code"] and "mix_value(" not in renamed["code"]
    undo(ws)
    restored = get(ws)
    assert "mix_value(" in restored["code"] and "hash_step(" not in restored["code"]


def test_a_prototype_shows_in_the_signature(ws: Workspace) -> None:
    invoke(ws, "function.patch", {"selector": FN, "prototype": "int score_items(int *items, int count, int mode)"})
    typed = get(ws)
    assert "int *items" in typed["code"] and "int count" in typed["code"] and typed["cached"] is False
    undo(ws)
    assert "int *items" not in get(ws)["code"]


def test_a_local_variable_edit_survives_re_decompilation_and_undo_restores(ws: Workspace) -> None:
    items = invoke(ws, "function_local_variable.list", {"selector": FN})["items"]
    local = next(v for v in items if not v["storage"].startswith("arg:"))
    assert not any(v["edited"] for v in items)
    invoke(ws, "function_local_variable.patch", {"selector": FN, "storage": "arg:1", "name": "count_of_items"})
    invoke(ws, "function_local_variable.patch", {"selector": FN, "storage": local["storage"], "name": "running"})
    edited = get(ws)
    assert edited["cached"] is False
    assert "count_of_items" in edited["code"] and "running" in edited["code"]
    # another edit makes angr decompile again: the variable edits are applied again by storage
    invoke(ws, "symbol.patch", {"selector": {"name": "mix_value"}, "name": "hash_step"})
    fresh = get(ws)
    assert fresh["cached"] is False and "count_of_items" in fresh["code"] and "running" in fresh["code"]
    listed = invoke(ws, "function_local_variable.list", {"selector": FN})["items"]
    assert {v["storage"]: v["name"] for v in listed if v["edited"]} == {
        "arg:1": "count_of_items",
        local["storage"]: "running",
    }
    undo(ws, 3)
    back = get(ws)
    assert "count_of_items" not in back["code"] and "running" not in back["code"]
    err = fails(
        "invalid_argument", ws, "function_local_variable.patch", {"selector": FN, "storage": "arg:1", "name": "1x"}
    )
    assert err.target == "/params/name"
    fails("invalid_argument", ws, "function_local_variable.patch", {"selector": FN, "storage": "arg:1"})


def test_comments_show_at_their_lines_without_a_decompilation(ws: Workspace) -> None:
    base = get(ws)
    line = next(ln for ln in base["lines"] if ln["addresses"])
    address = line["addresses"][0]
    invoke(ws, "comment.create", {"selector": {"address": address}, "kind": "eol", "text": "counted here"})
    noted = get(ws)
    assert noted["cached"] is True  # a comment is laid over the cached code
    row = next(ln for ln in noted["lines"] if address in ln["addresses"])
    assert noted["code"].split("\n")[row["line"] - 1].endswith("// counted here")
    undo(ws)


def test_long_code_pages_by_byte_offset(ws: Workspace) -> None:
    whole = get(ws)["code"]
    pages, offset = [], 0
    while offset is not None:
        page = get(ws, offset=offset, max_bytes=1024)
        pages.append(page["code"])
        assert page["fragment"] is True
        offset = page["next_offset"]
    assert len(pages) > 1 and "".join(pages) == whole


def test_a_timeout_is_an_error_result_and_the_next_call_works(ws: Workspace) -> None:
    err = fails("timeout", ws, "decompilation.get", {"selector": {"name": "main"}, "timeout_ms": 100})
    assert err.details["provider"] == "angr" and err.details["reason"] == "timeout"
    after = invoke(ws, "decompilation.get", {"selector": {"name": "main"}, "timeout_ms": 120000})
    assert "main(" in after["code"] and "printf" in after["code"]


def test_without_angr_the_method_answers_unavailable(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    angr = providers.get("angr")
    assert angr is not None
    monkeypatch.setattr(angr, "distribution", "binlens-test-no-such-angr")
    (item,) = invoke(ws, "provider.list", {"kind": "decompiler"})["items"]
    assert item["available"] is False and item["remediation"] == "pip install 'binlens[decompile]'"
    err = fails("unavailable", ws, "decompilation.get", {"selector": FN})
    assert err.details["remediation"] == "pip install 'binlens[decompile]'"
    assert err.details["reason"] == "angr is not installed"


def test_cli_decompile_prints_plain_code_when_piped(binary: Path, tmp_path: Path) -> None:
    done = run_cli("decompile", str(binary), "score_items", home=tmp_path / "home", timeout=240)
    assert done.returncode == 0, done.stderr
    assert "score_items(" in done.stdout and "\x1b[" not in done.stdout
    assert "approximate" in done.stderr
    bad = run_cli("decompile", str(binary), "no_such_function", home=tmp_path / "home", timeout=240)
    assert bad.returncode != 0 and "no_such_function" in bad.stderr


def test_cli_decompile_highlights_on_a_terminal(binary: Path, tmp_path: Path) -> None:
    """On a terminal (util-linux `script` gives the command a pty) the code is syntax-highlighted."""
    import shlex
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    if shutil.which("script") is None:
        pytest.skip("util-linux `script` is not installed")
    out = tmp_path / "tty.out"
    command = " ".join(
        [
            f"env BINLENS_HOME={shlex.quote(str(tmp_path / 'home'))} PYTHONPATH={shlex.quote(str(ROOT / 'src'))}",
            shlex.quote(sys.executable),
            "-m binlens decompile",
            shlex.quote(str(binary)),
            "score_items",
        ]
    )
    env = {**{k: v for k, v in os.environ.items() if k != "NO_COLOR"}, "TERM": "xterm-256color"}
    subprocess.run(["script", "-qc", command, str(out)], capture_output=True, timeout=240, env=env, check=True)
    text = out.read_text(errors="replace")
    assert "score_items" in text and "\x1b[" in text


def test_over_mcp_http_with_progress_and_over_websocket(binary: Path, tmp_path: Path) -> None:
    """A real server: tools/call with a progress token streams progress notifications (the cold
    provider reports loading angr and the program) before the code; /ws serves the same method."""
    import httpx

    from serve_support import ServerProcess, env_for, ws_call

    home = tmp_path / "home"
    with ServerProcess(home, str(binary), env=env_for(home)) as srv:
        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "progressToken": "dec-1",
        }
        arguments = {"operation": "get", "params": {"selector": FN, "timeout_ms": 120000}}
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "binlens_decompilation", "arguments": arguments, "_meta": meta},
        }
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": "binlens_decompilation",
        }
        with httpx.stream("POST", srv.base + "/mcp", content=json.dumps(body), headers=headers, timeout=240) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        progress = [e for e in events if e.get("method") == "notifications/progress"]
        assert progress and all(e["params"]["progressToken"] == "dec-1" for e in progress)
        result = events[-1]["result"]
        assert result["isError"] is False and "mix_value(" in result["structuredContent"]["code"]
        reply = ws_call(srv.ws_url, "decompilation.get", {"selector": FN})
        assert reply["result"]["cached"] is True and "score_items(" in reply["result"]["code"]


def test_a_global_named_by_the_user_shows_where_it_is_read(ws: Workspace) -> None:
    reader = {"name": "read_limit"}
    before = get(ws, selector=reader)["code"]
    assert "limit_value" in before
    invoke(ws, "global_variable.create", {"selector": {"name": "limit_value"}, "type": "long", "name": "cap_value"})
    named = get(ws, selector=reader)
    assert named["cached"] is False and "cap_value" in named["code"] and "limit_value" not in named["code"]
    assert "extern long cap_value;" in named["code"]  # its type too
    undo(ws)
    assert get(ws, selector=reader)["code"] == before


def test_a_provider_killed_mid_call_is_an_error_result_and_the_next_call_works(ws: Workspace) -> None:
    """The child is SIGKILLed at its first progress report of a request (it is working on it):
    the call answers `internal` with reason `crashed`, and the next call starts a fresh process."""
    from binlens.api.registry import CallContext

    angr = providers.get("angr")
    assert angr is not None
    session = providers.session(ws.program(None), angr)
    get(ws)  # the process is up (a cache hit starts nothing, so make sure one runs)
    invoke(ws, "decompilation.get", {"selector": {"name": "read_limit"}, "timeout_ms": 120000})
    killed: list[int] = []

    def kill_on_progress(done: float, total: float | None, message: str | None) -> None:
        pid = getattr(session, "pid", None)
        if pid is not None and not killed:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    params = {"selector": {"name": "mix_value"}, "timeout_ms": 120000}
    with pytest.raises(BinlensError) as info:
        invoke(ws, "decompilation.get", params, CallContext(progress=kill_on_progress))
    assert killed and info.value.code == "internal", info.value.to_dict()
    assert info.value.details["reason"] == "crashed" and info.value.details["signal"] == "SIGKILL"
    again = invoke(ws, "decompilation.get", params)
    assert "mix_value(" in again["code"] and getattr(session, "pid", None) not in (None, killed[0])


def test_a_cancelled_call_answers_cancelled_and_the_next_call_works(ws: Workspace) -> None:
    """The client cancels at the provider's first progress report: `cancelled`, the process is
    stopped, and the next call decompiles in a fresh one."""
    from binlens.api.registry import CallContext

    ctx = CallContext(progress=lambda done, total, message: ctx.cancel())
    params = {"selector": {"name": "read_limit"}, "timeout_ms": 120000}
    invoke(ws, "function_local_variable.patch", {"selector": {"name": "read_limit"}, "storage": "arg:0", "name": "k"})
    with pytest.raises(BinlensError) as info:
        invoke(ws, "decompilation.get", params, ctx)
    assert info.value.code == "cancelled", info.value.to_dict()
    again = invoke(ws, "decompilation.get", params)
    assert again["cached"] is False and "read_limit(" in again["code"] and "k)" in again["code"]
    undo(ws)


def test_a_local_variable_retyped_shows_its_type(ws: Workspace) -> None:
    items = invoke(ws, "function_local_variable.list", {"selector": FN})["items"]
    local = next(v for v in items if not v["storage"].startswith("arg:") and v["type"] != "long long")
    invoke(ws, "function_local_variable.patch", {"selector": FN, "storage": local["storage"], "type": "long long"})
    typed = get(ws)
    declared = next(v for v in typed["variables"] if v["storage"] == local["storage"])
    assert declared["type"] == "long long" and f"long long {local['name']};" in typed["code"]
    err = fails(
        "invalid_argument",
        ws,
        "function_local_variable.patch",
        {"selector": FN, "storage": local["storage"], "type": "no_such_type_t"},
    )
    assert err.target == "/params/type"
    err = fails(
        "invalid_argument", ws, "function_local_variable.patch", {"selector": FN, "storage": "arg:0", "type": "int"}
    )
    assert err.target == "/params/type" and "prototype" in err.message
    undo(ws)
    assert next(v for v in get(ws)["variables"] if v["storage"] == local["storage"])["type"] == local["type"]


def test_over_mcp_stdio_with_the_official_client(binary: Path, tmp_path: Path) -> None:
    """`binlens mcp` over stdio, the official `mcp` client: decompilation with progress notifications."""
    import sys

    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from mcp_support import ROOT, env_for

    seen: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async def main() -> None:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "binlens", "mcp", str(binary)],
            env=env_for(tmp_path / "home"),
            cwd=str(ROOT),
        )
        async with Client(params, mode="2026-07-28") as client:
            args = {"operation": "get", "params": {"selector": FN, "timeout_ms": 120000}}
            res = await client.call_tool("binlens_decompilation", args, progress_callback=on_progress)
            assert res.is_error is False, res.structured_content
            assert "mix_value(" in res.structured_content["code"]

    anyio.run(main)
    assert seen, "no progress notification arrived"


def test_local_variable_edits_travel_in_annotation_documents(ws: Workspace) -> None:
    invoke(ws, "function_local_variable.patch", {"selector": FN, "storage": "arg:2", "name": "mode"})
    doc = invoke(ws, "annotations.export", {})
    assert doc["local_variables"] == [
        {"function": hex(int(get(ws)["function"], 16)), "storage": "arg:2", "name": "mode", "type": None}
    ]
    undo(ws)
    assert invoke(ws, "annotations.export", {})["local_variables"] == []
    invoke(ws, "annotations.import", {"document": doc, "mode": "merge"})
    assert "mode" in [v["name"] for v in get(ws)["variables"] if v["storage"] == "arg:2"]
    bad = {**doc, "local_variables": [{**doc["local_variables"][0], "name": "2bad"}]}
    err = fails("invalid_argument", ws, "annotations.import", {"document": bad, "mode": "merge"})
    assert err.target == "/params/document/local_variables/0/name"
    undo(ws)


def _ws_request(url: str, method: str, params: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """One request over its own /ws connection: (the progress messages, the response)."""
    import asyncio

    from websockets.asyncio.client import connect

    async def go() -> tuple[list[str], dict[str, Any]]:
        async with connect(url, open_timeout=30) as c:
            json.loads(await c.recv())  # ready
            await c.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            messages: list[str] = []
            while True:
                msg = json.loads(await asyncio.wait_for(c.recv(), 240))
                if msg.get("method") == "$/progress":
                    messages.append(msg["params"].get("message", ""))
                elif msg.get("id") == 1:
                    return messages, msg

    return asyncio.run(go())


def _provider_children(server_pid: int) -> list[int]:
    """The server's angr provider processes."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == server_pid and b"binlens.providers.child" in cmdline and b"angr" in cmdline:
            found.append(int(stat.parent.name))
    return found


def test_concurrent_calls_on_one_program_take_turns_over_a_real_server(binary: Path, tmp_path: Path) -> None:
    """Two clients asking for two functions of one program at once both get their code, from the
    one warm angr process, the second after saying it waits; a third whose timeout passes while it
    waits answers `timeout` (reason `queued`) and leaves the others' process running."""
    import threading
    import time

    from serve_support import ServerProcess, env_for

    home = tmp_path / "home"
    with ServerProcess(home, str(binary), "--ws-clients", "4", env=env_for(home)) as srv:
        _, analysed = _ws_request(srv.ws_url, "analysis.start", {"wait": True, "timeout_ms": 240000})
        assert "result" in analysed, analysed
        answers: dict[str, tuple[list[str], dict[str, Any]]] = {}

        def call(key: str, name: str) -> None:
            params = {"selector": {"name": name}, "timeout_ms": 240000}
            answers[key] = _ws_request(srv.ws_url, "decompilation.get", params)

        first = threading.Thread(target=call, args=("first", "score_items"))
        first.start()
        deadline = time.monotonic() + 120
        while not _provider_children(srv.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)  # the first call holds the session once its process exists
        [child] = _provider_children(srv.proc.pid)
        second = threading.Thread(target=call, args=("second", "mix_value"))
        second.start()
        time.sleep(0.3)
        _, late = _ws_request(srv.ws_url, "decompilation.get", {"selector": {"name": "read_limit"}, "timeout_ms": 300})
        assert late["error"]["data"]["code"] == "timeout", late
        assert late["error"]["data"]["details"]["reason"] == "queued"
        first.join(240)
        second.join(240)
        for key, name in (("first", "score_items"), ("second", "mix_value")):
            _progress, reply = answers[key]
            assert reply["result"]["cached"] is False and f"{name}(" in reply["result"]["code"], reply
        assert any(m.startswith("waiting for the angr session: ") for m in answers["second"][0]), answers["second"][0]
        assert _provider_children(srv.proc.pid) == [child]
        _, again = _ws_request(srv.ws_url, "decompilation.get", {"selector": {"name": "read_limit"}})
        assert "read_limit(" in again["result"]["code"] and _provider_children(srv.proc.pid) == [child]


def _gcc_accepts(code: str) -> bool:
    """gcc -fsyntax-only accepts the code after the standard headers angr's types need."""
    import subprocess

    prelude = "#include <stdbool.h>\n#include <stddef.h>\n#include <stdint.h>\n"
    done = subprocess.run(
        ["cc", "-fsyntax-only", "-w", "-x", "c", "-"], input=prelude + code, capture_output=True, text=True
    )
    return done.returncode == 0


def test_names_that_are_not_c_identifiers_are_spelled_as_identifiers(
    compile_c: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A callee named like a compiler clone (`scale.part.0`) and a global named `counter.v2` show as
    C identifiers (`scale_part_0`, `counter_v2`), so the code parses as C; a warning gives each
    spelling, and the result still names the function by its symbol."""
    binary = compile_c("decompile_names.c", "-O2")
    monkeypatch.setenv("BINLENS_HOME", str(tmp_path))
    workspace = Workspace(Config(home=tmp_path))
    prog = workspace.open(binary, check_roots=False)
    try:
        r = invoke(workspace, "decompilation.get", {"selector": {"name": "use_clone"}, "timeout_ms": 120000})
        assert "scale_part_0(" in r["code"] and "scale.part" not in r["code"], r["code"]
        assert "counter_v2" in r["code"] and "counter.v2" not in r["code"], r["code"]
        assert any("scale.part.0 -> scale_part_0" in w for w in r["warnings"]), r["warnings"]
        assert _gcc_accepts(r["code"]), r["code"]
        clone = invoke(workspace, "decompilation.get", {"selector": {"name": "scale.part.0"}, "timeout_ms": 120000})
        assert clone["name"] == "scale.part.0" and "scale_part_0(" in clone["code"]
    finally:
        workspace.close(prog.handle)


def test_a_function_angr_types_as_returning_an_array_returns_a_pointer() -> None:
    """angr prints `unsigned int [4] init_rand(...)` (not C) for bashbot's init_rand and
    rand_cmwc; the provider returns a pointer to the element type instead, and the code parses."""
    from conftest import corpus_dir

    path = corpus_dir("elf") / "bashbot.x86_64.O0.elf"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"binlens-array-{os.getpid()}"
    workspace = Workspace(Config(home=home))
    prog = workspace.open(path, check_roots=False)
    try:
        for name in ("init_rand", "rand_cmwc"):
            r = invoke(workspace, "decompilation.get", {"selector": {"name": name}, "timeout_ms": 120000})
            assert re.search(r"^unsigned int \*\s*" + name + r"\(", r["code"], re.M), r["code"]
            assert _gcc_accepts(r["code"]), r["code"]
    finally:
        workspace.close(prog.handle)


def test_a_call_that_waited_for_the_same_function_gets_the_stored_result(
    binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls for one function at once: the first decompiles, the second waits its turn and
    then answers from the result the first stored (`cached: true`) instead of decompiling again."""
    import threading

    monkeypatch.setenv("BINLENS_HOME", str(tmp_path))
    workspace = Workspace(Config(home=tmp_path))
    prog = workspace.open(binary, check_roots=False)
    try:
        invoke(workspace, "analysis.start", {"wait": True, "timeout_ms": 120000})
        answers: list[dict[str, Any]] = []
        calls = [
            threading.Thread(target=lambda: answers.append(get(workspace, selector={"name": "read_limit"})))
            for _ in range(2)
        ]
        for t in calls:
            t.start()
        for t in calls:
            t.join(240)
        assert sorted(a["cached"] for a in answers) == [False, True]
        assert answers[0]["code"] == answers[1]["code"]
    finally:
        workspace.close(prog.handle)
