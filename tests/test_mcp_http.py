"""Raw HTTP tests of /mcp and the legacy /sse + /messages transport: one per status-code or header rule."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcp_support import SseReader, start_http_server, stop

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
}
JSON = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def server(compile_c, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:  # noqa: ANN001
    sample = compile_c("sample.c")
    # keep-alive comments every 0.3 s so the SSE test sees them without a server of its own
    proc, base = start_http_server(
        tmp_path_factory.mktemp("http-home"), [sample], env={"BINLENS_SSE_KEEPALIVE_S": "0.3"}
    )
    yield base, sample
    stop(proc)


@pytest.fixture(scope="module")
def base(server: tuple[str, Path]) -> str:
    return server[0]


def modern(method: str, params: dict[str, Any] | None = None, rid: Any = 1) -> tuple[dict[str, Any], dict[str, str]]:
    """A 2026-07-28 request body and its routing headers."""
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**(params or {}), "_meta": dict(META)}}
    headers = {**JSON, "MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    name = (params or {}).get("name") or (params or {}).get("uri")
    if name is not None:
        headers["Mcp-Name"] = name
    return body, headers


def post(base: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(base + "/mcp", content=data, headers=headers or JSON, timeout=30)


def handshake(method: str, params: dict[str, Any] | None = None, version: str = "2025-11-25") -> tuple[dict, dict]:
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params or {}}
    return body, {**JSON, "MCP-Protocol-Version": version}


INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}


# --- plain HTTP rules -------------------------------------------------------------------------


def test_options_is_a_cors_preflight_204(base: str) -> None:
    r = httpx.options(
        base + "/mcp",
        headers={"Origin": "http://127.0.0.1:3000", "Access-Control-Request-Method": "POST"},
    )
    assert r.status_code == 204
    assert r.content == b""
    assert r.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = r.headers["access-control-allow-headers"].lower()
    for h in ("content-type", "authorization", "mcp-protocol-version", "mcp-method", "mcp-name"):
        assert h in allowed


@pytest.mark.parametrize("verb", ["GET", "DELETE", "PUT"])
def test_other_methods_are_405_with_allow(base: str, verb: str) -> None:
    r = httpx.request(verb, base + "/mcp", headers={"Accept": "text/event-stream"})
    assert r.status_code == 405
    assert r.headers["allow"] == "POST, OPTIONS"


def test_post_that_is_not_json_is_415(base: str) -> None:
    r = post(base, b"hello", {"Content-Type": "text/plain", "Accept": "application/json"})
    assert r.status_code == 415
    r = post(base, b"{}", {"Accept": "application/json"})  # no Content-Type at all
    assert r.status_code == 415


def test_notification_is_202_without_body(base: str) -> None:
    r = post(
        base, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {**JSON, "MCP-Protocol-Version": "2025-11-25"}
    )
    assert r.status_code == 202
    assert r.content == b""


def test_no_session_id_in_any_era(base: str) -> None:
    r = post(base, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT})
    assert r.status_code == 200 and "mcp-session-id" not in r.headers
    body, headers = modern("tools/list")
    r = post(base, body, headers)
    assert r.status_code == 200 and "mcp-session-id" not in r.headers


# --- handshake eras ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "got"),
    [
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2024-01-01", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),
    ],
)
def test_initialize_negotiates(base: str, asked: str, got: str) -> None:
    r = post(base, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {**INIT, "protocolVersion": asked}})
    assert r.status_code == 200
    res = r.json()["result"]
    assert res["protocolVersion"] == got
    assert res["serverInfo"]["name"] == "binlens"
    assert "tools" in res["capabilities"]


def test_handshake_request_with_negotiated_header(base: str) -> None:
    r = post(base, *handshake("tools/list", version="2025-06-18"))
    assert r.status_code == 200
    res = r.json()["result"]
    assert "binlens_help" in {t["name"] for t in res["tools"]}
    assert "resultType" not in res and "ttlMs" not in res  # 2026-07-28 fields stay out of older eras


def test_handshake_unsupported_header_version_is_400(base: str) -> None:
    r = post(base, *handshake("tools/list", version="2024-11-05"))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == -32022 and MODERN in err["data"]["supported"]


def test_ping_in_handshake_era(base: str) -> None:
    r = post(base, *handshake("ping"))
    assert r.status_code == 200 and r.json()["result"] == {}


def test_ping_in_2026(base: str) -> None:
    """Removed from the 2026-07-28 surface, still answered (as Ghidra Bridge does) for liveness checks."""
    r = post(base, *modern("ping"))
    assert r.status_code == 200
    res = r.json()["result"]
    assert res["resultType"] == "complete" and res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "binlens"
    body, headers = modern("ping")
    del body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    r = post(base, body, headers)  # the envelope rules still apply
    assert r.status_code == 400 and r.json()["error"]["code"] == -32602


def test_handshake_request_without_version_header_is_400(base: str) -> None:
    """After initialize, the negotiated version travels in MCP-Protocol-Version (no session keeps it)."""
    body, headers = handshake("tools/list")
    del headers["MCP-Protocol-Version"]
    r = post(base, body, headers)
    assert r.status_code == 400
    doc = r.json()
    assert doc["id"] == 7 and doc["error"]["code"] == -32600 and "MCP-Protocol-Version" in doc["error"]["message"]
    # initialize itself needs no header; a notification is still accepted
    assert post(base, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}, JSON).status_code == 200
    assert post(base, {"jsonrpc": "2.0", "method": "notifications/initialized"}, JSON).status_code == 202


def test_initialize_with_an_unsupported_version_header_is_400(base: str) -> None:
    headers = {**JSON, "MCP-Protocol-Version": "2024-11-05"}
    r = post(base, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}, headers)
    assert r.status_code == 400
    err = r.json()["error"]
    assert (
        err["code"] == -32022 and err["data"]["requested"] == "2024-11-05" and "2025-06-18" in err["data"]["supported"]
    )
    headers["MCP-Protocol-Version"] = "2025-06-18"  # a supported one is fine
    assert post(base, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}, headers).status_code == 200


# --- error id rules ---------------------------------------------------------------------------


def test_parse_error_id_null_for_2025_06_18(base: str) -> None:
    r = post(base, b"{not json", {**JSON, "MCP-Protocol-Version": "2025-06-18"})
    assert r.status_code == 400
    doc = r.json()
    assert doc["error"]["code"] == -32700 and "id" in doc and doc["id"] is None


@pytest.mark.parametrize("version", ["2025-11-25", MODERN])
def test_parse_error_omits_id_from_2025_11_25(base: str, version: str) -> None:
    r = post(base, b"{not json", {**JSON, "MCP-Protocol-Version": version})
    assert r.status_code == 400
    doc = r.json()
    assert doc["error"]["code"] == -32700 and "id" not in doc


def test_invalid_request_keeps_an_identifiable_id(base: str) -> None:
    r = post(base, {"jsonrpc": "2.0", "id": 9, "method": 5}, {**JSON, "MCP-Protocol-Version": "2025-11-25"})
    assert r.status_code == 400
    assert r.json() == {"jsonrpc": "2.0", "id": 9, "error": r.json()["error"]}
    assert r.json()["error"]["code"] == -32600


def test_batch_is_invalid_request(base: str) -> None:
    r = post(base, [{"jsonrpc": "2.0", "id": 1, "method": "ping"}], {**JSON, "MCP-Protocol-Version": "2025-06-18"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32600 and r.json()["id"] is None


# --- 2026-07-28 ---------------------------------------------------------------------------------


def test_discover(base: str) -> None:
    r = post(base, *modern("server/discover"))
    assert r.status_code == 200
    res = r.json()["result"]
    assert res["resultType"] == "complete"
    assert MODERN in res["supportedVersions"] and "2025-11-25" in res["supportedVersions"]
    assert isinstance(res["ttlMs"], int) and res["cacheScope"] in ("public", "private")
    assert res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "binlens"


@pytest.mark.parametrize("method", ["tools/list", "resources/list", "resources/templates/list"])
def test_cache_hints_on_lists(base: str, method: str) -> None:
    r = post(base, *modern(method))
    res = r.json()["result"]
    assert res["resultType"] == "complete" and isinstance(res["ttlMs"], int) and res["cacheScope"]


def test_resource_read_has_cache_hints_and_program_overview(server: tuple[str, Path]) -> None:
    base, sample = server
    listed = post(base, *modern("resources/list")).json()["result"]["resources"]
    overview = next(r for r in listed if r["uri"].startswith("binlens://programs/"))
    r = post(base, *modern("resources/read", {"uri": overview["uri"]}))
    res = r.json()["result"]
    assert isinstance(res["ttlMs"], int)
    doc = json.loads(res["contents"][0]["text"])
    assert doc["identity"]["file_name"] == sample.name and len(doc["identity"]["sha256"]) == 64
    r = post(base, *modern("resources/read", {"uri": "binlens://programs/nope/overview"}))
    assert "error" in r.json()


def test_header_version_mismatch_is_32020(base: str) -> None:
    body, headers = modern("tools/list")
    headers["MCP-Protocol-Version"] = "2025-11-25"
    r = post(base, body, headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32020


def test_missing_version_header_is_32020(base: str) -> None:
    body, headers = modern("tools/list")
    del headers["MCP-Protocol-Version"]
    r = post(base, body, headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32020


def test_method_header_mismatch_is_32020(base: str) -> None:
    body, headers = modern("tools/list")
    headers["Mcp-Method"] = "resources/list"
    r = post(base, body, headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32020


def test_name_header_mismatch_is_32020(base: str) -> None:
    body, headers = modern("tools/call", {"name": "binlens_help", "arguments": {}})
    headers["Mcp-Name"] = "binlens_symbol"
    r = post(base, body, headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32020


def test_base64_name_header_is_decoded(base: str) -> None:
    body, headers = modern("tools/call", {"name": "binlens_help", "arguments": {}})
    headers["Mcp-Name"] = "=?base64?" + base64.b64encode(b"binlens_help").decode() + "?="
    r = post(base, body, headers)
    assert r.status_code == 200 and r.json()["result"]["isError"] is False
    headers["Mcp-Name"] = "=?base64?" + base64.b64encode(b"binlens_other").decode() + "?="
    r = post(base, body, headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32020


def test_duplicated_routing_header_is_refused(base: str) -> None:
    body, headers = modern("tools/list")
    hdrs = [(k, v) for k, v in headers.items()] + [("Mcp-Method", "tools/list")]
    r = httpx.post(base + "/mcp", content=json.dumps(body), headers=hdrs)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32020


def test_unsupported_version_is_32022_with_supported_list(base: str) -> None:
    body, headers = modern("tools/list")
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2099-01-01"
    headers["MCP-Protocol-Version"] = "2099-01-01"
    r = post(base, body, headers)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == -32022
    assert err["data"]["supported"] == [MODERN, "2025-11-25", "2025-06-18"]
    assert err["data"]["requested"] == "2099-01-01"


def test_missing_meta_fields_is_32602(base: str) -> None:
    body, headers = modern("tools/list")
    del body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    r = post(base, body, headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32602


@pytest.mark.parametrize("method", ["no/such_method", "initialize", "logging/setLevel"])
def test_unknown_method_is_404_32601(base: str, method: str) -> None:
    r = post(base, *modern(method))
    assert r.status_code == 404
    doc = r.json()
    assert doc["id"] == 1 and doc["error"]["code"] == -32601


def test_unknown_tool_is_32602(base: str) -> None:
    r = post(base, *modern("tools/call", {"name": "binlens_nope", "arguments": {}}))
    assert r.status_code == 400 and r.json()["error"]["code"] == -32602


def test_tool_result_shape_and_method_error(base: str) -> None:
    r = post(base, *modern("tools/call", {"name": "binlens_symbol", "arguments": {"operation": "list"}}))
    res = r.json()["result"]
    assert res["resultType"] == "complete" and res["isError"] is False
    assert json.loads(res["content"][0]["text"]) == res["structuredContent"]
    args = {"operation": "get", "params": {"selector": {"address": "zzz"}}}
    res = post(base, *modern("tools/call", {"name": "binlens_symbol", "arguments": args})).json()["result"]
    assert res["isError"] is True
    err = res["structuredContent"]["error"]
    assert set(err) == {"status", "code", "message", "target", "details"}
    assert err["target"] == "/params/selector/address"
    bad_op = post(base, *modern("tools/call", {"name": "binlens_symbol", "arguments": {"operation": "fly"}}))
    assert bad_op.json()["result"]["structuredContent"]["error"]["target"] == "/arguments/operation"


def test_progress_streams_as_sse_scoped_to_the_request(base: str) -> None:
    params = {
        "name": "binlens_memory",
        "arguments": {"operation": "search", "params": {"regex": r"\x00{0,20}[^\x00]\x00{3}z"}},
    }
    body, headers = modern("tools/call", params)
    body["params"]["_meta"]["progressToken"] = "tok-1"
    with httpx.stream("POST", base + "/mcp", content=json.dumps(body), headers=headers, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[0]["method"] == "notifications/progress"
    assert events[0]["params"]["progressToken"] == "tok-1"
    assert events[-1]["id"] == 1 and events[-1]["result"]["isError"] is False


# --- legacy HTTP+SSE --------------------------------------------------------------------------


def test_sse_endpoint_event_then_202_and_message_event(base: str) -> None:
    sse = SseReader(base + "/sse")
    try:
        assert sse.response.headers["content-type"].startswith("text/event-stream")
        name, endpoint = sse.wait(lambda: sse.events and sse.events[0])
        assert name == "endpoint" and endpoint.startswith("/messages?sessionId=")
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {**INIT, "protocolVersion": "2025-11-25"}}
        r = httpx.post(base + endpoint, json=init)
        assert r.status_code == 202
        _, data = sse.wait(lambda: len(sse.events) >= 2 and sse.events[1])
        assert json.loads(data)["result"]["protocolVersion"] == "2025-11-25"
        r = httpx.post(base + endpoint, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert r.status_code == 202
        name, data = sse.wait(lambda: len(sse.events) >= 3 and sse.events[2])
        assert name == "message" and json.loads(data)["id"] == 2
        # parse errors are answered on the POST itself
        r = httpx.post(base + endpoint, content=b"{oops", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700
        r = httpx.post(base + endpoint, content=b"x", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
    finally:
        sse.close()
    # a client that goes away frees its session
    sid_endpoint = endpoint

    def gone() -> bool:
        return httpx.post(base + sid_endpoint, json={"jsonrpc": "2.0", "id": 3, "method": "ping"}).status_code == 404

    import time

    deadline = time.monotonic() + 10
    while not gone():
        assert time.monotonic() < deadline, "the SSE session outlived its client"
        time.sleep(0.1)


def test_messages_needs_a_known_session(base: str) -> None:
    r = httpx.post(base + "/messages", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert r.status_code == 400
    r = httpx.post(base + "/messages?sessionId=deadbeef", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert r.status_code == 404
    r = httpx.post(base + "/messages", json={"jsonrpc": "2.0", "id": 1}, headers={"Mcp-Session-Id": "deadbeef"})
    assert r.status_code == 404


def test_messages_takes_the_session_id_as_a_header(base: str) -> None:
    sse = SseReader(base + "/sse")
    try:
        _, endpoint = sse.wait(lambda: sse.events and sse.events[0])
        sid = endpoint.split("sessionId=", 1)[1]
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}
        r = httpx.post(base + "/messages", json=init, headers={"Mcp-Session-Id": sid})
        assert r.status_code == 202
        _, data = sse.wait(lambda: len(sse.events) >= 2 and sse.events[1])
        assert json.loads(data)["id"] == 1 and json.loads(data)["result"]["protocolVersion"] == "2025-06-18"
        # the query and the header must agree when both are given
        r = httpx.post(
            base + endpoint, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers={"Mcp-Session-Id": "x"}
        )
        assert r.status_code == 400
    finally:
        sse.close()


def test_sse_keepalive_comments(base: str) -> None:
    sse = SseReader(base + "/sse")
    try:
        sse.wait(lambda: sse.events and sse.events[0][0] == "endpoint")
        sse.wait(lambda: len(sse.comments) >= 2, timeout=10)
    finally:
        sse.close()


def test_prompts_list_and_get(base: str) -> None:
    res = post(base, *modern("prompts/list")).json()["result"]
    assert [p["name"] for p in res["prompts"]] == ["binlens_triage"]
    assert isinstance(res["ttlMs"], int)
    got = post(base, *modern("prompts/get", {"name": "binlens_triage", "arguments": {"program": "p1"}})).json()
    text = got["result"]["messages"][0]["content"]["text"]
    assert "binlens_program" in text and "'p1'" in text
    r = post(base, *modern("prompts/get", {"name": "nope"}))
    assert r.status_code == 400 and r.json()["error"]["code"] == -32602


def test_resource_not_found_codes_per_era(base: str) -> None:
    r = post(base, *modern("resources/read", {"uri": "binlens://nothing"}))
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32602 and r.json()["error"]["data"]["uri"] == "binlens://nothing"
    r = post(base, *handshake("resources/read", {"uri": "binlens://nothing"}))
    assert r.status_code == 404 and r.json()["error"]["code"] == -32002


def test_huge_body_is_413_and_the_server_keeps_serving(base: str) -> None:
    huge = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"' + b"x" * (5 << 20) + b'"}}'
    r = post(base, huge, {**JSON, "MCP-Protocol-Version": "2025-11-25"})
    assert r.status_code == 413 and r.json()["error"]["code"] == -32600
    assert post(base, *handshake("ping")).json()["result"] == {}


@pytest.mark.parametrize(
    ("arguments", "target", "code"),
    [
        ({}, "/arguments/operation", "invalid_argument"),
        ({"operation": "list", "extra": 1}, "/arguments/extra", "invalid_argument"),
        ({"operation": "list", "params": "nope"}, "/params", "invalid_argument"),
        ({"operation": "list", "params": {"page": {"limit": 0}}}, "/params/page/limit", "invalid_argument"),
        ({"operation": "list", "params": {"bogus": True}}, "/params/bogus", "invalid_argument"),
    ],
)
def test_bad_tool_arguments_are_tool_errors_with_pointers(base: str, arguments: dict, target: str, code: str) -> None:
    r = post(base, *modern("tools/call", {"name": "binlens_symbol", "arguments": arguments}))
    assert r.status_code == 200
    res = r.json()["result"]
    assert res["isError"] is True
    err = res["structuredContent"]["error"]
    assert err["code"] == code and err["target"] == target


def test_help_with_bad_arguments(base: str) -> None:
    for args, target in [
        ({"domain": "nope"}, "/arguments/domain"),
        ({"operation": "list"}, "/arguments/domain"),
        ({"domain": "symbol", "operation": "fly"}, "/arguments/operation"),
    ]:
        res = post(base, *modern("tools/call", {"name": "binlens_help", "arguments": args})).json()["result"]
        assert res["isError"] is True and res["structuredContent"]["error"]["target"] == target


def test_stopping_server_answers_open_requests_503_and_exits_0(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    import signal
    import threading
    import time

    proc, url = start_http_server(tmp_path, [compile_c("mcp_big.c")])
    slow = {"regex": r"\x00{0,20}[^\x00]\x00{3}z", "scan": {"timeout_ms": 60000}}  # ~9 s uncancelled
    body, headers = handshake(
        "tools/call", {"name": "binlens_memory", "arguments": {"operation": "search", "params": slow}}
    )
    got: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: got.setdefault("r", post(url, body, headers)))
    t.start()
    time.sleep(1.5)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    t.join(20)
    assert time.monotonic() - started < 8
    r = got["r"]
    assert r.status_code == 503 and r.json()["id"] == 7 and r.json()["error"]["code"] == -32603


def test_serve_tool_separator_dot_from_the_environment(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    """`BINLENS_TOOL_SEPARATOR=. binlens serve` names tools binlens.help, binlens.symbol, ..."""
    env = {"BINLENS_TOOL_SEPARATOR": "."}
    proc, url = start_http_server(tmp_path / "home", [compile_c("sample.c")], env=env)
    try:
        body, headers = modern("tools/list")
        names = {t["name"] for t in post(url, body, headers).json()["result"]["tools"]}
        assert {"binlens.help", "binlens.symbol"} <= names
        assert all(n.startswith("binlens.") for n in names)
    finally:
        stop(proc)


def test_sse_refuses_a_second_request_with_a_running_id(compile_c, tmp_path: Path) -> None:  # noqa: ANN001
    big = compile_c("mcp_big.c")
    proc, base = start_http_server(tmp_path, [big])
    sse = SseReader(base + "/sse")
    try:
        _, endpoint = sse.wait(lambda: sse.events and sse.events[0])
        url = base + endpoint
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {**INIT, "protocolVersion": "2025-11-25"}}
        assert httpx.post(url, json=init).status_code == 202
        params = {"regex": r"\x00{0,20}[^\x00]\x00{3}z", "scan": {"timeout_ms": 60000}}
        call = {"name": "binlens_memory", "arguments": {"operation": "search", "params": params}}
        search = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
        assert httpx.post(url, json=search).status_code == 202
        assert httpx.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}).status_code == 202

        def answers(rid: Any) -> list[dict[str, Any]]:
            return [m for m in (json.loads(d) for n, d in sse.events if n == "message") if m.get("id") == rid]

        refusal = sse.wait(lambda: answers(2))[0]
        assert refusal["error"]["code"] == -32600 and "already used" in refusal["error"]["message"]
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
        assert httpx.post(url, json=cancel).status_code == 202
        assert httpx.post(url, json={"jsonrpc": "2.0", "id": 3, "method": "ping"}).status_code == 202
        assert sse.wait(lambda: answers(3))[0]["result"] == {}
        assert len(answers(2)) == 1  # the refusal only: the cancelled search is not answered
    finally:
        sse.close()
        stop(proc)


def test_journal_client_is_stable_per_client_info_and_credential(server: tuple[str, Path]) -> None:
    """Each call of one client is journaled under one name: its clientInfo, and a digest of the
    credential it sent (never the credential itself); another credential is another client."""
    base = server[0]
    secret = "Bearer s3cret-" + "x" * 20

    def comment(kind: str, auth: str | None, *, handshake_era: bool = False) -> None:
        params = {"selector": {"name": "main"}, "kind": kind, "text": f"journal client {kind} {auth is None}"}
        call = {"name": "binlens_comment", "arguments": {"operation": "upsert", "params": params}}
        body, headers = handshake("tools/call", call) if handshake_era else modern("tools/call", call)
        if auth is not None:
            headers["Authorization"] = auth
        assert post(base, body, headers).json()["result"]["isError"] is False

    comment("eol", None)
    comment("pre", None)
    comment("eol", secret)
    comment("pre", secret)
    comment("plate", None, handshake_era=True)  # no clientInfo on a stateless handshake-era POST
    args = {"operation": "list", "params": {"newest_first": True, "page": {"limit": 5}}}
    body, headers = modern("tools/call", {"name": "binlens_journal", "arguments": args})
    entries = post(base, body, headers).json()["result"]["structuredContent"]["items"]
    clients = [e["client"] for e in reversed(entries)]
    assert clients[:2] == ["mcp:raw/1", "mcp:raw/1"]
    assert (
        clients[2] == clients[3] and clients[2].startswith("mcp:raw/1#") and len(clients[2]) == len("mcp:raw/1#") + 12
    )
    assert "s3cret" not in json.dumps(entries)
    assert clients[4] == "mcp:unknown"
