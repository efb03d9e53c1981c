"""Schemas (issue 26 item 6): every advertised input and output schema, as the official MCP client
receives and converts it, has no reference left to follow (so none is recursive) and describes
data nested at most 10 levels deep."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from binlens.api import REGISTRY
from conftest import ROOT
from mcp_support import env_for

pytestmark = pytest.mark.timeout(180)
MAX_NESTING = 10


def refs(node: Any, where: str = "") -> list[str]:
    """JSON pointers of every `$ref` in a schema."""
    if isinstance(node, dict):
        out = [where] if "$ref" in node else []
        for k, v in node.items():
            out += refs(v, f"{where}/{k}")
        return out
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in refs(v, f"{where}/{i}")]
    return []


def nesting(schema: Any) -> int:
    """How deep the data a schema describes nests: one level per object property, array item or
    map value; combinators (anyOf, oneOf, allOf) add none."""
    if not isinstance(schema, dict):
        return 0
    deepest = 0
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, ()):
            deepest = max(deepest, nesting(sub))
    for sub in (schema.get("properties") or {}).values():
        deepest = max(deepest, 1 + nesting(sub))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            deepest = max(deepest, 1 + nesting(schema[key]))
    for sub in schema.get("prefixItems", ()):
        deepest = max(deepest, 1 + nesting(sub))
    return deepest


def test_the_nesting_measure() -> None:
    """The measure counts properties, items and map values, not combinators."""
    leaf = {"type": "string"}
    assert nesting(leaf) == 0
    assert nesting({"type": "object", "properties": {"a": {"type": "array", "items": leaf}}}) == 2
    assert nesting({"anyOf": [{"type": "object", "additionalProperties": leaf}, {"type": "null"}]}) == 1


def test_every_schema_the_official_client_receives(tmp_path: Path) -> None:
    """tools/list's input schemas and the catalog resource's per-method input and output schemas,
    read through the official client (its pydantic models validate and convert them)."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "binlens", "mcp"], env=env_for(tmp_path / "home"), cwd=str(ROOT)
    )
    seen: dict[str, dict[str, Any]] = {}

    async def main() -> None:
        async with Client(params, mode="legacy") as client:
            for tool in (await client.list_tools()).tools:
                seen[f"tool {tool.name} input"] = tool.input_schema
                if tool.output_schema is not None:
                    seen[f"tool {tool.name} output"] = tool.output_schema
            resource = await client.read_resource("binlens://contracts/methods")
            catalog = json.loads(resource.contents[0].text)
            for m in catalog["methods"]:
                assert m["input_schema"]["type"] == "object" and isinstance(m["output_schema"], dict), m["name"]
                seen[f"{m['name']} input"] = m["input_schema"]
                seen[f"{m['name']} output"] = m["output_schema"]

    anyio.run(main)
    assert {name.rsplit(" ", 1)[0] for name in seen} >= set(REGISTRY)
    problems = []
    for name, schema in seen.items():
        if refs(schema):
            problems.append(f"{name}: $ref at {refs(schema)[:3]}")
        if nesting(schema) > MAX_NESTING:
            problems.append(f"{name}: nests {nesting(schema)} levels")
    assert not problems, "\n".join(problems)
    assert max(nesting(s) for s in seen.values()) >= 3  # (the walk reaches into the result models)
