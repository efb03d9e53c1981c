"""`binlens mcp FILE` with no --root: the official `mcp` client may open exactly the started files,
exports stay beside the database, and an error about a file never echoes its bytes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_support import ROOT, env_for


def _params(home: Path, *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "binlens", "mcp", *args], env=env_for(home), cwd=str(ROOT)
    )


async def _call(client: Client, operation: str, params: dict[str, Any]) -> tuple[bool, Any]:
    res = await client.call_tool("binlens_program", {"operation": operation, "params": params})
    return bool(res.is_error), res.structured_content


def _refused(outcome: tuple[bool, Any]) -> dict[str, Any]:
    is_error, body = outcome
    assert is_error, body
    err = body["error"]
    assert err["code"] == "invalid_argument", err
    assert err["target"] == "/params/path", err
    return err


def test_started_files_only(tmp_path: Path, compile_c) -> None:  # noqa: ANN001
    started = Path(shutil.copy(compile_c("sample.c"), tmp_path / "started"))
    neighbour = Path(shutil.copy(compile_c("sample.c", opt="-O0"), tmp_path / "neighbour"))
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:SECRET-CONTENT\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = tmp_path / "home"

    async def main() -> None:
        async with Client(_params(home, str(started)), mode="legacy") as client:
            for path in ("/etc/passwd", str(secret), str(neighbour), str(tmp_path / "link")):
                err = _refused(await _call(client, "open", {"path": path}))
                text = json.dumps(err)
                assert "726f6f74" not in text and "root:x" not in text and "SECRET" not in text, text
            (tmp_path / "link").symlink_to(secret)
            _refused(await _call(client, "open", {"path": str(tmp_path / "link")}))

            is_error, body = await _call(client, "open", {"path": str(started)})  # the started file works
            assert not is_error and body["identity"]["file_name"] == "started", body

            for dest in (str(elsewhere / "copy"), "/tmp/elsewhere-binlens-copy", "../escape"):
                _refused(await _call(client, "export", {"path": dest}))
            assert not any(elsewhere.iterdir()) and not (home / "db" / "escape").exists()

            is_error, body = await _call(client, "export", {"path": "patched"})
            assert not is_error, body
            written = Path(body["path"])
            assert written.parent == (home / "db" / "exports").resolve()
            assert written.read_bytes() == started.read_bytes()

    anyio.run(main)


def test_no_magic_bytes_in_unsupported_error(tmp_path: Path) -> None:
    from binlens.errors import BinlensError
    from binlens.loader.formats import sniff_format

    try:
        sniff_format(b"root:x:0:0:root:/root:/bin/bash\n")
    except BinlensError as err:
        assert err.code == "unsupported"
        assert "726f6f74" not in json.dumps(err.details) and "root" not in err.message
    else:
        raise AssertionError("a text file sniffed as an executable")
