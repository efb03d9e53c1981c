"""SPEC §5 over raw HTTP against real `binlens serve` processes: tokens, Origin/Host, logs, read-only, roots."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, unquote_plus

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from serve_support import TOKEN, ServerProcess, env_for, raw_http, ws_call

pytestmark = pytest.mark.timeout(120)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def sample(compile_c) -> Path:  # noqa: ANN001
    return compile_c("sample.c")


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory, sample: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path_factory.mktemp("sec-home"),
        str(sample),
        "--token",
        TOKEN,
        "--allow-origin",
        "https://app.example.org",
    )
    yield srv
    srv.stop()


# --- /healthz and bearer tokens -----------------------------------------------------------------
def test_healthz_reports_status_and_programs(token_server: ServerProcess) -> None:
    r = httpx.get(token_server.base + "/healthz", headers=AUTH, timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["programs"] == 1 and body["version"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer " + TOKEN[:-1]},
        {"Authorization": "Bearer " + TOKEN + "x"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ],
)
def test_missing_or_wrong_bearer_token_is_401(token_server: ServerProcess, headers: dict[str, str]) -> None:
    for path in ("/healthz", "/mcp", "/sse", "/nonexistent"):
        r = httpx.get(token_server.base + path, headers=headers, timeout=10)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"].startswith("Bearer")
    r = httpx.post(
        token_server.base + "/mcp",
        headers={**headers, "Content-Type": "application/json"},
        content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        timeout=10,
    )
    assert r.status_code == 401


def test_bearer_scheme_is_case_insensitive(token_server: ServerProcess) -> None:
    r = httpx.get(token_server.base + "/healthz", headers={"Authorization": f"bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 200


@pytest.mark.parametrize("query", [f"token={TOKEN}", f"access_token={TOKEN}", "api_key=whatever", f"q={TOKEN}"])
def test_token_in_query_string_is_400(token_server: ServerProcess, query: str) -> None:
    for path in ("/healthz", "/mcp", "/messages"):
        r = httpx.get(f"{token_server.base}{path}?{query}", headers=AUTH, timeout=10)
        assert r.status_code == 400, path
        assert "query string" in r.json()["error"]["message"]
    # refused before auth: without a header it is still 400, not 401
    assert httpx.get(f"{token_server.base}/healthz?{query}", timeout=10).status_code == 400


def test_options_preflight_needs_no_token(token_server: ServerProcess) -> None:
    r = httpx.request(
        "OPTIONS",
        token_server.base + "/mcp",
        headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    assert r.status_code == 204


# --- Origin and Host ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "origin", ["http://evil.example", "https://127.0.0.1.evil.example", "null", "file://", "http://app.example.org"]
)
def test_foreign_origin_is_403(token_server: ServerProcess, origin: str) -> None:
    for path in ("/healthz", "/mcp", "/sse"):
        r = httpx.get(token_server.base + path, headers={**AUTH, "Origin": origin}, timeout=10)
        assert r.status_code == 403, (path, origin)


@pytest.mark.parametrize(
    "origin", ["http://localhost:5173", "http://127.0.0.1", "http://[::1]:8080", "https://app.example.org"]
)
def test_loopback_and_allowed_origins_pass(token_server: ServerProcess, origin: str) -> None:
    r = httpx.get(token_server.base + "/healthz", headers={**AUTH, "Origin": origin}, timeout=10)
    assert r.status_code == 200


def test_foreign_origin_on_websocket_handshake_is_403(token_server: ServerProcess) -> None:
    async def go() -> int:
        try:
            async with connect(token_server.ws_url, additional_headers=AUTH, origin="http://evil.example"):  # type: ignore[arg-type]
                return 101
        except InvalidStatus as err:
            return err.response.status_code

    assert asyncio.run(go()) == 403


def test_dns_rebinding_host_is_403(token_server: ServerProcess) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    for host in ("evil.example.com", f"evil.example.com:{token_server.port}"):
        r = httpx.post(
            token_server.base + "/mcp",
            headers={**AUTH, "Host": host, "Content-Type": "application/json"},
            json=body,
            timeout=10,
        )
        assert r.status_code == 403
    r = httpx.get(
        token_server.base + "/healthz", headers={**AUTH, "Host": f"localhost:{token_server.port}"}, timeout=10
    )
    assert r.status_code == 200


# --- start-up rules -----------------------------------------------------------------------------
def test_non_loopback_host_without_token_refuses_to_start(tmp_path: Path, sample: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "binlens", "serve", str(sample), "--host", "0.0.0.0", "--port", "0"],
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "token" in proc.stderr and "0.0.0.0" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("127.example", "does not resolve"),  # begins like 127/8 but is a name, and no resolver here knows it
        ("0.0.0.0", "not (or does not resolve only to) a loopback address"),
        ("::", "not (or does not resolve only to) a loopback address"),
        ("", "not (or does not resolve only to) a loopback address"),  # every interface
    ],
)
def test_host_off_loopback_refuses_to_start_without_a_token(tmp_path: Path, sample: Path, host: str, why: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "binlens", "serve", str(sample), "--host", host, "--port", "0"],
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert why in proc.stderr and "ready" not in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_host_resolving_to_loopback_starts_without_a_token(tmp_path: Path, sample: Path, host: str) -> None:
    with ServerProcess(tmp_path, str(sample), "--host", host) as srv:
        assert "plain HTTP" not in srv.stderr  # a loopback listener: no network warning
        if ":" not in host:  # the helper's client speaks IPv4
            assert httpx.get(f"http://{host}:{srv.port}/healthz", timeout=10).status_code == 200


def test_short_token_refuses_to_start(tmp_path: Path, sample: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "binlens", "serve", str(sample), "--token", "short", "--port", "0"],
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "at least 16" in proc.stderr


def test_non_loopback_host_with_env_token_starts_and_requires_it(tmp_path: Path, sample: Path) -> None:
    env = env_for(tmp_path, BINLENS_TOKEN=TOKEN)
    with ServerProcess(tmp_path, str(sample), "--host", "0.0.0.0", env=env) as srv:
        assert httpx.get(srv.base + "/healthz", timeout=10).status_code == 401
        assert httpx.get(srv.base + "/healthz", headers=AUTH, timeout=10).status_code == 200


def test_tokens_never_appear_in_logs(tmp_path: Path, sample: Path) -> None:
    srv = ServerProcess(tmp_path, str(sample), "--token", TOKEN, "-v")
    try:
        assert httpx.get(srv.base + "/healthz", headers=AUTH, timeout=10).status_code == 200
        assert httpx.get(f"{srv.base}/healthz?token={TOKEN}", timeout=10).status_code == 400
        assert httpx.get(f"{srv.base}/mcp?x={TOKEN}&sessionId=1", timeout=10).status_code == 400
        assert (
            httpx.get(srv.base + "/healthz", headers={"Authorization": f"Bearer {TOKEN}x"}, timeout=10).status_code
            == 401
        )

        async def ws() -> None:
            for url in (f"{srv.ws_url}?access_token={TOKEN}", srv.ws_url):
                try:
                    async with connect(url, open_timeout=10, additional_headers=AUTH) as c:
                        await c.recv()
                except InvalidStatus:
                    pass

        asyncio.run(ws())
    finally:
        srv.stop()
    logs = srv.stderr + srv.stdout
    assert '"GET /healthz' in logs and "WebSocket /ws" in logs  # the access log was on
    assert TOKEN not in logs
    assert TOKEN[:12] not in logs


def _pct(text: str, fmt: str = "%{:02X}") -> str:
    return "".join(fmt.format(ord(c)) for c in text)


def _decoded_forms(line: str) -> set[str]:
    forms = {line}
    for decode in (unquote, unquote_plus):
        current = line
        for _ in range(4):
            current = decode(current)
            forms.add(current)
    return forms


def test_tokens_in_any_encoding_never_reach_the_log(tmp_path: Path, sample: Path) -> None:
    """Tokens sent percent-, plus- and double-encoded, under names in any case: no log line holds one."""
    other = "Zm9vOmJhci1zZWNyZXQtdmFsdWU"  # a credential that is not the server's token
    queries = [
        f"/healthz?token={_pct(TOKEN)}",
        f"/healthz?x={_pct(TOKEN, '%{:02x}')}",
        f"/healthz?x={_pct(_pct(TOKEN))}",  # double-encoded: the guard sees no token, the log must not either
        f"/healthz?x={_pct(_pct(_pct(TOKEN)))}",
        f"/healthz?%74oken={TOKEN[:6]}{_pct(TOKEN[6:])}",
        f"/healthz?ACCESS_TOKEN={_pct(TOKEN[:20])}{TOKEN[20:]}",
        f"/healthz?Access%5FToken={other}",
        f"/healthz?x=Bearer+{_pct(TOKEN)}",
        f"/healthz?x=%42earer%20{other}",
        f"/healthz?x=%2526access_token%253D{other}",
        f"/healthz?x=%41uthorization%3A+Basic+{other}",
        f"/mcp/{_pct(TOKEN)}?cursor=1",
    ]
    srv = ServerProcess(tmp_path, str(sample), "--token", TOKEN, "-v")
    try:
        statuses = [
            raw_http(srv.port, f"GET {q} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")[0] for q in queries
        ]
        assert httpx.get(srv.base + "/healthz?cursor=a%2Fb", headers=AUTH, timeout=10).status_code == 200
    finally:
        srv.stop()
    assert all(s in (400, 401, 404) for s in statuses), statuses
    lines = srv.stderr.splitlines()
    assert sum('"GET /healthz?' in ln or '"GET /mcp/' in ln for ln in lines) >= len(queries)  # access log on
    assert any("cursor=a%2Fb" in ln for ln in lines)  # ordinary encoded parameters stay readable
    for line in lines:
        for form in _decoded_forms(line):
            assert TOKEN[:12] not in form and other not in form, line


# --- read-only and roots ------------------------------------------------------------------------
def test_program_open_only_under_roots_and_read_only(tmp_path: Path, sample: Path, compile_c) -> None:  # noqa: ANN001
    inside = tmp_path / "inside"
    outside = tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    served = shutil.copy(sample, inside / "served")
    shutil.copy(compile_c("sample.c", opt="-O0"), inside / "neighbour")  # other bytes: another program
    foreign = shutil.copy(compile_c("sample.c", opt="-O1"), outside / "foreign")
    (inside / "link").symlink_to(foreign)
    with ServerProcess(tmp_path / "home", str(served), "--ws-clients", "4") as srv:
        # No --root: exactly the started FILE, not even its neighbours.
        ok = ws_call(srv.ws_url, "program.open", {"path": str(inside / "served")})
        assert ok["result"]["identity"]["file_name"] == "served"
        for path in (inside / "neighbour", foreign, inside / "link", str(inside / ".." / "outside" / "foreign")):
            reply = ws_call(srv.ws_url, "program.open", {"path": str(path)})
            assert reply["error"]["code"] == -32000, path
            assert reply["error"]["data"]["target"] == "/params/path"
            assert "not one of the files this server was started on" in reply["error"]["data"]["message"]
    with ServerProcess(tmp_path / "home", str(served), "--root", str(inside), "--ws-clients", "4") as srv:
        ok = ws_call(srv.ws_url, "program.open", {"path": str(inside / "neighbour")})
        assert ok["result"]["identity"]["file_name"] == "neighbour"
        for path in (foreign, inside / "link", str(inside / ".." / "outside" / "foreign")):
            reply = ws_call(srv.ws_url, "program.open", {"path": str(path)})
            assert reply["error"]["code"] == -32000, path
            assert reply["error"]["data"]["target"] == "/params/path"
            assert "outside the allowed roots" in reply["error"]["data"]["message"]
    with ServerProcess(tmp_path / "home", str(served), "--root", str(outside), "--read-only") as srv:
        ok = ws_call(srv.ws_url, "program.open", {"path": str(foreign)})
        assert "result" in ok
        reply = ws_call(srv.ws_url, "program.open", {"path": str(inside / "neighbour")})
        assert reply["error"]["data"]["target"] == "/params/path"
        check_read_only(srv)


def check_read_only(srv: ServerProcess) -> None:
    """`--read-only`: session.get says so and reports every mutation unavailable with the reason;
    interface.get still lists every method (never hidden); calling a mutation is refused."""
    from binlens.api import REGISTRY

    info = ws_call(srv.ws_url, "session.get", {})
    assert info["result"]["read_only"] is True
    mutations = sorted(name for name, spec in REGISTRY.items() if spec.mutates)
    availability = info["result"]["tool_availability"]
    for name in mutations:
        got = availability[name]
        assert (got["available"], got["reason"]) == (False, "the server is read-only"), name
    plain_reads = [name for name, spec in REGISTRY.items() if not spec.mutates and not spec.requires]
    assert all(availability[name]["available"] for name in plain_reads)
    listed = ws_call(srv.ws_url, "interface.get", {"schemas": False})["result"]["methods"]
    assert {m["name"] for m in listed} == set(REGISTRY)
    for name in mutations:
        reply = ws_call(srv.ws_url, name, {})
        assert reply["error"]["code"] == -32000 and reply["error"]["data"]["code"] == "unavailable", name
