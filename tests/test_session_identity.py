"""session.get as REA's binary_session (SPEC §6, issue 26 item 1): package, build, path, MCP SDK,
the negotiated protocol version, the catalog digest, per-method availability with client
features, mismatches against what the client expects; the catalog never hides a method."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import rfc8785
from mcp import Client
from mcp.client.stdio import StdioServerParameters

import binlens
from binlens.api import REGISTRY, invoke
from binlens.api.interface import as_ijson
from binlens.api.models import Params
from binlens.api.registry import READ_ONLY, CallContext, method
from binlens.errors import BinlensError
from binlens.workspace import Config, Workspace
from conftest import ROOT
from mcp_support import env_for

pytestmark = pytest.mark.timeout(180)


class NoParams(Params):
    """No params."""


def test_session_get_names_the_package_build_sdk_and_catalog(tmp_path: Path) -> None:
    """The identity fields are the real ones: the git HEAD this checkout runs from, the installed
    MCP SDK, and the sha256 of the RFC 8785 form of the full interface.get."""
    ws = Workspace(Config(home=tmp_path))
    info = invoke(ws, "session.get", {})
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert info["build_revision"] == head.stdout.strip()
    assert info["version"] == binlens.__version__
    assert info["mcp_sdk_version"] == importlib.metadata.version("mcp")
    assert Path(info["server_path"]) == Path(binlens.__file__).resolve().parent
    assert (info["transport"], info["protocol_version"], info["client_features"]) == ("local", None, None)
    catalog = invoke(ws, "interface.get", {})
    assert info["catalog_digest"] == hashlib.sha256(rfc8785.dumps(as_ijson(catalog))).hexdigest()
    assert as_ijson({"maximum": 1 << 64, "n": 3, "b": True}) == {"maximum": 1.8446744073709552e19, "n": 3, "b": True}
    assert set(info["tool_availability"]) == set(REGISTRY) and info["mismatches"] == []


def test_expected_inputs_report_mismatches(tmp_path: Path) -> None:
    """expected_package_version / _catalog_digest / _server_path: equal ones pass, others are listed."""
    ws = Workspace(Config(home=tmp_path))
    info = invoke(ws, "session.get", {})
    same = {
        "expected_package_version": info["version"],
        "expected_catalog_digest": info["catalog_digest"],
        "expected_server_path": info["server_path"],
    }
    assert invoke(ws, "session.get", same)["mismatches"] == []
    assert invoke(ws, "session.get", {"expected_server_path": sys.executable})["mismatches"] == []
    other = {
        "expected_package_version": "0.0.1",
        "expected_catalog_digest": "0" * 64,
        "expected_server_path": str(tmp_path / "another" / "binlens"),
    }
    got = {m["field"]: m for m in invoke(ws, "session.get", other)["mismatches"]}
    assert set(got) == set(other)
    assert got["expected_package_version"]["actual"] == info["version"]
    assert got["expected_catalog_digest"]["actual"] == info["catalog_digest"]
    assert got["expected_server_path"]["actual"] == info["server_path"]


def test_a_method_that_needs_a_client_feature(tmp_path: Path) -> None:
    """`requires=("client:sampling",)`: unavailable (reason, remedy, the feature missing) for a
    client that did not declare sampling, available and callable for one that did."""
    name = "testonly.needs_sampling"

    @method(name, effect=READ_ONLY, requires=("client:sampling",))
    def needs_sampling(ws: Any, p: NoParams) -> dict[str, str]:
        """Answers clients that can sample."""
        return {"ok": "yes"}

    try:
        ws = Workspace(Config(home=tmp_path))
        without = CallContext(transport="mcp", protocol_version="2025-11-25", client_features=frozenset({"roots"}))
        got = invoke(ws, "session.get", {}, without)["tool_availability"][name]
        assert got == {
            "available": False,
            "reason": "the client did not negotiate 'sampling'",
            "remediation": "use a client that declares the 'sampling' capability when it connects",
            "required_client_features": ["sampling"],
            "missing_client_features": ["sampling"],
        }
        with pytest.raises(BinlensError) as info:
            invoke(ws, name, {}, without)
        assert info.value.code == "unavailable" and info.value.details["requirement"] == "client:sampling"
        with_it = CallContext(transport="mcp", client_features=frozenset({"sampling"}))
        got = invoke(ws, "session.get", {}, with_it)["tool_availability"][name]
        assert got["available"] is True and got["missing_client_features"] == []
        assert invoke(ws, name, {}, with_it) == {"ok": "yes"}
    finally:
        dict.pop(REGISTRY, name)


def _payload(result: Any) -> Any:
    assert not result.is_error, result
    return json.loads(result.content[0].text)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_over_stdio_session_get_reports_the_negotiated_version(tmp_path: Path, compile_c, mode: str) -> None:  # noqa: ANN001
    """The official client over stdio: session.get names the protocol version the connection
    negotiated and the client's capabilities; tools/list is the same before and after a program
    opens and closes, and holds every domain."""
    sample = compile_c("sample.c")
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "binlens", "mcp", "--root", str(sample.parent)],
        env=env_for(tmp_path / "home"), cwd=str(ROOT),
    )  # fmt: skip

    async def main() -> None:
        async with Client(params, mode=mode) as client:
            before = sorted(t.name for t in (await client.list_tools()).tools)
            info = _payload(await client.call_tool("binlens_session", {"operation": "get", "params": {}}))
            assert info["transport"] == "mcp"
            assert info["protocol_version"] == client.protocol_version
            assert isinstance(info["client_features"], list)
            assert set(info["tool_availability"]) == set(REGISTRY)
            opened = _payload(
                await client.call_tool("binlens_program", {"operation": "open", "params": {"path": str(sample)}})
            )
            during = sorted(t.name for t in (await client.list_tools()).tools)
            handle = opened["identity"]["program"]
            await client.call_tool("binlens_program", {"operation": "close", "params": {"program": handle}})
            after = sorted(t.name for t in (await client.list_tools()).tools)
            assert before == during == after
            assert {n.removeprefix("binlens_") for n in before} >= {s.domain for s in REGISTRY.values()}

    anyio.run(main)
