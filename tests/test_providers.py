"""Providers (SPEC §6): a session runs in a process of its own, so its crash, hang or memory blow-up
is an error result and never the server's death; `requires=` keeps a method in the catalog and
answers `unavailable` with the reason and the remedy; `provider.list`; the objdump provider.

The process tests drive real child processes: `EdgeHandler` below is a test-only provider's child
side, imported by the child from this file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from binlens import components
from binlens.api import REGISTRY, invoke
from binlens.api.models import Params
from binlens.api.registry import READ_ONLY, method
from binlens.api.requirements import parse
from binlens.errors import BinlensError
from binlens.providers.base import ProviderFailure
from binlens.providers.process import ProcessSession
from binlens.workspace import Config, Workspace
from conftest import ROOT, corpus_dir
from serve_support import ServerProcess, env_for, ws_call

pytestmark = pytest.mark.timeout(180)

HANDLER = "test_providers:EdgeHandler"
HANG_BOUND_S = 60  # a timeout of 1 s that takes longer than this is a hang, not a slow machine


class EdgeHandler:
    """A test-only provider's child side: each request misbehaves as it names."""

    def __init__(self) -> None:
        self.opened = -1

    def handle(self, op: str, args: dict[str, Any], blob: bytes, progress: Any) -> tuple[dict[str, Any], bytes]:
        """Answer (or crash, hang, blow up) as `op` says."""
        if op == "open":
            self.opened = len(blob)
            return {}, b""
        if op == "echo":
            print("stray output a library might write")  # must not corrupt the frames
            return {"args": args, "opened": self.opened, "pid": os.getpid()}, blob[::-1]
        if op == "exit":
            os._exit(7)
        if op == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if op == "hang":
            grandchild = subprocess.Popen(["sleep", "600"])
            Path(args["pidfile"]).write_text(str(grandchild.pid))
            time.sleep(3600)
        if op == "eat":
            hog = bytearray(args["bytes"])
            return {"ate": len(hog)}, b""
        if op == "count":
            for i in range(1, args["to"] + 1):
                progress(i, args["to"], f"step {i}")
                time.sleep(args.get("pause", 0))
            return {"counted": args["to"]}, b""
        if op == "big":
            return {}, b"b" * args["bytes"]
        if op == "refuse":
            raise ProviderFailure("unsupported", "not this one", reason="testing")
        if op == "raise":
            raise RuntimeError("secret internal detail")
        raise ProviderFailure("internal", f"unknown op {op}")


@pytest.fixture()
def session(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A session of the test-only provider (the child imports this file from tests/)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = ProcessSession("edge", HANDLER, open_blob=b"x" * 1000, memory_limit=512 << 20, start_timeout=60)
    yield s
    s.close()


def fails(code: str, fn: Any, *args: Any, **kw: Any) -> BinlensError:
    with pytest.raises(BinlensError) as info:
        fn(*args, **kw)
    assert info.value.code == code, info.value.to_dict()
    return info.value


def gone(pid: int) -> bool:
    """The process is gone (or a zombie waiting for a parent that is not ours to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def wait_gone(pid: int, bound: float = 10) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return False


def alive_again(s: ProcessSession) -> None:
    """The next call starts a fresh process that gets the program again."""
    result, blob = s.call("echo", {"n": 1}, b"abc", timeout=60)
    assert result["opened"] == 1000 and blob == b"cba"


# --- the process session ------------------------------------------------------------------------


def test_a_session_answers_frames_and_closes_cleanly(session: ProcessSession) -> None:
    """Requests and answers with JSON and a blob each way; stray prints in the child do not corrupt
    them; `close` ends the process; a closed session refuses calls."""
    result, blob = session.call("echo", {"n": [1, "two"]}, b"\x00\x01\x02" * 100_000, timeout=60)
    assert result["args"] == {"n": [1, "two"]} and result["opened"] == 1000
    assert blob == (b"\x00\x01\x02" * 100_000)[::-1]
    pid = result["pid"]
    assert session.pid == pid
    session.close()
    assert wait_gone(pid)
    err = fails("unavailable", session.call, "echo", {}, timeout=10)
    assert err.details["reason"] == "closed"


def test_a_crash_is_an_error_result_and_the_next_call_restarts(session: ProcessSession) -> None:
    """A child that exits or dies of SIGSEGV mid-request is `internal` with how it died; the call
    after starts a new process and opens the program in it again."""
    session.call("echo", {}, timeout=60)
    err = fails("internal", session.call, "exit", {}, timeout=60)
    assert err.details == {"provider": "edge", "reason": "crashed", "exit_status": 7}
    alive_again(session)
    err = fails("internal", session.call, "segv", {}, timeout=60)
    assert err.details["signal"] == "SIGSEGV" and err.details["reason"] == "crashed"
    alive_again(session)
    assert session.starts == 3


def test_a_hang_times_out_and_kills_the_process_group(session: ProcessSession, tmp_path: Path) -> None:
    """Past the call's timeout the child and what it started are killed: `timeout` with the bound."""
    pidfile = tmp_path / "grandchild.pid"
    first = session.call("echo", {}, timeout=60)[0]["pid"]
    started = time.monotonic()
    err = fails("timeout", session.call, "hang", {"pidfile": str(pidfile)}, timeout=1.0)
    assert time.monotonic() - started < HANG_BOUND_S
    assert err.details == {"provider": "edge", "reason": "timeout", "timeout_ms": 1000}
    assert wait_gone(first)
    assert wait_gone(int(pidfile.read_text()))
    alive_again(session)


def test_a_memory_blow_up_is_an_error_result(session: ProcessSession) -> None:
    """The child's address space is capped (setrlimit): allocating past it is `internal` with the
    reason and the limit, and the process is replaced."""
    assert session.call("eat", {"bytes": 16 << 20}, timeout=60)[0] == {"ate": 16 << 20}
    err = fails("internal", session.call, "eat", {"bytes": 4 << 30}, timeout=60)
    assert err.details["reason"] == "memory_limit" and err.details["memory_limit_bytes"] == 512 << 20
    assert "ran out of memory" in err.message
    alive_again(session)


def test_an_answer_over_the_limit_is_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame whose header claims more than `max_answer_bytes` is `internal` (bad_answer) before
    it is read: a subverted child cannot make the server hold what it likes."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = ProcessSession("edge", HANDLER, max_answer_bytes=1 << 20, start_timeout=60)
    try:
        assert len(s.call("big", {"bytes": 1000}, timeout=60)[1]) == 1000
        err = fails("internal", s.call, "big", {"bytes": 2 << 20}, timeout=60)
        assert err.details["reason"] == "bad_answer" and err.details["max_answer_bytes"] == 1 << 20
        assert len(s.call("big", {"bytes": 1000}, timeout=60)[1]) == 1000
        assert s.starts == 2
    finally:
        s.close()


def test_progress_reports_reach_the_call_context(session: ProcessSession) -> None:
    """A handler's progress reports reach the API's CallContext (and so the client's progress
    notifications) ahead of the answer; cancelling while it reports kills the child."""
    from binlens.api.registry import CallContext

    seen: list[tuple[float, float | None, str | None]] = []
    ctx = CallContext(progress=lambda done, total, message: seen.append((done, total, message)))
    assert session.call("count", {"to": 3, "pause": 0.15}, timeout=60, ctx=ctx)[0] == {"counted": 3}
    assert seen[-1] == (3.0, 3.0, "step 3") and len(seen) >= 2
    pid = session.pid
    assert pid is not None
    ctx = CallContext(progress=lambda *a: None)
    threading.Timer(0.5, ctx.cancel).start()
    fails("cancelled", session.call, "count", {"to": 1000, "pause": 0.05}, timeout=120, ctx=ctx)
    assert wait_gone(pid)
    alive_again(session)


def test_cancellation_kills_the_request(session: ProcessSession, tmp_path: Path) -> None:
    """A cancelled call stops waiting, kills the child and answers `cancelled`."""

    class Ctx:
        cancelled = False

    ctx = Ctx()
    session.call("echo", {}, timeout=60)
    threading.Timer(0.5, lambda: setattr(ctx, "cancelled", True)).start()
    fails("cancelled", session.call, "hang", {"pidfile": str(tmp_path / "p")}, timeout=HANG_BOUND_S * 2, ctx=ctx)
    alive_again(session)


def test_handler_failures_pass_their_code_and_hide_internal_text(session: ProcessSession) -> None:
    """A ProviderFailure keeps its code and details; any other exception is `internal` without its text."""
    err = fails("unsupported", session.call, "refuse", {}, timeout=60)
    assert err.message == "not this one" and err.details == {"reason": "testing", "provider": "edge"}
    err = fails("internal", session.call, "raise", {}, timeout=60)
    assert "secret" not in err.message and err.message == "RuntimeError in the provider"
    session.call("echo", {}, timeout=60)  # the same process goes on
    assert session.starts == 1


def test_a_child_that_cannot_start_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler that does not import (a provider's package missing) is `unavailable` with the cause."""
    s = ProcessSession("ghost", "binlens_no_such_module:Handler", start_timeout=60)
    try:
        err = fails("unavailable", s.call, "echo", {}, timeout=10)
        assert err.details["reason"] == "start_failed" and "binlens_no_such_module" in err.message
    finally:
        s.close()


# --- requires= and provider.list, in process ------------------------------------------------------


@pytest.fixture()
def ws(home: Path) -> Workspace:
    return Workspace(Config(home=home))


@pytest.fixture()
def sample(compile_c) -> Path:  # noqa: ANN001
    return compile_c("sample.c")


def needs_objdump() -> None:
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")


def test_provider_list_reports_objdump(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """provider.list names every provider with its availability; a missing executable is reported
    with the reason and the remedy, found again at run time once it exists."""
    needs_objdump()
    monkeypatch.delenv("BINLENS_OBJDUMP", raising=False)
    items = invoke(ws, "provider.list", {})["items"]
    assert [i["id"] for i in items] == ["objdump", "gdb", "angr"]
    item = items[0]
    assert item["id"] == "objdump" and item["kind"] == "disassembler" and item["available"] is True
    assert item["version"] and item["reason"] is None and item["remediation"] is None
    monkeypatch.setenv("BINLENS_OBJDUMP", "/nonexistent/objdump")
    (item,) = invoke(ws, "provider.list", {"kind": "disassembler"})["items"]
    assert item == {
        "id": "objdump",
        "kind": "disassembler",
        "available": False,
        "version": None,
        "reason": "/nonexistent/objdump does not exist",
        "remediation": "apt-get install binutils (or set $BINLENS_OBJDUMP to an objdump executable)",
    }
    assert [p["id"] for p in invoke(ws, "provider.list", {"kind": "decompiler"})["items"]] == ["angr"]


def test_a_missing_provider_keeps_the_method_listed_and_answers_unavailable(
    ws: Workspace, sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """disassembly.get requires a disassembler: with none it is still in interface.get and a call
    answers `unavailable` with reason and remediation; naming a provider that is not one is
    `invalid_argument` at /params/provider."""
    monkeypatch.setenv("BINLENS_OBJDUMP", "/nonexistent/objdump")
    ws.open(sample, check_roots=False)
    listed = {m["name"] for m in invoke(ws, "interface.get", {"schemas": False})["methods"]}
    assert {"disassembly.get", "provider.list"} <= listed
    err = fails("unavailable", invoke, ws, "disassembly.get", {"selector": {"name": "main"}})
    assert err.details == {
        "requirement": "provider-kind:disassembler",
        "reason": "/nonexistent/objdump does not exist",
        "remediation": "apt-get install binutils (or set $BINLENS_OBJDUMP to an objdump executable)",
    }
    monkeypatch.delenv("BINLENS_OBJDUMP")
    needs_objdump()
    err = fails("invalid_argument", invoke, ws, "disassembly.get", {"selector": {"name": "main"}, "provider": "angr"})
    assert err.target == "/params/provider" and err.details["providers"] == ["auto", "objdump"]


class NoParams(Params):
    """The test-only methods' (empty) params."""


def test_requirements_name_providers_permissions_and_writability(ws: Workspace, home: Path) -> None:
    """`requires=` takes provider:<id>, provider-kind:<kind>, permission:<name> and writable; an
    unmet one answers its error with reason and remedy; a mutation on a read-only server keeps
    its `read_only` code."""
    with pytest.raises(ValueError, match="not one of"):
        parse("provider")
    with pytest.raises(ValueError, match="unknown permission"):
        parse("permission:fly")

    names = ("testonly.needs_debug", "testonly.needs_ghost")

    @method(names[0], effect=READ_ONLY, requires=("permission:debug",))
    def needs_debug(ws: Any, p: NoParams) -> dict[str, str]:
        """Answers when debugging is allowed."""
        return {"ok": "yes"}

    @method(names[1], effect=READ_ONLY, requires=("provider:ghost",))
    def needs_ghost(ws: Any, p: NoParams) -> dict[str, str]:
        """Never answers: no such provider."""
        return {"ok": "yes"}

    try:
        err = fails("unavailable", invoke, ws, names[0], {})
        assert err.details == {
            "requirement": "permission:debug",
            "reason": "the server does not allow debug",
            "remediation": "start the server with --allow-debug",
        }
        allowed = Workspace(Config(home=home, permissions=frozenset({"debug"})))
        assert invoke(allowed, names[0], {}) == {"ok": "yes"}
        err = fails("unavailable", invoke, ws, names[1], {})
        assert err.details["reason"] == "no provider 'ghost' is registered"
    finally:
        for name in names:
            dict.__delitem__(REGISTRY, name)

    read_only = Workspace(Config(home=home, read_only=True))
    assert any(r.kind == "writable" for r in REGISTRY["comment.create"].requires)
    err = fails("unavailable", invoke, read_only, "comment.create", {})
    assert err.message == "comment.create changes the database and the server is read-only"
    assert err.details["remediation"] == "start the server without --read-only"


# --- the objdump provider ---------------------------------------------------------------------------


def test_objdump_agrees_with_binlens_on_a_function(ws: Workspace, sample: Path) -> None:
    """disassembly.get over a function: objdump's instructions, the binding reported, and both
    decoders starting the same instructions."""
    needs_objdump()
    ws.open(sample, check_roots=False)
    r = invoke(ws, "disassembly.get", {"selector": {"name": "classify"}})
    assert r["provider"]["id"] == "objdump" and r["provider"]["version"]
    assert r["instructions"] and r["instructions"][0]["address"] == r["start"]
    assert r["agreement"]["agree"] is True, r["agreement"]
    assert r["agreement"]["compared"] == len(r["instructions"])
    again = invoke(ws, "disassembly.get", {"selector": {"name": "classify"}, "provider": "objdump"})
    assert again == r


def test_objdump_range_bounds(ws: Workspace, sample: Path) -> None:
    """A range is checked before the provider runs: empty or over 64 KiB is `invalid_argument`."""
    needs_objdump()
    ws.open(sample, check_roots=False)
    err = fails("invalid_argument", invoke, ws, "disassembly.get", {"range": {"start": "0x2000", "end": "0x1000"}})
    assert err.target == "/params/range/end"
    err = fails("invalid_argument", invoke, ws, "disassembly.get", {"range": {"start": "0x0", "end": "0x100000"}})
    assert err.details == {"limit": 65536}
    err = fails("invalid_argument", invoke, ws, "disassembly.get", {})
    assert err.target == "/params"


def test_program_close_ends_its_provider_sessions(ws: Workspace, sample: Path) -> None:
    """A program's provider processes end when it closes."""
    needs_objdump()
    from binlens.providers.registry import SESSIONS_KEY

    prog = ws.open(sample, check_roots=False)
    invoke(ws, "disassembly.get", {"selector": {"name": "main"}})
    (session,) = prog.extensions[SESSIONS_KEY]._sessions.values()
    pid = session.pid
    assert pid is not None
    invoke(ws, "program.close", {"program": prog.handle})
    assert wait_gone(pid)


def test_objdump_failures_are_error_results(ws: Workspace, sample: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """An objdump that crashes is `internal` with the reason; the session serves the next call."""
    fake = tmp_path / "objdump"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "GNU objdump 2.40"; exit 0; fi\nkill -SEGV $$\n')
    fake.chmod(0o755)
    monkeypatch.setenv("BINLENS_OBJDUMP", str(fake))
    ws.open(sample, check_roots=False)
    err = fails("internal", invoke, ws, "disassembly.get", {"selector": {"name": "main"}})
    assert err.details == {"reason": "objdump_crashed", "provider": "objdump"}
    assert invoke(ws, "provider.list", {})["items"][0]["available"] is True


def test_objdump_refuses_an_architecture_it_does_not_know(home: Path) -> None:
    """A program objdump cannot disassemble (host binutils, an ARM file) is `unsupported` with the remedy."""
    needs_objdump()
    path = corpus_dir("elf") / "bashbot.arm.gcc.O0.elf"
    ws = Workspace(Config(home=home))
    prog = ws.open(path, check_roots=False)
    entry = prog.image.identity.entry
    done = subprocess.run(["objdump", "-f", str(path)], capture_output=True, text=True)
    if "UNKNOWN" not in done.stdout and "arm" in done.stdout:
        pytest.skip("this objdump knows ARM (binutils-multiarch)")
    err = fails("unsupported", invoke, ws, "disassembly.get", {"range": {"start": hex(entry), "end": hex(entry + 64)}})
    assert err.details["remediation"].startswith("apt-get install binutils-multiarch")
    assert "<program>" in err.message or "architecture" in err.message


def test_every_listed_provider_has_the_protocol() -> None:
    """`components.PROVIDERS` entries load to providers with unique ids and a kind, and answer availability."""
    from binlens.providers.registry import providers

    loaded = [components.load(ref) for ref in components.PROVIDERS]
    assert [p.id for p in loaded] == list(providers())
    for provider in loaded:
        assert provider.kind in ("disassembler", "decompiler", "debugger")
        got = provider.availability()
        assert got.available or (got.reason and got.remediation)
        assert callable(provider.open_session)


# --- over a real transport -----------------------------------------------------------------------

FAKE_OBJDUMP = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "GNU objdump (fake) 2.99"; exit 0; fi
echo $$ > "$(dirname "$0")/hung.pid"
exec sleep 600
"""


def test_over_websocket_unavailable_then_a_hung_provider_times_out(tmp_path: Path, sample: Path) -> None:
    """A real server: with no objdump, disassembly.get answers `unavailable` with reason and
    remediation (the error object in JSON-RPC's `data`); once an objdump appears (found at run
    time) and hangs, the call answers `timeout`, its processes are killed, and the server serves on."""
    fake = tmp_path / "bin" / "objdump"
    fake.parent.mkdir()
    home = tmp_path / "home"
    with ServerProcess(home, str(sample), env=env_for(home, BINLENS_OBJDUMP=str(fake))) as srv:
        reply = ws_call(srv.ws_url, "disassembly.get", {"selector": {"name": "main"}})
        error = reply["error"]
        assert error["code"] == -32000 and error["data"]["code"] == "unavailable"
        assert error["data"]["details"]["reason"] == f"{fake} does not exist"
        assert error["data"]["details"]["remediation"].startswith("apt-get install binutils")
        listed = ws_call(srv.ws_url, "provider.list", {"kind": "disassembler"})["result"]["items"]
        assert [(p["id"], p["available"]) for p in listed] == [("objdump", False)]

        fake.write_text(FAKE_OBJDUMP)
        fake.chmod(0o755)
        started = time.monotonic()
        reply = ws_call(
            srv.ws_url, "disassembly.get", {"range": {"start": "0x1000", "end": "0x1100"}, "timeout_ms": 1000}
        )
        assert time.monotonic() - started < HANG_BOUND_S
        assert reply["error"]["data"]["code"] == "timeout", reply
        assert reply["error"]["data"]["details"]["provider"] == "objdump"
        assert wait_gone(int((fake.parent / "hung.pid").read_text()))
        listed = ws_call(srv.ws_url, "provider.list", {"kind": "disassembler"})["result"]["items"]
        assert listed[0]["available"] is True and listed[0]["version"] == "2.99"
        assert srv.proc.poll() is None


def test_session_get_reports_each_methods_availability(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """session.get says, for every method, whether it can run and why not (SPEC §6): a missing
    provider and read-only mode, with their remedies."""
    monkeypatch.setenv("BINLENS_OBJDUMP", "/nonexistent/objdump")
    ws = Workspace(Config(home=home, read_only=True))
    methods = invoke(ws, "session.get", {})["tool_availability"]
    assert set(methods) == set(REGISTRY)
    no_features = {"required_client_features": [], "missing_client_features": []}
    assert methods["function.list"] == {"available": True, "reason": None, "remediation": None, **no_features}
    assert methods["disassembly.get"] == {
        "available": False,
        "reason": "/nonexistent/objdump does not exist",
        "remediation": "apt-get install binutils (or set $BINLENS_OBJDUMP to an objdump executable)",
        **no_features,
    }
    assert methods["comment.create"] == {
        "available": False,
        "reason": "the server is read-only",
        "remediation": "start the server without --read-only",
        **no_features,
    }


def test_closing_a_session_during_a_call_ends_it_at_once(session: ProcessSession, tmp_path: Path) -> None:
    """Closing a session (its program closed) while a call hangs kills the child: the call answers
    `unavailable` (closed) long before its own timeout."""
    pid = session.call("echo", {}, timeout=60)[0]["pid"]
    errors: list[BinlensError] = []

    def hang() -> None:
        errors.append(fails("unavailable", session.call, "hang", {"pidfile": str(tmp_path / "p")}, timeout=3600))

    t = threading.Thread(target=hang)
    t.start()
    time.sleep(0.5)
    session.close()
    t.join(HANG_BOUND_S)
    assert not t.is_alive() and errors[0].details["reason"] == "closed"
    assert wait_gone(pid)


def test_one_shot_query_answers_unavailable(tmp_path: Path, sample: Path) -> None:
    """`binlens query` (a real process): a missing provider is the error object, exit status 1."""
    env = env_for(tmp_path / "home", BINLENS_OBJDUMP=str(tmp_path / "none"))
    request = '{"method": "disassembly.get", "params": {"selector": {"name": "main"}}}'
    done = subprocess.run(
        [sys.executable, "-m", "binlens", "query", "-b", str(sample), request],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "unavailable" and error["details"]["reason"] == f"{tmp_path / 'none'} does not exist"


def test_a_dropped_session_takes_its_process_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session garbage-collected without `close` kills its child (as the server's exit does)."""
    import gc

    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = ProcessSession("edge", HANDLER, start_timeout=60)
    pid = s.call("echo", {}, timeout=60)[0]["pid"]
    del s
    gc.collect()
    assert wait_gone(pid)
