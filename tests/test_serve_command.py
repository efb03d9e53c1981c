"""`binlens serve` as a command: ready line, mcpServers entries, exit statuses, signals, defaults."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from serve_support import TOKEN, ServerProcess, env_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sample(compile_c) -> Path:  # noqa: ANN001
    return compile_c("sample.c")


def run_serve(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "binlens", "serve", *args],
        env=env_for(home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_ready_line_mcp_config_prefix_and_sigterm(tmp_path: Path, sample: Path) -> None:
    env = env_for(tmp_path, BINLENS_TOKEN=TOKEN)
    srv = ServerProcess(tmp_path, str(sample), "--tool-prefix", "tb", "--print-mcp-config", env=env)
    try:
        ready = next(line for line in srv.stderr_lines if "binlens serve: ready" in line)
        for url in ("/mcp", "/sse", "/healthz"):
            assert f"http://127.0.0.1:{srv.port}{url}" in ready
        assert f"ws://127.0.0.1:{srv.port}/ws" in ready
        deadline = time.monotonic() + 10
        while not srv.stdout.rstrip().endswith("}") and time.monotonic() < deadline:
            time.sleep(0.05)  # stdout is drained by another thread than the ready line
        config = json.loads(srv.stdout)["mcpServers"]
        stdio = config["binlens"]
        assert Path(stdio["command"]).name == "binlens"
        assert stdio["args"] == ["mcp", str(sample.resolve()), "--tool-prefix", "tb"]  # names as this server
        http = config["binlens-http"]
        assert http["url"] == f"http://127.0.0.1:{srv.port}/mcp"
        assert http["headers"] == {"Authorization": "Bearer ${BINLENS_TOKEN}"}
        assert TOKEN not in srv.stdout + srv.stderr

        async def ready_method() -> str:
            async with connect(srv.ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as c:
                return json.loads(await c.recv())["method"]

        assert asyncio.run(ready_method()) == "tb.ready"
        assert srv.stop(signal.SIGTERM) == 0
        assert "binlens serve: stopped" in srv.stderr
        assert "Traceback" not in srv.stderr
    finally:
        srv.kill()


def test_mcp_config_carries_the_permissions(sample: Path) -> None:
    """The stdio entry grants what this server was started with: --allow-debug, --allow-live-pid."""
    from binlens.cli.main import build_parser
    from binlens.cli.serve_command import mcp_config

    args = build_parser().parse_args(["serve", str(sample), "--read-only", "--allow-debug", "--allow-live-pid", "4242"])
    stdio = mcp_config(args, "http://127.0.0.1:1", [sample])["mcpServers"]["binlens"]
    assert stdio["args"] == ["mcp", str(sample), "--read-only", "--allow-debug", "--allow-live-pid", "4242"]


def test_unopenable_file_exits_1(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"this is not an executable" * 10)
    proc = run_serve(tmp_path, str(junk), "--port", "0")
    assert proc.returncode == 1
    assert "junk.bin" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_serve(tmp_path, str(tmp_path / "missing"), "--port", "0")
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args", [["--tool-prefix", "1bad"], ["--port", "70000"], ["--max-concurrent", "0"], ["--ws-clients", "x"]]
)
def test_usage_errors_exit_2(tmp_path: Path, sample: Path, args: list[str]) -> None:
    proc = run_serve(tmp_path, str(sample), *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_port_in_use_exits_1(tmp_path: Path, sample: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = run_serve(tmp_path, str(sample), "--port", str(port))
    assert proc.returncode == 1
    assert "address already in use" in proc.stderr.lower() and "could not listen" in proc.stderr


def test_no_file_serves_with_the_current_folder_as_root(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    srv = ServerProcess(tmp_path, cwd=work)
    try:
        assert httpx.get(srv.base + "/healthz", timeout=10).json()["programs"] == 0

        async def roots() -> list[str]:
            async with connect(srv.ws_url) as c:
                await c.recv()
                await c.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.get"}))
                return json.loads(await c.recv())["result"]["roots"]

        assert asyncio.run(roots()) == [str(work.resolve())]
    finally:
        srv.stop()


def test_stop_ends_open_http_streams_cleanly(tmp_path: Path, sample: Path) -> None:
    srv = ServerProcess(tmp_path, str(sample))
    lines: list[str] = []
    ended: list[str] = []

    def read_sse() -> None:
        try:
            with httpx.stream("GET", srv.base + "/sse", timeout=30) as r:
                for line in r.iter_lines():
                    lines.append(line)
            ended.append("clean")
        except httpx.HTTPError as err:
            ended.append(repr(err))

    reader = threading.Thread(target=read_sse, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 10
        while not any(line.startswith("event: endpoint") for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(line.startswith("event: endpoint") for line in lines)
        t0 = time.monotonic()
        assert srv.stop(signal.SIGTERM) == 0
        assert time.monotonic() - t0 < 4.5  # well under uvicorn's 5 s graceful timeout
        reader.join(10)
        assert ended == ["clean"]  # the stream was terminated properly, not cut
        assert "ERROR" not in srv.stderr and "Traceback" not in srv.stderr
    finally:
        srv.kill()
