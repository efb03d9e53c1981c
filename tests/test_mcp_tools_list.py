"""What `tools/list` costs an agent (issue 23): its size is bounded, each domain tool's description is
one line per operation naming the required params, and every generated name passes the rule of
Claude Desktop, claude.ai and Claude Code."""

from __future__ import annotations

import json
import re
from typing import Any

from binlens.server.mcp_tools import TOOL_NAME_RE, ToolSet, required_params

# bench/token_economy.py measured 22,365 bytes (compact JSON, UTF-8) for 45 tools and 123 operations;
# the bound is that plus 25%, so one more tool fits and a return of per-tool boilerplate does not.
TOOLS_LIST_BOUND = 28_000
LINE_RE = re.compile(r"^- (?P<op>[a-z_]+)(?:\((?P<params>[a-z_]+(?:, [a-z_]+)*)\))?: (?P<text>\S.*\S)$")
DOUBLED = re.compile(r"\.\.(?!\*)|[.;:,!?]\s*[.;:,!?]")


def _wire_bytes(tools: list[dict[str, Any]]) -> int:
    return len(json.dumps(tools, separators=(",", ":"), ensure_ascii=False).encode())


def test_tools_list_stays_small(workspace: Any) -> None:
    tools = ToolSet(workspace).list_tools()
    size = _wire_bytes(tools)
    assert size <= TOOLS_LIST_BOUND, f"tools/list is {size} bytes for {len(tools)} tools"
    for tool in tools:  # the schemas live in help; a domain tool is its operations and two properties
        schema = tool["inputSchema"]
        assert schema["type"] == "object" and set(schema["properties"]) <= {"operation", "params", "domain"}
        assert "title" not in tool and "title" not in tool["annotations"]


def test_one_line_per_operation(workspace: Any) -> None:
    tools = ToolSet(workspace)
    for tool in tools.list_tools():
        desc = tool["description"]
        assert not DOUBLED.search(desc), (tool["name"], DOUBLED.search(desc))
        if tool["name"] == tools.help_name:
            assert "\n" not in desc and tools.help_name not in desc
            continue
        specs = tools.domains[tool["name"].split("_", 1)[1]]
        lines = desc.split("\n")
        assert len(lines) == len(specs), tool["name"]
        for line, spec in zip(lines, specs, strict=True):
            m = LINE_RE.match(line)
            assert m is not None, line
            assert m["op"] == spec.operation and m["text"].endswith(".") and not m["text"].endswith(".."), line
            assert (m["params"] or "").split(", ") == (required_params(spec) or [""]), line
            assert m["text"].count("(") == m["text"].count(")"), line  # no aside cut in half
        assert tool["inputSchema"]["properties"]["operation"]["enum"] == [s.operation for s in specs]


def test_every_name_passes_the_client_rule(workspace: Any) -> None:
    for sep in ("_", "."):
        tools = ToolSet(workspace, separator=sep)
        names = [t["name"] for t in tools.list_tools()] + [p["name"] for p in tools.list_prompts()]
        assert len(set(names)) == len(names)
        if sep == "_":
            assert all(TOOL_NAME_RE.match(n) for n in names), names


def test_annotations_say_only_what_the_defaults_do_not(workspace: Any) -> None:
    tools = ToolSet(workspace)
    by_name = {t["name"]: t["annotations"] for t in tools.list_tools()}
    assert by_name["binlens_address"] == {"readOnlyHint": True, "openWorldHint": False}
    assert by_name["binlens_symbol"] == {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False}
    assert by_name["binlens_comment"]["destructiveHint"] is True  # comment.delete
