"""`binlens doctor [--fix]`: check the MCP client registrations of binlens on this machine.

Reads the configurations a user has (Claude Desktop's `claude_desktop_config.json`, Claude Code's
`~/.claude.json` and a project's `.mcp.json`, Cursor's `mcp.json`, Codex's `config.toml`) and
reports each client's binlens entry as:

- `aligned`: it starts this binlens (the live server answers with this version and package);
- `stale`: it starts another binlens, or another version of it;
- `missing`: the configuration has no binlens entry (or no configuration exists);
- `invalid`: the configuration cannot be read, or the entry has no command, or nothing answers.

An entry's live identity comes from starting it as the client would (its command, args and env,
with a minimal environment) and asking `session.get` over MCP stdio. `--fix` shows the entry it
would write and writes it, keeping a backup of the file beside it (`.bak`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import binlens
from binlens import __version__
from binlens.cli.main import command

ENTRY_NAME = "binlens"
PROBE_TIMEOUT_S = 30.0


@dataclass
class ClientConfig:
    """Where one client keeps its MCP servers, and in which format."""

    client: str
    path: Path
    fmt: str  # json (an `mcpServers` object) | toml (`[mcp_servers.NAME]` tables)


@dataclass
class Finding:
    """The state of one client's binlens entry."""

    client: str
    path: str
    state: str  # aligned | stale | missing | invalid
    reason: str
    entry_name: str | None = None
    entry: dict[str, Any] | None = None
    live: dict[str, Any] | None = None  # the live server's identity, when one answered
    fixed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def client_configs(home: Path, project: Path) -> list[ClientConfig]:
    """The configuration files each client reads, for this user (`home`) and project folder."""
    desktop = (
        home / "Library" / "Application Support" / "Claude"
        if sys.platform == "darwin"
        else Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "Claude"
    )
    return [
        ClientConfig("claude-desktop", desktop / "claude_desktop_config.json", "json"),
        ClientConfig("claude-code", home / ".claude.json", "json"),
        ClientConfig("claude-code-project", project / ".mcp.json", "json"),
        ClientConfig("cursor", home / ".cursor" / "mcp.json", "json"),
        ClientConfig("codex", home / ".codex" / "config.toml", "toml"),
    ]


def expected_entry() -> dict[str, Any]:
    """The entry that starts this binlens: this Python with `-m binlens mcp`, and the source
    folder on PYTHONPATH when this Python alone would import another binlens."""
    entry: dict[str, Any] = {"command": sys.executable, "args": ["-m", "binlens", "mcp"]}
    src = str(Path(binlens.__file__).resolve().parent.parent)
    probe = subprocess.run(
        [sys.executable, "-c", "import binlens, os; print(os.path.realpath(binlens.__file__))"],
        capture_output=True, text=True, env=_clean_env({}), timeout=PROBE_TIMEOUT_S, cwd=Path.home(),
    )  # fmt: skip
    if probe.returncode != 0 or Path(probe.stdout.strip()).resolve() != Path(binlens.__file__).resolve():
        entry["env"] = {"PYTHONPATH": src}
    return entry


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment a client gives a server it starts: PATH and HOME, and the entry's own."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "BINLENS_HOME")}
    env.update({str(k): str(v) for k, v in extra.items()})
    return env


def _is_binlens(name: str, entry: Any) -> bool:
    if "binlens" in name.lower():
        return True
    if not isinstance(entry, dict):
        return False
    words = [str(entry.get("command", ""))] + [str(a) for a in entry.get("args", []) or []]
    return any(Path(w).name == "binlens" or w == "binlens" for w in words)


def read_servers(cfg: ClientConfig) -> dict[str, Any]:
    """The MCP servers a configuration file lists (name -> entry); raises ValueError when the file
    cannot be read as the client's format."""
    text = cfg.path.read_text(encoding="utf-8")
    if cfg.fmt == "toml":
        doc: Any = tomllib.loads(text)
        servers = doc.get("mcp_servers", {})
    else:
        doc = json.loads(text) if text.strip() else {}
        if not isinstance(doc, dict):
            raise ValueError("the file is not a JSON object")
        servers = doc.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise ValueError("its MCP server list is not an object")
    return servers


def probe(entry: dict[str, Any]) -> dict[str, Any]:
    """Start the entry as a client would and ask `session.get`; its identity, or `{"error": ...}`."""
    cmd = entry.get("command")
    args = entry.get("args") or []
    env = entry.get("env") or {}
    if not isinstance(cmd, str) or not isinstance(args, list) or not isinstance(env, dict):
        return {"error": "the entry's command, args or env has the wrong type"}
    exe = shutil.which(cmd, path=_clean_env(env).get("PATH")) if not os.path.isabs(cmd) else cmd
    if exe is None or not os.access(exe, os.X_OK):
        return {"error": f"{cmd} is not an executable"}
    init = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "binlens-doctor", "version": __version__},
    }
    words = [str(a) for a in args]
    prefix = words[words.index("--tool-prefix") + 1] if "--tool-prefix" in words[:-1] else "binlens"
    get = {"operation": "get", "params": {}}
    frames = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        # (either tool separator: the entry may choose '_')
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": f"{prefix}.session", "arguments": get}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": f"{prefix}_session", "arguments": get}},
    ]
    try:
        proc = subprocess.Popen(
            [exe, *words], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=_clean_env(env), cwd=Path.home(),
        )  # fmt: skip
    except OSError as err:
        return {"error": f"it did not start: {err}"}
    timer = threading.Timer(PROBE_TIMEOUT_S, proc.kill)  # (a server that never answers)
    timer.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(OSError):
            proc.stdin.write("".join(json.dumps(f) + "\n" for f in frames))
            proc.stdin.flush()
        answers = 0
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict) or msg.get("id") not in (2, 3):
                continue
            answers += 1
            identity = _identity(msg.get("result"))
            if identity is not None:
                return identity
            if answers == 2:
                return {"error": "its session.get failed"}
        return {"error": f"it exited without answering session.get (status {proc.wait()})"}
    finally:
        timer.cancel()
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def probe_url(entry: dict[str, Any]) -> dict[str, Any]:
    """Ask the server at the entry's `url` (Streamable HTTP) for `session.get`; its identity, or
    `{"error": ...}`."""
    url = entry.get("url")
    headers = entry.get("headers") or {}
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or not isinstance(headers, dict):
        return {"error": "the entry's url or headers has the wrong type"}
    for tool in ("binlens_session", "binlens.session"):  # (either tool separator)
        body = {
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": tool, "arguments": {"operation": "get", "params": {}}},
        }  # fmt: skip
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-11-25",
                **{str(k): str(v) for k, v in headers.items()},
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:  # noqa: S310 - the user's entry
                text = response.read().decode("utf-8", "replace")
        except (OSError, ValueError) as err:
            return {"error": f"{url} did not answer: {err}"}
        lines = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")] or [text]
        for line in reversed(lines):
            with contextlib.suppress(ValueError):
                msg = json.loads(line)
                identity = _identity(msg.get("result")) if isinstance(msg, dict) else None
                if identity is not None:
                    return identity
    return {"error": f"{url} did not answer session.get"}


def _identity(result: Any) -> dict[str, Any] | None:
    """The identity fields of a successful `session.get` tool result, else None."""
    if not isinstance(result, dict) or result.get("isError"):
        return None
    data = result.get("structuredContent")
    if not isinstance(data, dict):
        try:
            data = json.loads((result.get("content") or [{}])[0].get("text", ""))
        except (ValueError, AttributeError, IndexError):
            return None
    if not isinstance(data, dict) or "version" not in data:
        return None
    return {k: data.get(k) for k in ("version", "build_revision", "server_path", "catalog_digest")}


def check(cfg: ClientConfig) -> Finding:
    """The state of `cfg`'s binlens entry."""
    where = str(cfg.path)
    if not cfg.path.exists():
        return Finding(cfg.client, where, "missing", "no configuration file")
    try:
        servers = read_servers(cfg)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        return Finding(cfg.client, where, "invalid", f"cannot read it: {err}")
    named = [(n, e) for n, e in servers.items() if _is_binlens(str(n), e)]
    if not named:
        return Finding(cfg.client, where, "missing", "no binlens entry")
    name, entry = named[0]
    if not isinstance(entry, dict) or not (entry.get("command") or entry.get("url")):
        return Finding(cfg.client, where, "invalid", "the entry has neither a command nor a url", name, None)
    live = probe(entry) if entry.get("command") else probe_url(entry)
    if "error" in live:
        return Finding(cfg.client, where, "invalid", str(live["error"]), name, entry)
    ours = str(Path(binlens.__file__).resolve().parent)
    if live.get("version") != __version__:
        reason = f"it starts binlens {live.get('version')}, this is {__version__}"
        return Finding(cfg.client, where, "stale", reason, name, entry, live)
    if live.get("server_path") != ours:
        reason = f"it starts the binlens in {live.get('server_path')}, this one is {ours}"
        return Finding(cfg.client, where, "stale", reason, name, entry, live)
    return Finding(cfg.client, where, "aligned", "it starts this binlens", name, entry, live)


def write_entry(cfg: ClientConfig, name: str, entry: dict[str, Any]) -> Path | None:
    """Write `entry` as server `name` of `cfg` (a backup of the old file beside it, returned)."""
    backup = None
    text = ""
    if cfg.path.exists():
        text = cfg.path.read_text(encoding="utf-8")
        backup = cfg.path.with_name(cfg.path.name + ".bak")
        shutil.copy2(cfg.path, backup)
    cfg.path.parent.mkdir(parents=True, exist_ok=True)
    if cfg.fmt == "toml":
        out = _toml_with(text, name, entry)
    else:
        doc = json.loads(text) if text.strip() else {}
        if not isinstance(doc, dict):
            doc = {}
        servers = doc.get("mcpServers")
        if not isinstance(servers, dict):
            servers = doc["mcpServers"] = {}
        servers[name] = entry
        out = json.dumps(doc, indent=2) + "\n"
    tmp = cfg.path.with_name(f".{cfg.path.name}.tmp")
    tmp.write_text(out, encoding="utf-8")
    os.replace(tmp, cfg.path)
    return backup


def _toml_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # (a JSON string is a TOML basic string)


def _toml_with(text: str, name: str, entry: dict[str, Any]) -> str:
    """`text` with the `[mcp_servers.NAME]` table (and its env table) replaced by `entry`."""
    header = re.compile(r"^\s*\[([^\]]+)\]\s*$")
    own = {f"mcp_servers.{name}", f"mcp_servers.{name}.env"}
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        m = header.match(line)
        if m:
            skipping = m.group(1).strip() in own
        if not skipping:
            kept.append(line)
    body = [
        f"[mcp_servers.{name}]",
        f"command = {_toml_value(entry['command'])}",
        f"args = {_toml_value(entry['args'])}",
    ]
    if entry.get("env"):
        body += ["", f"[mcp_servers.{name}.env]", *(f"{k} = {_toml_value(v)}" for k, v in entry["env"].items())]
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join([*kept, *([""] if kept else []), *body]) + "\n"


def _doctor_args(p: argparse.ArgumentParser) -> None:
    """Check (and with --fix, repair) the binlens entry of every MCP client configuration."""
    p.add_argument("--fix", action="store_true", help="write the entry that starts this binlens (a .bak is kept)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument(
        "--user-home", type=Path, default=None, help="read the configurations under this folder (default: ~)"
    )
    p.add_argument("--project", type=Path, default=None, help="the project folder of .mcp.json (default: .)")


@command("doctor", _doctor_args)
def cmd_doctor(args: argparse.Namespace) -> int:
    """Report each client's binlens entry; exit 0 when every existing configuration is aligned."""
    home = (args.user_home or Path.home()).expanduser()
    project = (args.project or Path.cwd()).expanduser()
    findings = []
    want = expected_entry() if args.fix else None
    for cfg in client_configs(home, project):
        found = check(cfg)
        if args.fix and want is not None and found.state != "aligned" and cfg.path.exists():
            sys.stderr.write(f"{cfg.client}: writing {found.entry_name or ENTRY_NAME} in {cfg.path}:\n")
            sys.stderr.write(json.dumps(want, indent=2) + "\n")
            try:
                backup = write_entry(cfg, found.entry_name or ENTRY_NAME, want)
            except (OSError, ValueError) as err:
                found.extra["fix_error"] = str(err)
            else:
                found.fixed = True
                found.extra["backup"] = str(backup) if backup else None
                again = check(cfg)
                found.extra["after"] = again.state
        findings.append(found)
    if args.json:
        print(json.dumps([f.__dict__ for f in findings], indent=2))
    else:
        for f in findings:
            line = f"{f.client:20} {f.state:8} {f.path}: {f.reason}"
            if f.fixed:
                line += f" -> fixed ({f.extra.get('after')}; backup {f.extra.get('backup')})"
            print(line)
    bad = [
        f for f in findings if f.state in ("stale", "invalid") and not (f.fixed and f.extra.get("after") == "aligned")
    ]
    return 1 if bad else 0
