"""`binlens doctor` (issue 26 item 7) on fixture configurations of each client: aligned, stale,
missing and invalid entries, the live server's identity, and `--fix` with a backup."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from binlens.cli.doctor import expected_entry
from conftest import run_cli

pytestmark = pytest.mark.timeout(300)

OLD_SERVER = """#!{python}
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("id") == 1:
        info = {{"name": "binlens", "version": "0.0.9"}}
        r = {{"protocolVersion": "2025-11-25", "capabilities": {{}}, "serverInfo": info}}
    elif m.get("id") in (2, 3):
        ident = {{"version": "0.0.9", "server_path": "/opt/old/binlens"}}
        r = {{"content": [], "structuredContent": ident, "isError": False}}
    else:
        continue
    print(json.dumps({{"jsonrpc": "2.0", "id": m["id"], "result": r}}), flush=True)
"""


def _doctor(home: Path, project: Path, *extra: str) -> tuple[int, dict[str, dict]]:
    done = run_cli("doctor", "--json", "--user-home", str(home), "--project", str(project), *extra, timeout=240)
    assert done.stdout, done.stderr
    return done.returncode, {f["client"]: f for f in json.loads(done.stdout)}


def test_doctor_reports_the_four_states_and_fixes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    home, project = tmp_path / "user", tmp_path / "project"
    project.mkdir(parents=True)
    old = tmp_path / "old" / "binlens"
    old.parent.mkdir()
    old.write_text(OLD_SERVER.format(python=sys.executable))
    old.chmod(0o755)
    desktop = home / ".config" / "Claude" / "claude_desktop_config.json"
    cursor = home / ".cursor" / "mcp.json"
    code = home / ".claude.json"
    codex = home / ".codex" / "config.toml"
    for path in (desktop, cursor, codex):
        path.parent.mkdir(parents=True, exist_ok=True)
    desktop.write_text(json.dumps({"mcpServers": {"binlens": expected_entry()}}))
    cursor.write_text(json.dumps({"mcpServers": {"binlens-old": {"command": str(old), "args": ["mcp"]}}}))
    code.write_text(json.dumps({"mcpServers": {"other": {"command": "other-server"}}, "theme": "dark"}))
    codex.write_text('[mcp_servers.binlens]\ncommand = "/nonexistent/binlens"\nargs = ["mcp"]\n\n[other]\nx = 1\n')

    status, found = _doctor(home, project)
    assert status == 1
    assert found["claude-desktop"]["state"] == "aligned", found["claude-desktop"]
    assert found["claude-desktop"]["live"]["server_path"] == str(Path(__file__).parents[1] / "src" / "binlens")
    assert found["cursor"]["state"] == "stale" and "0.0.9" in found["cursor"]["reason"]
    assert found["cursor"]["live"]["version"] == "0.0.9"
    assert found["claude-code"]["state"] == "missing"
    assert found["claude-code-project"]["state"] == "missing"  # (no .mcp.json)
    assert found["codex"]["state"] == "invalid" and "not an executable" in found["codex"]["reason"]

    codex_before = codex.read_text()
    status, fixed = _doctor(home, project, "--fix")
    assert status == 0, fixed
    for client in ("cursor", "claude-code", "codex"):
        assert fixed[client]["fixed"] is True and fixed[client]["extra"]["after"] == "aligned", fixed[client]
    assert Path(fixed["codex"]["extra"]["backup"]).read_text() == codex_before
    assert not (project / ".mcp.json").exists()  # a client without a configuration is left alone
    doc = json.loads(code.read_text())
    assert doc["theme"] == "dark" and set(doc["mcpServers"]) == {"other", "binlens"}
    toml = tomllib.loads(codex.read_text())
    assert toml["other"] == {"x": 1} and toml["mcp_servers"]["binlens"]["command"] == sys.executable
    assert json.loads(cursor.read_text())["mcpServers"]["binlens-old"] == expected_entry()

    status, again = _doctor(home, project)
    assert status == 0
    assert {c: f["state"] for c, f in again.items()} == {
        "claude-desktop": "aligned", "claude-code": "aligned", "claude-code-project": "missing",
        "cursor": "aligned", "codex": "aligned",
    }  # fmt: skip


def test_an_unreadable_configuration_is_invalid(tmp_path: Path) -> None:
    home = tmp_path / "user"
    (home / ".cursor").mkdir(parents=True)
    (home / ".cursor" / "mcp.json").write_text("{not json")
    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text("[mcp_servers.binlens\n")
    status, found = _doctor(home, tmp_path)
    assert status == 1
    assert found["cursor"]["state"] == "invalid" and "cannot read" in found["cursor"]["reason"]
    assert found["codex"]["state"] == "invalid"


def test_an_http_entry_is_asked_at_its_url(tmp_path: Path, compile_c) -> None:  # noqa: ANN001
    """An entry with a `url` (binlens serve) is checked live over Streamable HTTP; one that does
    not answer is invalid."""
    from serve_support import ServerProcess

    home = tmp_path / "user"
    (home / ".cursor").mkdir(parents=True)
    (home / ".codex").mkdir()
    with ServerProcess(tmp_path / "srv", str(compile_c("sample.c"))) as srv:
        (home / ".cursor" / "mcp.json").write_text(json.dumps({"mcpServers": {"binlens": {"url": srv.base + "/mcp"}}}))
        (home / ".codex" / "config.toml").write_text('[mcp_servers.binlens]\nurl = "http://127.0.0.1:9/mcp"\n')
        status, found = _doctor(home, tmp_path)
    assert found["cursor"]["state"] == "aligned", found["cursor"]
    assert found["codex"]["state"] == "invalid" and "did not answer" in found["codex"]["reason"]
    assert status == 1
