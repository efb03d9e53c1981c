"""Raw tests of `binlens mcp` over stdio: framing, the frame limit, EOF, error ids, tool prefix, read-only."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mcp_support import ROOT, env_for

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}


def _request_ids(lines: list[bytes], limit: int) -> set[Any]:
    """Ids of the well-formed requests among `lines` that fit the frame limit (the replies to wait for)."""
    ids = set()
    for line in lines:
        if len(line) > limit:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "id" in obj and isinstance(obj.get("method"), str):
            ids.add(obj["id"])
    return ids


def run_stdio(home: Path, lines: list[bytes], *args: str, timeout: float = 60) -> tuple[list[dict[str, Any]], str, int]:
    """Feed `lines` to `binlens mcp ARGS`, wait for the replies, close stdin; return (frames, stderr, status).

    Like a real client, stdin is closed only after the answers came (EOF cancels outstanding work).
    """
    limit = int(args[args.index("--max-frame-bytes") + 1]) if "--max-frame-bytes" in args else 1 << 20
    want = _request_ids(lines, limit)
    proc = subprocess.Popen(
        [sys.executable, "-m", "binlens", "mcp", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_for(home),
        cwd=ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    err_chunks: list[bytes] = []
    err_reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    err_reader.start()

    def feed() -> None:
        try:
            for line in lines:
                proc.stdin.write(line)
            proc.stdin.flush()
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    closed = False
    while True:
        if not closed and (want <= {f.get("id") for f in frames} or time.monotonic() > deadline):
            writer.join(timeout)
            proc.stdin.close()
            closed = True
        line = proc.stdout.readline()
        if not line:
            break
        frames.append(json.loads(line))  # every stdout line is one JSON frame
    if not closed:
        proc.stdin.close()
    code = proc.wait(timeout)
    err_reader.join(timeout)
    return frames, b"".join(err_chunks).decode(), code


def msg(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def by_id(frames: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {f.get("id"): f for f in frames if "id" in f}


def test_stdout_has_only_frames_and_logs_go_to_stderr(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    sample = compile_c("sample.c")
    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}),
        msg({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        msg(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "binlens_symbol", "arguments": {"operation": "list"}},
            }
        ),
    ]
    frames, err, code = run_stdio(tmp_path, lines, str(sample), "-v")
    assert code == 0
    assert all(f["jsonrpc"] == "2.0" for f in frames)
    got = by_id(frames)
    assert got[1]["result"]["protocolVersion"] == "2025-11-25"
    assert got[2]["result"]["isError"] is False
    assert "INFO" in err or err == ""  # -v logs, if any, are on stderr


def test_oversized_frame_is_refused_and_drained(tmp_path: Path) -> None:
    big = b'{"jsonrpc":"2.0","id":99,"method":"ping","params":{"x":"' + b"a" * (1 << 20) + b'"}}\n'
    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}),
        big,
        msg({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
    ]
    frames, _, code = run_stdio(tmp_path, lines)
    assert code == 0
    assert len(frames) == 3
    refusal = frames[1]
    assert refusal["error"]["code"] == -32600 and "limit" in refusal["error"]["message"]
    assert "id" not in refusal  # 2025-11-25: no identifiable id, so none
    assert 99 not in by_id(frames)  # the oversized request never ran
    assert by_id(frames)[2]["result"] == {}


def test_frame_limit_is_configurable(tmp_path: Path) -> None:
    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {**INIT, "protocolVersion": "2025-06-18"}}),
        msg({"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"pad": "b" * 2000}}),
        msg({"jsonrpc": "2.0", "id": 6, "method": "ping"}),
    ]
    frames, _, _ = run_stdio(tmp_path, lines, "--max-frame-bytes", "1000")
    assert frames[1]["error"]["code"] == -32600 and frames[1]["id"] is None  # 2025-06-18: id null
    assert by_id(frames)[6]["result"] == {}


@pytest.mark.parametrize(("version", "has_null_id"), [("2025-06-18", True), ("2025-11-25", False)])
def test_parse_error_id_rules(tmp_path: Path, version: str, has_null_id: bool) -> None:
    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {**INIT, "protocolVersion": version}}),
        b"{this is not json\n",
    ]
    frames, _, _ = run_stdio(tmp_path, lines)
    err = frames[1]
    assert err["error"]["code"] == -32700
    assert ("id" in err) is has_null_id
    if has_null_id:
        assert err["id"] is None


def test_modern_requests_over_stdio(tmp_path: Path) -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}),
        msg({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": meta}}),
        msg({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel", "params": {"_meta": meta, "level": "info"}}),
        msg(
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "tools/list",
                "params": {"_meta": {**meta, "io.modelcontextprotocol/protocolVersion": "2030-01-01"}},
            }
        ),
        msg({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
        msg({"jsonrpc": "2.0", "id": 6, "method": "ping", "params": {"_meta": meta}}),  # still answered
    ]
    frames, _, code = run_stdio(tmp_path, lines)
    assert code == 0
    got = by_id(frames)
    assert got[1]["result"]["resultType"] == "complete" and "2026-07-28" in got[1]["result"]["supportedVersions"]
    assert got[2]["result"]["ttlMs"] >= 0
    assert got[3]["error"]["code"] == -32601
    assert got[4]["error"]["code"] == -32022 and got[4]["error"]["data"]["requested"] == "2030-01-01"
    assert got[5]["error"]["code"] == -32600  # neither initialized nor a 2026-07-28 envelope
    assert got[6]["result"]["resultType"] == "complete"


def test_eof_cancels_outstanding_work_and_exits_zero(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    big = compile_c("mcp_big.c")
    call = {
        "name": "binlens_memory",
        "arguments": {
            "operation": "search",
            "params": {"regex": r"\x00{0,20}[^\x00]\x00{3}z", "scan": {"timeout_ms": 60000}},
        },
    }
    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}),
        msg({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "binlens", "mcp", str(big)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_for(tmp_path),
        cwd=ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    for line in lines:
        proc.stdin.write(line)
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["id"] == 1
    time.sleep(0.5)  # the search is running now (~9 s uncancelled)
    started = time.monotonic()
    proc.stdin.close()
    assert proc.wait(timeout=20) == 0
    assert time.monotonic() - started < 8
    assert proc.stdout.read() == b""  # a cancelled request gets no response


def test_tool_prefix(tmp_path: Path) -> None:
    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}),
        msg({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        msg({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "binlens_help"}}),
    ]
    frames, _, _ = run_stdio(tmp_path, lines, "--tool-prefix", "re-2")
    names = {t["name"] for t in by_id(frames)[2]["result"]["tools"]}
    assert "re-2_help" in names and "re-2_symbol" in names and not any(n.startswith("binlens") for n in names)
    assert by_id(frames)[3]["error"]["code"] == -32602


# "a" * 50: valid alone, but binlens_function_parameter's counterpart would pass 64 characters
@pytest.mark.parametrize("prefix", ["", "1abc", "a" * 65, "has space", "dot.ted", "a" * 50])
def test_bad_tool_prefix_is_a_usage_error(tmp_path: Path, prefix: str) -> None:
    _, err, code = run_stdio(tmp_path, [], "--tool-prefix", prefix)
    assert code == 2 and "tool prefix" in err


def test_read_only_lists_mutations_and_refuses_them(tmp_path: Path) -> None:
    """Capabilities are never hidden (SPEC §6): `--read-only` lists every operation, and a mutation
    answers `read_only` with the reason."""
    from binlens.api import REGISTRY

    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}),
        msg({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "binlens_help", "arguments": {}}}),
        msg(
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "binlens_comment", "arguments": {"operation": "create", "params": {}}},
            }
        ),
    ]
    frames, _, _ = run_stdio(tmp_path, lines, "--read-only")
    replies = by_id(frames)
    listed = replies[2]["result"]["structuredContent"]["tools"]
    for d in listed:
        assert set(d["operations"]) == {s.operation for s in REGISTRY.values() if s.domain == d["domain"]}
    assert {d["domain"] for d in listed} == {s.domain for s in REGISTRY.values()}
    refused = replies[3]["result"]
    assert refused["isError"] is True and refused["structuredContent"]["error"]["code"] == "unavailable"


def test_program_open_only_under_roots(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    sample = compile_c("sample.c")
    root = tmp_path / "root"
    root.mkdir()
    inside = root / "inside"
    inside.write_bytes(sample.read_bytes())

    def open_call(rid: int, path: Path) -> bytes:
        args = {"operation": "open", "params": {"path": str(path)}}
        return msg(
            {
                "jsonrpc": "2.0",
                "id": rid,
                "method": "tools/call",
                "params": {"name": "binlens_program", "arguments": args},
            }
        )

    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}),
        open_call(2, sample),
        open_call(3, inside),
    ]
    frames, _, code = run_stdio(tmp_path, lines, "--root", str(root))
    assert code == 0
    refused = by_id(frames)[2]["result"]
    assert refused["isError"] is True
    assert refused["structuredContent"]["error"]["target"] == "/params/path"
    opened = by_id(frames)[3]["result"]
    assert opened["isError"] is False and opened["structuredContent"]["identity"]["file_name"] == "inside"


def test_dot_separator_gives_ghidra_bridge_names(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    """`--tool-separator .` names tools binlens.help, binlens.symbol, ...; help takes either form."""
    lines = [
        msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}),
        msg({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        msg(
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "binlens.symbol", "arguments": {"operation": "list"}},
            }
        ),
        msg(
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "tools/call",
                "params": {"name": "binlens.help", "arguments": {"domain": "binlens.memory_block"}},
            }
        ),
        msg({"jsonrpc": "2.0", "id": 5, "method": "prompts/list"}),
        msg(
            {
                "jsonrpc": "2.0",
                "id": 6,
                "method": "tools/call",
                "params": {"name": "binlens.help", "arguments": {"domain": "binlens_memory_block"}},
            }
        ),
    ]
    frames, _, code = run_stdio(tmp_path, lines, str(compile_c("sample.c")), "--tool-separator", ".")
    assert code == 0
    got = by_id(frames)
    names = [t["name"] for t in got[2]["result"]["tools"]]
    assert "binlens.help" in names and "binlens.memory_block" in names
    assert all(n.startswith("binlens.") for n in names)
    assert got[3]["result"]["isError"] is False
    assert got[4]["result"]["structuredContent"]["tool"] == "binlens.memory_block"
    assert got[5]["result"]["prompts"][0]["name"] == "binlens.triage"
    assert got[6]["result"]["structuredContent"]["domain"] == "memory_block"
    _, err, code = run_stdio(tmp_path, [], "--tool-separator", "/")
    assert code == 2 and "tool-separator" in err


class StdioClient:
    """An interactive `binlens mcp` child: write frames, read answers one by one (with a deadline)."""

    def __init__(self, home: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "binlens", "mcp", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env_for(home),
            cwd=ROOT,
        )
        self.frames: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.err = bytearray()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr.read()), daemon=True).start()  # type: ignore[union-attr]

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.frames.put(json.loads(line))
        self.frames.put(None)

    def send(self, *lines: bytes) -> None:
        """Write `lines` in one write (a request and its cancel arrive together)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(lines))
        self.proc.stdin.flush()

    def answer(self, rid: Any, timeout: float = 60) -> dict[str, Any]:
        """The next frame with id `rid` (frames before it are kept in `seen`)."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self.frames.get(timeout=max(0.01, deadline - time.monotonic()))
            assert frame is not None, f"binlens mcp exited: {self.err.decode()[-2000:]}"
            self.seen.append(frame)
            if frame.get("id") == rid:
                return frame

    def close(self, timeout: float = 30) -> int:
        """EOF on stdin; the exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def _search_call(rid: Any, timeout_ms: int = 60000) -> bytes:
    """A tools/call running a backtracking memory.search for many seconds over mcp_big."""
    params = {"regex": r"\x00{0,20}[^\x00]\x00{3}z", "scan": {"timeout_ms": timeout_ms}}
    call = {"name": "binlens_memory", "arguments": {"operation": "search", "params": params}}
    return msg({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call})


def _quick_call(rid: Any) -> bytes:
    call = {"name": "binlens_symbol", "arguments": {"operation": "list", "params": {"page": {"limit": 1}}}}
    return msg({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call})


def _cancel(rid: Any) -> bytes:
    return msg({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid}})


def test_cancel_written_right_behind_its_request_stops_it(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    big = compile_c("mcp_big.c")
    client = StdioClient(tmp_path, str(big), "--max-concurrent", "1")
    try:
        client.send(msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
        client.answer(1)
        client.send(_search_call(2), _cancel(2))
        # With one call slot, a quick call gets it only once the search has let it go: at once when
        # the cancel reached it, after the whole search (many seconds, then answered) when it did not.
        deadline = time.monotonic() + 60
        rid = 100
        while True:
            rid += 1
            client.send(_quick_call(rid))
            result = client.answer(rid)["result"]
            if "busy" not in json.dumps(result) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert result["isError"] is False, result
        client.send(msg({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
        client.answer(3)
        assert [f for f in client.seen if f.get("id") == 2] == []  # cancelled: no response, as MCP asks
    finally:
        code = client.close()
    assert code == 0


def test_second_request_with_a_running_id_is_refused(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    big = compile_c("mcp_big.c")
    client = StdioClient(tmp_path, str(big))
    try:
        client.send(msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
        client.answer(1)
        client.send(_search_call(2))
        client.send(msg({"jsonrpc": "2.0", "id": 2, "method": "ping"}))
        ping = client.answer(2)
        client.send(_quick_call(2))
        call = client.answer(2)
        for frame in (ping, call):
            assert frame["error"]["code"] == -32600, frame
            assert "already used" in frame["error"]["message"]
        client.send(_cancel(2), msg({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
        assert client.answer(3)["result"] == {}
        assert len([f for f in client.seen if f.get("id") == 2]) == 2  # the two refusals, nothing else
    finally:
        code = client.close()
    assert code == 0


def test_journal_client_is_the_clients_name_on_every_call(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    """Edits over one stdio connection are journaled under its clientInfo, not one id per call."""
    client = StdioClient(tmp_path, str(compile_c("sample.c")))
    try:
        client.send(msg({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
        assert client.answer(1)["result"]["protocolVersion"] == "2025-11-25"
        for rid, kind in ((2, "eol"), (3, "plate")):
            args = {"operation": "create", "params": {"selector": {"name": "main"}, "kind": kind, "text": "seen"}}
            call = {"name": "binlens_comment", "arguments": args}
            client.send(msg({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": call}))
            assert client.answer(rid)["result"]["isError"] is False
        listed = {"name": "binlens_journal", "arguments": {"operation": "list", "params": {}}}
        client.send(msg({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": listed}))
        entries = client.answer(4)["result"]["structuredContent"]["items"]
        assert [e["client"] for e in entries] == ["mcp:raw/1", "mcp:raw/1"]
    finally:
        client.close()
