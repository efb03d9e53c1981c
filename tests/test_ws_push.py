"""Server-pushed notifications on /ws (the debugger's events will use them): WsHub.post from another thread."""

from __future__ import annotations

import threading
from pathlib import Path

from starlette.testclient import TestClient

from binlens.server.app import build_app
from binlens.server.options import ServerOptions
from binlens.workspace import Config, Workspace


def test_post_from_a_thread_reaches_one_client_or_all(home: Path, compile_c) -> None:  # noqa: ANN001
    from binlens.api import REGISTRY  # noqa: F401 - registers the methods

    ws = Workspace(Config(home=home))
    ws.open(compile_c("sample.c"), check_roots=False)
    app = build_app(ws, ServerOptions(ws_clients=2))
    hub = app.state.ws_hub
    assert hub.post("binlens.event", {"n": 0}) is False  # no client has connected: nowhere to post
    host = {"host": "127.0.0.1"}  # the TestClient's default Host, testserver, is not loopback
    client = TestClient(app, base_url="http://127.0.0.1")
    with client, client.websocket_connect("/ws", headers=host) as a, client.websocket_connect("/ws", headers=host) as b:
        sa = a.receive_json()["params"]["session"]
        b.receive_json()
        worker = threading.Thread(target=hub.post, args=("binlens.debug.stopped", {"pc": "0x1149"}, sa))
        worker.start()
        worker.join()
        assert a.receive_json() == {"jsonrpc": "2.0", "method": "binlens.debug.stopped", "params": {"pc": "0x1149"}}
        assert hub.post("binlens.event", {"n": 1}) is True
        for c in (a, b):
            assert c.receive_json() == {"jsonrpc": "2.0", "method": "binlens.event", "params": {"n": 1}}
        # b never got the targeted event: its next frame answers its own request
        b.send_json({"jsonrpc": "2.0", "id": 5, "method": "session.get"})
        assert b.receive_json()["id"] == 5
