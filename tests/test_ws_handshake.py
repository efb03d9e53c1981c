"""/ws handshake refusals before the upgrade (SPEC §4): 400, 401, 404, 405, 409, and slot release."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from serve_support import TOKEN, ServerProcess, env_for, raw_http, upgrade_request

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sample(compile_c) -> Path:  # noqa: ANN001
    return compile_c("sample.c")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sample: Path) -> Iterator[ServerProcess]:
    """Exclusive mode (the default): one WebSocket client at a time."""
    srv = ServerProcess(tmp_path_factory.mktemp("hs-home"), str(sample))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory, sample: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("hs-tok"), str(sample), "--token", TOKEN, "--ws-clients", "2")
    yield srv
    srv.stop()


def status_of(url: str, **kw: object) -> int:
    async def go() -> int:
        try:
            async with connect(url, open_timeout=10, **kw) as c:  # type: ignore[arg-type]
                await c.recv()
                return 101
        except InvalidStatus as err:
            return err.response.status_code

    return asyncio.run(go())


async def connect_when_free(url: str):  # noqa: ANN201
    """Connect, retrying while a previous test's client still holds the exclusive slot."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return await connect(url, open_timeout=10)
        except InvalidStatus as err:
            if err.response.status_code != 409 or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def test_get_without_upgrade_headers_is_400(server: ServerProcess) -> None:
    r = httpx.get(server.base + "/ws", timeout=10)
    assert r.status_code == 400
    assert "upgrade" in r.json()["error"]["message"].lower()


def test_bad_websocket_version_is_400(server: ServerProcess) -> None:
    status, headers, _ = raw_http(server.port, upgrade_request(version="8"))
    assert status == 400
    status, _, _ = raw_http(server.port, upgrade_request(version="13"))
    assert status == 101  # the same request with version 13 upgrades


def test_missing_key_is_400(server: ServerProcess) -> None:
    req = upgrade_request().replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "")
    assert "Sec-WebSocket-Key" not in req
    status, _, _ = raw_http(server.port, req)
    assert status == 400


def test_token_in_query_is_400(token_server: ServerProcess) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert status_of(token_server.ws_url + f"?token={TOKEN}", additional_headers=auth) == 400
    assert status_of(token_server.ws_url + f"?access_token={TOKEN}") == 400
    assert status_of(token_server.ws_url + f"?x={TOKEN}", additional_headers=auth) == 400
    assert status_of(token_server.ws_url, additional_headers=auth) == 101


def test_missing_or_wrong_token_is_401(token_server: ServerProcess) -> None:
    assert status_of(token_server.ws_url) == 401
    assert status_of(token_server.ws_url, additional_headers={"Authorization": "Bearer " + "x" * len(TOKEN)}) == 401
    assert status_of(token_server.ws_url, additional_headers={"Authorization": f"Basic {TOKEN}"}) == 401
    assert status_of(token_server.ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) == 101


def test_other_path_is_404(server: ServerProcess) -> None:
    assert status_of(f"ws://127.0.0.1:{server.port}/wss") == 404
    assert status_of(f"ws://127.0.0.1:{server.port}/ws/extra") == 404


def test_not_get_is_405(server: ServerProcess) -> None:
    r = httpx.post(server.base + "/ws", content=b"{}", timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    status, headers, _ = raw_http(server.port, upgrade_request(method="POST"))
    assert status == 405


def test_second_client_is_409_in_exclusive_mode(server: ServerProcess) -> None:
    async def go() -> None:
        async with await connect_when_free(server.ws_url) as first:
            await first.recv()
            with pytest.raises(InvalidStatus) as info:
                async with connect(server.ws_url, open_timeout=10):
                    pass
            assert info.value.response.status_code == 409
            assert b"exclusive" in info.value.response.body
            # the first client is unaffected
            await first.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.get", "params": {}}))
            assert json.loads(await first.recv())["id"] == 1

    asyncio.run(go())


def test_ws_clients_n_allows_n(token_server: ServerProcess) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def go() -> None:
        a = await connect(token_server.ws_url, open_timeout=10, additional_headers=auth)
        b = await connect(token_server.ws_url, open_timeout=10, additional_headers=auth)
        with pytest.raises(InvalidStatus) as info:
            await connect(token_server.ws_url, open_timeout=10, additional_headers=auth)
        assert info.value.response.status_code == 409
        assert b"--ws-clients 2" in info.value.response.body
        await a.close()
        await b.close()

    asyncio.run(go())


CLIENT = """
import asyncio, sys
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
async def main():
    for _ in range(100):
        try:
            c = await connect(sys.argv[1], open_timeout=10)
            break
        except InvalidStatus:
            await asyncio.sleep(0.05)
    await c.recv()
    print("connected", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def test_killed_client_frees_its_slot(server: ServerProcess) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CLIENT, server.ws_url],
        stdout=subprocess.PIPE,
        text=True,
        env=env_for(Path("/nonexistent")),
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "connected"
        assert status_of(server.ws_url) == 409
        child.kill()
        child.wait(10)
        deadline = time.monotonic() + 10
        status = 409
        while status == 409 and time.monotonic() < deadline:
            time.sleep(0.1)
            status = status_of(server.ws_url)
        assert status == 101
    finally:
        child.kill()
        child.wait()
